"""What a search reads, written once per committed version beside the Lance table.

A search process needs every vector, the BM25 postings, the term statistics
of abstention, and the metadata and text of its ``k`` hits. Reading those
through LanceDB costs a search process ~2.4 s of imports alone, against a
budget of 1.5 s for a whole cold ``ssindex search``; an Arrow IPC file is
memory-mapped in milliseconds with pyarrow, which ssindex imports anyway. So
each build writes, under ``manifests/`` and named by table version:

    search-vN.arrow    the rows: id, vectors, metadata, text, field lengths (a clean
                       build writes them in row-id order, a rebuild keeps the
                       previous order and appends the rows it wrote), and each
                       row's ``is_test`` mark (``ssindex.text.roles``)
    postings-vN.arrow  BM25 postings over those rows (``ssindex.index.postings``), with the
                       term counts of abstention (``ssindex.index.abstention``)

The Lance table stays the index of record (builds diff and commit against
it); these files are derived from one of its versions and never change.
``SEARCH_FILES_VERSION`` in ``HEAD.json`` names their layout: a build rewrites
files of another layout even when no row changed.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ssindex.index.abstention import TermStats
from ssindex.index.layout import IndexDir
from ssindex.index.postings import Postings
from ssindex.index.table import scan
from ssindex.text.roles import is_test
from ssindex.util.arrays import distinct, numeric_view

SEARCH_FILES_VERSION = 7
SNAPSHOT_COLUMNS = ["id", "path", "start_line", "end_line", "language", "symbol", "kind", "text",
                    "vec_codes", "vec_scale"]
_VECTORS = ("vec_codes", "vec_scale")
_LENGTHS = ["body_terms", "name_terms"]
"""Snapshot columns with each row's field lengths, which postings updates need."""


def write_search_files(index: IndexDir, version: int) -> tuple[dict[str, str], pa.Table,
                                                                 TermStats]:
    """Write the search files of ``version`` from its table; returns their names (keys of
    ``HEAD.json``), the snapshot rows, and the term statistics."""
    data = scan(index.open_table(version), ["lex_body", "lex_name", *SNAPSHOT_COLUMNS],
                with_row_id=True)
    row_ids = data.column("_rowid").to_numpy()
    if np.any(row_ids[1:] < row_ids[:-1]):  # a scan in row order needs no copy of the rows
        data = data.take(np.argsort(row_ids, kind="stable"))
    postings = Postings.build(data.column("lex_body"), data.column("lex_name"))
    return _write(index, version, data.select(SNAPSHOT_COLUMNS), postings)


def revectored_search_files(index: IndexDir, version: int, previous: dict[str, str],
                            ) -> tuple[dict[str, str], pa.Table, TermStats] | None:
    """``write_search_files`` for a version whose rows are those of the version whose
    search files ``previous`` names, in the same order, but for their vectors: a
    progressive build's finished version over its lexical one. The snapshot takes the
    new vectors and the postings are linked, not rebuilt: building them over every row
    took the standard library's finished commit ~0.8 GB at its peak. The rows are
    compared batch by batch as they stream from the table; ``None`` when any column but
    the vectors differs (a file changed between the passes)."""
    snapshot = previous["snapshot"]
    head = index.read_head().data  # a progressive build's partial versions replaced it
    if head.get("table_version") == previous.get("table_version"):  # (same rows)
        snapshot = head["snapshot"]
    before = index.read_manifest(snapshot, mmap=True)
    dataset = index.open_table(version).to_lance()
    if dataset.count_rows() != before.num_rows:
        return None
    same = [column for column in SNAPSHOT_COLUMNS if column not in _VECTORS]
    vectors: dict[str, list[pa.Array]] = {column: [] for column in _VECTORS}
    start = 0
    for batch in dataset.to_batches(columns=SNAPSHOT_COLUMNS):
        streamed = pa.Table.from_batches([batch])
        if not streamed.select(same).equals(before.slice(start, batch.num_rows).select(same)):
            return None
        for column in _VECTORS:
            vectors[column].append(batch.column(column))
        start += batch.num_rows
    rows = before
    for column, arrays in vectors.items():
        rows = rows.set_column(rows.schema.get_field_index(column), column,
                               pa.chunked_array(arrays, before.schema.field(column).type))
    postings = Postings.from_table(index.read_manifest(previous["postings"], mmap=True),
                                   len(rows))
    names = {"postings": index.link_manifest(previous["postings"], f"postings-v{version}.arrow"),
             "snapshot": index.write_manifest(f"search-v{version}.arrow", rows)}
    return names, rows, TermStats(postings.vocabulary, postings.counts)


def update_search_files(index: IndexDir, version: int, previous: dict[str, str],
                        written: pa.Table, removed: set[str],
                        ) -> tuple[dict[str, str], pa.Table, TermStats]:
    """``write_search_files`` for a version that differs from the one whose search files
    ``previous`` names by rows ``written`` (new or replaced) and ids ``removed``: the
    previous rows are kept in order, the written ones follow, and only they are
    tokenized. Rebuilding the postings of every row cost a one-file rebuild of the
    standard library (62k chunks) ~1.5 s."""
    import pyarrow.compute as pc  # here, not above: searches import this module

    before = index.read_manifest(previous["snapshot"], mmap=True)
    keep = ~np.asarray(pc.is_in(before.column("id"), value_set=pa.array(
        sorted(removed | set(written.column("id").to_pylist())), pa.string())))
    lengths = np.stack([numeric_view(before.column(c), np.int32) for c in _LENGTHS])
    postings = Postings.from_table(index.read_manifest(previous["postings"], mmap=True),
                                   len(before), lengths).update(
        keep, written.column("lex_body"), written.column("lex_name"))
    kept = before.select(SNAPSHOT_COLUMNS).filter(pa.array(keep))
    rows = pa.concat_tables([kept, written.select(SNAPSHOT_COLUMNS).cast(kept.schema)])
    return _write(index, version, rows, postings)


def test_marks(paths: pa.ChunkedArray) -> pa.Array:
    """Whether each row's file is test code, judged once per distinct path."""
    files, rows = distinct(paths)
    return pa.array(np.array([is_test(path) for path in files.to_pylist()], bool)[rows])


def _write(index: IndexDir, version: int, rows: pa.Table, postings: Postings,
           ) -> tuple[dict[str, str], pa.Table, TermStats]:
    if postings.lengths is None:
        raise ValueError("search files need the postings' doc lengths")
    for name, lengths in zip(_LENGTHS, postings.lengths, strict=True):
        rows = rows.append_column(name, pa.array(lengths, pa.int32()))
    rows = rows.append_column("is_test", test_marks(rows.column("path")))
    table = postings.to_table()
    names = {
        "postings": index.write_manifest(f"postings-v{version}.arrow", table),
        "snapshot": index.write_manifest(f"search-v{version}.arrow", rows),
    }
    return names, rows, TermStats(postings.vocabulary, postings.counts)
