from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa

from ssindex.index.layout import CHUNK_SCHEMA, IndexDir, fixed_digest, row_digest


def test_old_versions_manifests_are_pruned_but_pinned_and_recent_ones_kept(
        tmp_path: Path) -> None:
    index = IndexDir(tmp_path / "index")
    index.ensure_writable()
    names = ["v1.arrow", "terms-v1.arrow", "postings-v1.arrow", "search-v1.arrow",
             "v2.arrow", "search-v2.arrow", "v3.arrow", "search-v3.arrow", "search-v4.arrow",
             "nonsense-abc.arrow"]
    for name in names:
        index.write_manifest(name, pa.table({"x": [1]}))
    hour_ago = time.time() - 7200
    for name in ["v2.arrow", "search-v4.arrow"]:
        os.utime(index.path / "manifests" / name, (hour_ago, hour_ago))
    index.prune_manifests(keep={"v2.arrow", "search-v2.arrow"})
    left = sorted(p.name for p in (index.path / "manifests").iterdir())
    # version 1 is older than every kept one: gone at once, however recent; version 4 is
    # unknown and an hour old; version 3 unknown and recent; the model-keyed file stays
    assert left == ["nonsense-abc.arrow", "search-v2.arrow", "search-v3.arrow", "v2.arrow",
                    "v3.arrow"]
    assert index.read_manifest("search-v3.arrow", mmap=True).column("x").to_pylist() == [1]


def test_a_kept_base_named_by_an_old_version_does_not_keep_old_deltas(tmp_path: Path) -> None:
    """A version's base keeps the name of the version that wrote it: the deltas of the
    versions between are pruned at once by the kept heads' versions, not kept an hour."""
    index = IndexDir(tmp_path / "index")
    index.ensure_writable()
    names = ["search-v2.arrow", "postings-v2.arrow", "search-v3-delta.arrow",
             "search-v3-deleted.arrow", "postings-v3-delta.arrow", "search-v4-delta.arrow",
             "search-v5-delta.arrow", "search-v6-delta.arrow"]
    for name in names:
        index.write_manifest(name, pa.table({"x": [1]}))
    keep = {"search-v2.arrow", "postings-v2.arrow", "search-v4-delta.arrow",
            "search-v5-delta.arrow"}
    index.prune_manifests(keep=keep, oldest=4)
    left = sorted(p.name for p in (index.path / "manifests").iterdir())
    # version 3's files go at once; version 6 is unknown and recent, so it stays
    assert left == sorted([*keep, "search-v6-delta.arrow"])


def test_a_rows_digest_changes_with_every_field_and_no_field_runs_into_the_next() -> None:
    row = {"id": "a1", "path": "pkg/mod.py", "language": "python", "start_line": 1,
           "end_line": 23, "symbol": "parse", "kind": "function", "text": "def parse():\n",
           "dup_of": None, "content_hash": "c", "file_hash": "f", "embed_key": "k",
           "minhash": b"\x01" * 8, "vec_codes": b"\x02" * 4, "vec_scale": 0.5,
           "lex_body": "def parse", "lex_name": "parse pkg mod", "row_digest": ""}
    assert list(row) == CHUNK_SCHEMA.names
    digest = row_digest(row)
    assert row_digest(row, fixed_digest(row)) == digest
    changed = {"id": "a2", "path": "pkg/mod2.py", "language": None, "start_line": 2,
               "end_line": 24, "symbol": "Parse", "kind": "method", "text": "def parse():\r\n",
               "dup_of": "a0", "content_hash": "d", "file_hash": "g", "embed_key": "l",
               "minhash": None, "vec_codes": b"\x02" * 3 + b"\x03", "vec_scale": 0.25,
               "lex_body": "def  parse", "lex_name": "parse pkg mod2", "row_digest": "x"}
    for name, value in changed.items():
        assert (row_digest({**row, name: value}) == digest) == (name == "row_digest"), name
    runs = [{"start_line": 12, "end_line": 3}, {"path": "pkg/mod.pypython", "language": ""},
            {"symbol": "parsefunction", "kind": ""}, {"dup_of": "None"}]
    assert len({digest, *(row_digest({**row, **run}) for run in runs)}) == 1 + len(runs)
