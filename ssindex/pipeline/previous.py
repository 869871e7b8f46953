"""The committed index a build starts from: what it can reuse, and what it must diff against."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ssindex.codec import stored_vectors
from ssindex.config import WalkConfig
from ssindex.errors import IndexCorrupt
from ssindex.index.integrity import damaged
from ssindex.index.layout import Head, IndexDir
from ssindex.records import Chunk, IndexedChunk, SourceFile, Stamp

_CHUNK_FIELDS = tuple(f.name for f in dataclasses.fields(Chunk))


@dataclass
class PreviousIndex:
    """The previous version's rows: the light columns of every row in memory, the rest
    (text, codes, analyzed fields) taken from Lance for the few rows that need them.

    Reading every column of the standard library's 62k rows took ~0.6 s and
    turning them into Python objects ~1.5 s more, for a rebuild that touches a
    handful of them."""

    head: Head
    chunks: pa.Table
    """``id``, ``content_hash``, ``minhash``, ``dup_of``, ``embed_key``, ``row_digest``
    of every row, in the table's order (row ``i`` is Lance offset ``i``)."""
    files: dict[str, tuple[str, list[str]]]
    """path → (content hash, chunk ids in file order), from the build manifest."""
    chunks_reusable: bool
    """Chunker and dedupe settings are unchanged, so unchanged files keep their chunks."""
    vectors_reusable: bool
    """Quantization is unchanged, so stored codes can stand in for embedding (by embed key)."""
    dataset: Any
    """The Lance dataset at the previous version."""
    known: dict[str, Stamp] = field(default_factory=dict)
    """Files the previous build read whose stat the walk may trust (``walk.Known``)."""
    damaged: list[str] = field(default_factory=list)
    """Its derived files (manifests, search files) whose checksums fail: rebuilt."""
    position: dict[str, int] = field(default_factory=dict)
    _exemplars: dict[str, int] | None = None

    @classmethod
    def load(cls, index: IndexDir, head: Head, fingerprint: str,
             quantization: str, walk: WalkConfig) -> PreviousIndex:
        broken = damaged(index, head.data.get("checksums", {}))
        if any(name.startswith("db/") for name in broken):
            raise IndexCorrupt(f"its table files are damaged ({', '.join(broken[:3])})")
        dataset = index.open_table(head.table_version).to_lance()
        chunks = dataset.to_table(columns=list(_LIGHT_COLUMNS))
        # without its file manifest, every file is read and chunked again (vectors reused)
        manifest = ([] if f"manifests/{head.data['manifest']}" in broken
                    else index.read_manifest(head.data["manifest"]).to_pylist())
        files = {m["path"]: (m["content_hash"], m["chunk_ids"]) for m in manifest}
        previous = cls(head, chunks, files,
                       chunks_reusable=head.data["settings"]["fingerprint"] == fingerprint,
                       # float32 codes are exact: any quantization can start from them
                       vectors_reusable=head.quantization in (quantization, "none"),
                       dataset=dataset, known=_trusted(manifest, head, walk),
                       damaged=broken)
        previous.position = {row_id: i for i, row_id in enumerate(chunks.column("id").to_pylist())}
        return previous

    @property
    def digests(self) -> dict[str, str]:
        """Row digest by id (``position`` holds the ids in row order)."""
        return dict(zip(self.position, self.chunks.column("row_digest").to_pylist(),
                        strict=True))

    def carried(self, source: SourceFile) -> list[str] | None:
        """The unchanged file's chunk ids, or ``None`` when it must be re-chunked."""
        if not self.chunks_reusable:
            return None
        entry = self.files.get(source.path)
        if entry is None or entry[0] != source.content_hash:
            return None
        if any(chunk_id not in self.position for chunk_id in entry[1]):
            return None
        return entry[1]

    def rows(self, positions: Sequence[int], columns: Sequence[str] = ()) -> pa.Table:
        """Stored rows at ``positions`` (every column unless ``columns`` names some)."""
        return self.dataset.take(list(positions), columns=list(columns or _ROW_COLUMNS))

    def materialize(self, positions: Sequence[int]) -> list[IndexedChunk]:
        """Stored rows at ``positions`` as chunks on their way through a build."""
        if not positions:
            return []
        records = self.rows(positions).to_pylist()
        return [IndexedChunk(Chunk(*(r[k] for k in _CHUNK_FIELDS)), stored=r,
                             signature=r["minhash"]) for r in records]

    def vectors(self, keys: list[str]) -> dict[str, np.ndarray]:
        """Stored vectors (dequantized) of the embed keys the previous index holds."""
        if not self.vectors_reusable:
            return {}
        if self._exemplars is None:
            exemplar = pc.is_null(self.chunks.column("dup_of")).to_numpy(zero_copy_only=False)
            self._exemplars = {key: p for p, key in enumerate(
                self.chunks.column("embed_key").to_pylist()) if exemplar[p]}
        found = {key: self._exemplars[key] for key in keys if key in self._exemplars}
        if not found:
            return {}
        codes = self.rows(list(found.values()), ["vec_codes", "vec_scale"])
        embedded = pc.is_valid(codes.column("vec_codes")).to_numpy(zero_copy_only=False)
        if not embedded.all():  # rows a ``--no-embed`` build left without a vector
            found = {key: p for (key, p), kept in zip(found.items(), embedded, strict=True)
                     if kept}
            codes = codes.filter(pa.array(embedded))
        matrix = stored_vectors(codes, self.head.quantization, self.head.dim)
        return dict(zip(found, matrix, strict=True))

    @property
    def dense_coverage(self) -> float:
        """Share of its rows that have a vector (1.0 for indexes that predate the field)."""
        return float(self.head.data.get("dense_coverage", 1.0))


