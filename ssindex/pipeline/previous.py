"""The committed index a build starts from: what it can reuse, and what it must diff against."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ssindex.rows import Chunk, IndexedChunk, SourceFile
from ssindex.store import Head, IndexDir, scan, stored_vectors

_CHUNK_FIELDS = tuple(f.name for f in dataclasses.fields(Chunk))


@dataclass
class PreviousIndex:
    head: Head
    rows: pa.Table
    files: dict[str, tuple[str, list[str]]]
    """path → (content hash, chunk ids in file order), from the build manifest."""
    chunks_reusable: bool
    """Chunker and dedupe settings are unchanged, so unchanged files keep their chunks."""
    vectors_reusable: bool
    """Quantization is unchanged, so stored codes can stand in for embedding (by embed key)."""
    position: dict[str, int] = field(default_factory=dict)
    _vectors: dict[str, np.ndarray] | None = None
    _columns: _Columns | None = None
    _chunks: list[Chunk] | None = None

    @classmethod
    def load(cls, index: IndexDir, head: Head, fingerprint: str,
             quantization: str) -> PreviousIndex:
        rows = scan(index.open_table(head.table_version), list(_ROW_COLUMNS))
        manifest = index.read_manifest(head.data["manifest"]).to_pylist()
        files = {m["path"]: (m["content_hash"], m["chunk_ids"]) for m in manifest}
        previous = cls(head, rows, files,
                       chunks_reusable=head.data["settings"]["fingerprint"] == fingerprint,
                       # float32 codes are exact: any quantization can start from them
                       vectors_reusable=head.quantization in (quantization, "none"))
        previous.position = {row_id: i for i, row_id in enumerate(rows.column("id").to_pylist())}
        return previous

    @property
    def digests(self) -> dict[str, str]:
        return dict(zip(self.rows.column("id").to_pylist(),
                        self.rows.column("row_digest").to_pylist(), strict=True))

    def stored_chunks(self, source: SourceFile) -> list[IndexedChunk] | None:
        """The unchanged file's chunks as stored, or ``None`` when it must be re-chunked."""
        if not self.chunks_reusable:
            return None
        entry = self.files.get(source.path)
        if entry is None or entry[0] != source.content_hash:
            return None
        if any(chunk_id not in self.position for chunk_id in entry[1]):
            return None
        if self._columns is None or self._chunks is None:
            self._columns = _Columns(self.rows)
            self._chunks = list(map(Chunk, *(self._columns[k] for k in _CHUNK_FIELDS)))
        signatures = self._columns["minhash"]
        return [IndexedChunk(self._chunks[p], stored=_StoredRow(self._columns, p),
                             signature=signatures[p])
                for p in (self.position[i] for i in entry[1])]

    def vectors(self, keys: list[str]) -> dict[str, np.ndarray]:
        """Stored vectors (dequantized) of the embed keys the previous index holds."""
        if not self.vectors_reusable:
            return {}
        if self._vectors is None:
            exemplars = self.rows.filter(pa.compute.is_null(self.rows.column("dup_of")))
            matrix = stored_vectors(exemplars, self.head.quantization, self.head.dim)
            self._vectors = dict(zip(exemplars.column("embed_key").to_pylist(), matrix,
                                     strict=True))
        return {key: self._vectors[key] for key in keys if key in self._vectors}


class _Columns:
    """A table's columns as Python lists, each converted once, on first use."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self._lists: dict[str, list[Any]] = {}

    def __getitem__(self, name: str) -> list[Any]:
        if name not in self._lists:
            self._lists[name] = self.table.column(name).to_pylist()
        return self._lists[name]


class _StoredRow(Mapping[str, Any]):
    """One row of the previous index, read through its columns.

    Not ``to_pylist`` dicts: most rows of a rebuild only have their id, verdict and
    codes read; converting all 18 columns of 62k rows into dicts cost ~1 s."""

    __slots__ = ("_columns", "_index")

    def __init__(self, columns: _Columns, index: int) -> None:
        self._columns = columns
        self._index = index

    def __getitem__(self, name: str) -> Any:
        return self._columns[name][self._index]

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns.table.column_names)

    def __len__(self) -> int:
        return self._columns.table.num_columns


def stale_reasons(previous: PreviousIndex | None, files: dict[str, str]) -> list[str]:
    """Why an index does not match the tree (``files``: path → content hash); empty if current."""
    if previous is None:
        return ["no index"]
    reasons = [] if previous.chunks_reusable else ["settings or model changed"]
    known = {path: entry[0] for path, entry in previous.files.items()}
    changed = sum(1 for p, h in files.items() if p in known and known[p] != h)
    added = sum(1 for p in files if p not in known)
    removed = sum(1 for p in known if p not in files)
    for count, what in ((changed, "changed"), (added, "new"), (removed, "removed")):
        if count:
            reasons.append(f"{count} file(s) {what}")
    return reasons


_ROW_COLUMNS = (*_CHUNK_FIELDS, "dup_of", "embed_key", "minhash", "vec_codes", "vec_scale",
                "lex_body", "lex_name", "row_digest")
