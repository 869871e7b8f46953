"""What a search reads, written once per committed version beside the Lance table.

A search process needs every vector, the BM25 postings, the term statistics
of abstention, and the metadata and text of its ``k`` hits. Reading those
through LanceDB costs a search process ~2.4 s of imports alone, against a
budget of 1.5 s for a whole cold ``ssindex search``; an Arrow IPC file is
memory-mapped in milliseconds with pyarrow, which ssindex imports anyway. So
each build writes, under ``manifests/`` and named by table version:

    search-vN.arrow    the rows in row-id order: vectors, metadata, text
    postings-vN.arrow  BM25 postings over those rows (``ssindex.bm25``), with the
                       term counts of abstention (``ssindex.abstain``)

The Lance table stays the index of record (builds diff and commit against
it); these files are derived from one of its versions and never change.
``SEARCH_FILES_VERSION`` in ``HEAD.json`` names their layout: a build rewrites
files of another layout even when no row changed.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ssindex.abstain import TermStats
from ssindex.bm25 import Postings
from ssindex.store import IndexDir, scan

SEARCH_FILES_VERSION = 3
SNAPSHOT_COLUMNS = ["path", "start_line", "end_line", "language", "symbol", "kind", "text",
                    "vec_codes", "vec_scale"]


def write_search_files(index: IndexDir, version: int) -> tuple[dict[str, str], pa.Table,
                                                                 TermStats]:
    """Write the search files of ``version``; returns their names (keys of ``HEAD.json``),
    the rows in row-id order, and the term statistics."""
    data = scan(index.open_table(version), ["lex_body", "lex_name", *SNAPSHOT_COLUMNS],
                with_row_id=True)
    data = data.take(np.argsort(data.column("_rowid").to_numpy(), kind="stable"))
    postings = Postings.build(data.column("lex_body"), data.column("lex_name")).to_table()
    names = {
        "postings": index.write_manifest(f"postings-v{version}.arrow", postings),
        "snapshot": index.write_manifest(f"search-v{version}.arrow",
                                         data.select(SNAPSHOT_COLUMNS)),
    }
    return names, data, TermStats.from_table(postings)