STAT_MARGIN_NS = 2_000_000_000
"""Files stamped less than this before the previous walk started are read again: a
file system's coarse clock may stamp a later write with an earlier time."""


def _trusted(manifest: list[dict[str, Any]], head: Head, walk: WalkConfig,
             ) -> dict[str, Stamp]:
    """The manifest's files whose stat a walk may trust instead of reading them: those
    last changed well before the previous walk began (git's "racy" rule), and none
    when that walk ran with other settings: it judged the files' contents by them
    (line lengths, sizes), and a trusted file is not judged again."""
    started = head.data.get("walk_started_ns")
    settings = json.loads(json.dumps(dataclasses.asdict(walk)))  # as HEAD.json holds them
    if started is None or head.data["settings"]["config"].get("walk") != settings:
        return {}
    cutoff = int(started) - STAT_MARGIN_NS
    return {m["path"]: Stamp(m["size"], m["mtime_ns"], m["ctime_ns"], m["inode"],
                             m["content_hash"], m.get("secrets_redacted") or 0)
            for m in manifest if m.get("ctime_ns") is not None
            and max(m["mtime_ns"], m["ctime_ns"]) < cutoff}


def stale_reasons(previous: PreviousIndex | None, files: dict[str, str]) -> list[str]:
    """Why an index does not match the tree (``files``: path → content hash); empty if current."""
    if previous is None:
        return ["no index"]
    reasons = [] if previous.chunks_reusable else ["settings or model changed"]
    if previous.dense_coverage < 1.0:
        reasons.append(f"{1 - previous.dense_coverage:.0%} of chunks not embedded yet")
    known = {path: entry[0] for path, entry in previous.files.items()}
    changed = sum(1 for p, h in files.items() if p in known and known[p] != h)
    added = sum(1 for p in files if p not in known)
    removed = sum(1 for p in known if p not in files)
    for count, what in ((changed, "changed"), (added, "new"), (removed, "removed")):
        if count:
            reasons.append(f"{count} file(s) {what}")
    return reasons


_LIGHT_COLUMNS = ("id", "content_hash", "minhash", "dup_of", "embed_key", "row_digest")
_ROW_COLUMNS = (*_CHUNK_FIELDS, "dup_of", "embed_key", "minhash", "vec_codes", "vec_scale",
                "lex_body", "lex_name", "row_digest")
