"""Typed rows that flow between stages."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np
import pyarrow as pa


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
    ctime_ns: int = 0
    inode: int = 0
    read: bool = True
    """False when the walk trusted the previous manifest instead of reading the file
    (same size, mtime, ctime and inode): ``text`` is then empty (``walk.reread``)."""
    secrets: int = 0
    """Secret values redacted from ``text`` (``ssindex.text.secrets``)."""


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

    def __reduce__(self) -> tuple[type[Chunk], tuple[Any, ...]]:
        return Chunk, _fields(self)


def _fields(row: Any) -> tuple[Any, ...]:
    """A slotted dataclass's fields in order: pickled so, it is unpickled by one call.
    The default looks its fields up again for each object, which took two thirds of
    unpickling the rows that worker processes send (``engines.pool``)."""
    return tuple(map(row.__getattribute__, row.__slots__))


class Tokens(NamedTuple):
    """A text as the model's tokenizer cut it."""

    ids: np.ndarray
    """Token ids (int32), truncated to the model's limit."""
    truncated: bool
    """The text is longer than the model's window."""
    rest: tuple[np.ndarray, ...] = ()
    """The windows after the first, for such a text (each with its special tokens)."""


@dataclass(slots=True)
class IndexedChunk:
    """A chunk on its way to the store: dedupe verdict, then vector.

    ``terms``, ``key``, ``tokens`` and ``digest`` are facts of the chunk alone that a worker
    process may work out ahead of the stages that need them (``engines.pool``);
    each stage computes what is missing itself."""

    chunk: Chunk
    stored: Mapping[str, Any] | None = None
    """The chunk's row in the previous index, when its file is unchanged."""
    signature: bytes | None = None
    """MinHash signature (uint32 values); ``None`` for chunks too short to compare."""
    dup_of: str | None = None
    vector: np.ndarray | None = None
    """float32 unit vector, or ``None`` until embedded (or copied from ``dup_of``)."""
    terms: tuple[str, str] | None = None
    """The lexical leg's body and name terms (``stages.write``)."""
    key: str | None = None
    """The embed key (``stages.embed.embed_key``)."""
    tokens: Tokens | None = None
    """The embedding text, tokenized; dropped once embedded."""
    digest: bytes | None = None
    """The hash of the stored fields the chunk fixes alone (``index.layout.fixed_digest``)."""

    def __reduce__(self) -> tuple[type[IndexedChunk], tuple[Any, ...]]:
        return IndexedChunk, _fields(self)


class Stamp(NamedTuple):
    """A file as a previous build read it: its stat, and the hash of what it held."""

    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    content_hash: str
    secrets: int = 0
    """Secret values the build that read the file redacted from it."""

    def matches(self, st: os.stat_result) -> bool:
        """Whether ``st`` is the stat recorded here (git's bet: any write moves the ctime)."""
        return (self.size, self.mtime_ns, self.ctime_ns, self.inode) == (
            st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


class StoredChunks(Protocol):
    """The chunks of an index's previous version, for an incremental build whose
    chunker and dedupe settings are unchanged."""

    @property
    def chunks(self) -> pa.Table:
        """``id``, ``content_hash``, ``minhash`` and ``dup_of`` of every stored row."""
        ...

    @property
    def position(self) -> Mapping[str, int]:
        """Row of ``chunks`` by chunk id."""
        ...

    @property
    def known(self) -> Mapping[str, Stamp]:
        """Files whose stat the walk may trust without reading them, by path."""
        ...

    def carried(self, source: SourceFile) -> list[str] | None:
        """The chunk ids of an unchanged file, or ``None`` when it must be chunked."""
        ...

    def materialize(self, positions: Sequence[int]) -> list[IndexedChunk]:
        """Stored rows as chunks on their way through a build (``stored`` set)."""
        ...
