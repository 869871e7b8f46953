"""``ssindex repair``: verify every file of the committed version, rebuild what is derived.

The Lance table is the index of record; the build manifest and the search files
are derived from it. A damaged derived file is written again from the table,
under its own name, so ``HEAD.json`` keeps naming the same version and no source
tree is needed. A damaged table file cannot be derived from anything here: that
is an error naming ``ssindex build``, which rebuilds from the source tree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from ssindex.errors import IndexCorrupt, map_exceptions
from ssindex.index.integrity import checksums, damaged
from ssindex.index.layout import MANIFEST_SCHEMA, IndexDir
from ssindex.index.lock import BuildLock
from ssindex.index.search_files import SEARCH_FILE_KEYS, write_search_files
from ssindex.index.table import scan


def repair(index_path: Path) -> dict[str, Any]:
    """Verify the index at ``index_path``; rewrite its damaged derived files. Returns
    what was verified and what was repaired."""
    index = IndexDir(index_path)
    if not index.exists():  # nothing to lock: its IndexNotFound, before the lock file
        index.read_head()
    with map_exceptions({IsADirectoryError: lambda exc: _in_the_way(
            getattr(exc, "filename", None))}), BuildLock(index.path):
        try:
            head = index.read_head()
        except IndexCorrupt as exc:
            raise IndexCorrupt(f"cannot repair HEAD.json: {exc}") from exc
        recorded: dict[str, str] = head.data.get("checksums", {})
        if not recorded:
            raise IndexCorrupt(f"the index at {index.path} records no checksums (an older "
                               "ssindex built it): run `ssindex build` once to record them")
        broken = damaged(index, recorded)
        version = head.table_version
        search = {f"manifests/{head.data[key]}" for key in SEARCH_FILE_KEYS if key in head.data}
        manifest = f"manifests/{head.data['manifest']}"
        _check_repairable(index, head.data["root"], broken, {manifest, *search})
        if broken:
            index.ensure_writable()  # ``manifests/`` may be gone
        rewritten = [manifest] if manifest in broken else []
        if search & set(broken):  # the version's rows, rewritten as one base
            written, _, _ = write_search_files(index, version)
            for key in SEARCH_FILE_KEYS:
                head.data.pop(key, None)
            head.data.update(written)
            recorded = {name: digest for name, digest in recorded.items() if name not in search}
            rewritten += [f"manifests/{name}" for name in written.values()]
        if manifest in broken:
            _rewrite_manifest(index, version, head.data["manifest"])
        if broken:
            head.data["checksums"] = recorded | checksums(index, rewritten, {})
            index.write_head(head.data)
    return {"index": str(index.path), "verified": len(recorded), "damaged": broken,
            "repaired": broken}


def _check_repairable(index: IndexDir, root: str, broken: list[str], derived: set[str],
                      ) -> None:
    """Raise ``IndexCorrupt`` naming the way out unless every damaged file is a derived
    one that can be written again, before anything is written."""
    table = [name for name in broken if name.startswith("db/")]
    if table:
        raise IndexCorrupt(
            f"table files of {index.path} are damaged ({', '.join(table[:3])}): the "
            f"table is the index of record, so rebuild it from the source tree with "
            f"`ssindex build {root} --index {index.path}`")
    stray = [name for name in broken if name not in derived]
    if stray:
        raise IndexCorrupt(f"cannot repair HEAD.json: it records checksums of "
                           f"{', '.join(stray[:3])}, which its version does not read; "
                           f"rebuild the index with `ssindex build`")
    blocked = [name for name in broken if (index.path / name).is_dir()]
    if blocked:
        raise _in_the_way(index.path / blocked[0])


def _in_the_way(path: object) -> IndexCorrupt:
    """A directory where the index keeps a file (its lock, a manifest)."""
    return IndexCorrupt(f"{path} is a directory where the index keeps a file: remove it, "
                        "then run `ssindex repair` again")


def _rewrite_manifest(index: IndexDir, version: int, name: str) -> None:
    """The build manifest from the table: each file's chunk ids, and no stat or hash, so
    the next build reads and chunks every file again (and reuses every vector)."""
    rows = scan(index.open_table(version), ["id", "path", "start_line"]).to_pylist()
    files: dict[str, list[str]] = {}
    for row in sorted(rows, key=lambda row: (row["path"], row["start_line"])):
        files.setdefault(row["path"], []).append(row["id"])
    entries = [{"path": path, "size": 0, "mtime_ns": 0, "content_hash": "", "chunk_ids": ids,
                "ctime_ns": 0, "inode": 0, "secrets_redacted": 0}
               for path, ids in sorted(files.items())]
    index.write_manifest(name, pa.Table.from_pylist(entries, schema=MANIFEST_SCHEMA))
