"""Atomic, durable file writes: a reader sees the old file or the new, never a part."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a reader sees the old file or the new, never a part."""
    with atomic_file(path) as f:
        f.write(data)


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A file to write that appears at ``path`` whole, durably, once the block ends (and
    never, if it raises)."""
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as f:
        try:
            yield f  # type: ignore[misc]
            f.flush()
            os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(OSError):  # a full disk fails the close's flush too
                f.close()
            os.unlink(f.name)
            raise
    try:
        os.replace(f.name, path)
    except OSError:  # e.g. a directory stands at ``path``: no temporary file stays behind
        with contextlib.suppress(OSError):  # the rename's error is the one to report
            os.unlink(f.name)
        raise
    _sync_directory(path.parent)


def _sync_directory(folder: Path) -> None:
    """Make the names in ``folder`` durable (a rename or link survives a crash)."""
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_link(source: Path, path: Path) -> None:
    """Give the immutable file ``source`` a second name, ``path``, atomically: a hard
    link (no bytes copied), or a copy where the file system has none."""
    temporary = path.with_name(f".{path.name}.link")
    temporary.unlink(missing_ok=True)
    try:
        os.link(source, temporary)
    except OSError:
        with atomic_file(path) as f, source.open("rb") as data:
            shutil.copyfileobj(data, f)
        return
    os.replace(temporary, path)
    _sync_directory(path.parent)
