"""Where an index may go: a directory of its own, holding one tree's files at a time."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ssindex.errors import ConfigError
from ssindex.index.activity import FILE as ACTIVITY_FILE
from ssindex.index.layout import HEAD

INDEX_ENTRIES = frozenset({HEAD, "db", "manifests", "lock", "staging", ACTIVITY_FILE,
                           "lost+found"})  # an index on a volume of its own
"""What an index directory holds, besides dot files (its ``.gitignore``, files being
written)."""


def check_placement(path: Path, root: Path) -> None:
    """Refuse an index directory that would mix the index with other files: the tree
    itself or a directory above it (the index would index itself, or leave the tree
    out), or a directory of files that is not an index."""
    path, other = path.resolve(), []
    if root.is_relative_to(path):
        raise ConfigError(f"index directory {path} holds the tree {root}: give the index a "
                          f"directory of its own (the default is {root / '.ssindex'})")
    with contextlib.suppress(OSError):  # none yet, or unreadable: ensure_writable says
        other = sorted(name for name in os.listdir(path)
                       if name not in INDEX_ENTRIES and not name.startswith("."))
    if other:
        raise ConfigError(f"index directory {path} holds other files ({', '.join(other[:3])}"
                          f"{', …' if len(other) > 3 else ''}): an index needs a directory "
                          "of its own")


def moved_note(built_from: str, root: Path) -> str | None:
    """A notice where the index was built from another tree than ``root`` (a repository
    moved, or another one's index given): its files not under ``root`` go."""
    if built_from == str(root):
        return None
    return (f"the index was built from {built_from}; it now indexes {root}, and files "
            "not there leave it")
