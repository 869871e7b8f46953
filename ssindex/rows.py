"""Typed rows that flow between stages."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class SourceFile:
    """A readable text file accepted by the walk."""

    path: str
    """POSIX path relative to the indexed root."""
    language: str | None
    text: str
    size: int
    mtime_ns: int
    content_hash: str


@dataclass(frozen=True, slots=True)
class Chunk:
    """A contiguous, whole-line span of one file."""

    id: str
    path: str
    language: str | None
    start_line: int
    """1-based, inclusive."""
    end_line: int
    """1-based, inclusive."""
    symbol: str
    kind: str
    text: str
    content_hash: str
    """Hash of the whitespace-normalized text: exact duplicates share it."""
    file_hash: str


@dataclass(slots=True)
class IndexedChunk:
    """A chunk on its way to the store: dedupe verdict, then vector."""

    chunk: Chunk
    dup_of: str | None = None
    vector: np.ndarray | None = None
    """float32 unit vector, or ``None`` until embedded (or copied from ``dup_of``)."""
