"""Checksums of a committed version's files, recorded in ``HEAD.json``.

Every file a version reads (its manifests and search files, the Lance data and
deletion files of its table version) is hashed when the version is committed:
xxh3-64 hashes ~10 GB/s, so a search verifies the files it maps in a few
milliseconds, and a build verifies the table it diffs against. A flipped byte or
a truncated file is then an error that names the repair (``ssindex repair``,
or the next ``ssindex build``), never a wrong answer.

Files are immutable once written (Lance's and ssindex's alike), so a build hashes
only the files its version added and carries the rest of the previous head's.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable, Mapping
from pathlib import Path

import xxhash

from ssindex.errors import IndexCorrupt
from ssindex.index.layout import IndexDir
from ssindex.index.table import table_path

REPAIR_HINT = "run `ssindex repair` (or `ssindex build`) to rebuild it from what is intact"


def file_checksum(path: Path) -> str:
    """The xxh3-64 of a file's bytes, hex."""
    with open(path, "rb") as handle:
        if not handle.seek(0, 2):
            return xxhash.xxh3_64_hexdigest(b"")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
            return xxhash.xxh3_64_hexdigest(view)


def table_files(index: IndexDir, version: int) -> list[str]:
    """The data and deletion files of a table version, relative to the index directory."""
    import lance

    base = table_path(index)
    within = base.relative_to(index.path).as_posix()
    dataset = lance.dataset(str(base), version=version)
    files = []
    for fragment in dataset.get_fragments():
        files += [f"{within}/data/{data.path}" for data in fragment.data_files()]
        deletion = fragment.metadata.deletion_file
        if deletion is not None:  # Lance names it from the dataset root, without a slash
            name = Path(deletion.path(fragment.fragment_id, str(base))).name
            files.append(f"{within}/_deletions/{name}")
    return files


def checksums(index: IndexDir, names: Iterable[str], known: Mapping[str, str],
              ) -> dict[str, str]:
    """Each file's checksum (names relative to the index directory), taken from
    ``known`` when it holds one (files never change)."""
    return {name: known.get(name) or file_checksum(index.path / name) for name in names}


def damaged(index: IndexDir, recorded: Mapping[str, str],
            names: Iterable[str] | None = None) -> list[str]:
    """The recorded files (or those of ``names``) that are missing or whose bytes no
    longer match their checksum."""
    out = []
    for name in recorded if names is None else names:
        path = index.path / name
        if name in recorded and (not path.is_file() or file_checksum(path) != recorded[name]):
            out.append(name)
    return out


def verify(index: IndexDir, recorded: Mapping[str, str], name: str) -> None:
    """Raise ``IndexCorrupt`` naming the repair when ``name`` does not match its checksum."""
    if damaged(index, recorded, [name]):
        raise IndexCorrupt(f"{name} in {index.path} is damaged (its bytes no longer match "
                           f"the checksum HEAD.json records): {REPAIR_HINT}")
