"""The Ray engine's tasks and actors: pure functions of their input block, run on workers."""

from __future__ import annotations

import functools
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from ssindex.backends.base import Encoder
from ssindex.backends.model import ModelSpec
from ssindex.backends.selector import select
from ssindex.codec import quantize_matrix, stored_vectors
from ssindex.config import ChunkConfig, DedupeConfig, Quantization
from ssindex.errors import SsindexError
from ssindex.index.layout import CHUNK_SCHEMA, IndexDir
from ssindex.index.table import scan
from ssindex.records import Chunk, IndexedChunk, SourceFile
from ssindex.stages.chunk import chunk_file
from ssindex.stages.dedupe import bucket_pairs
from ssindex.stages.embed import EmbedStats, ModelWindow, embed
from ssindex.stages.signature import Signer, band_keys
from ssindex.stages.write import to_record_batch
from ssindex.util.arrays import whole

FILE_BITS = 24
"""A chunk's ordinal is ``file ordinal << 24 | position in file``: path order as one int."""


CHUNK_ROW = pa.schema([pa.field("ordinal", pa.int64()), *(CHUNK_SCHEMA.field(name) for name in (
    "id", "path", "language", "start_line", "end_line", "symbol", "kind", "text",
    "content_hash", "file_hash", "minhash", "dup_of"))])
"""A chunk between the Ray stages: the stored row's fields it has so far (the index's
``CHUNK_SCHEMA``), and its place in path order."""


_CHUNK_FIELDS = [name for name in CHUNK_ROW.names if name not in ("ordinal", "minhash", "dup_of")]


PARTICIPANT_COLUMNS = ["ordinal", "id", "content_hash", "minhash"]


FILE_BLOCK = pa.schema([
    ("file_ordinal", pa.int64()), ("path", pa.string()), ("language", pa.string()),
    ("text", pa.string()), ("size", pa.int64()), ("mtime_ns", pa.int64()),
    ("content_hash", pa.string()),
])


def chunk_block(files: pa.Table, chunk_cfg: dict[str, Any], dedupe_cfg: dict[str, Any],
                model: dict[str, Any], tally: Any = None) -> pa.Table:
    """Chunk and sign a block of files: one row per file, its chunks nested, fitted to
    the window of ``model`` (``ModelSpec.arguments``); the chunks are added to ``tally``
    (a ``Tally`` actor's handle)."""
    cfg, sign = ChunkConfig(**chunk_cfg), _signer(DedupeConfig(**dedupe_cfg))
    window = _window(tuple(sorted(model.items())))
    out: dict[str, list[Any]] = {"file_ordinal": [], "chunker": [], "chunk_ids": [],
                                 "chunks": []}
    for record in files.to_pylist():
        ordinal = record.pop("file_ordinal")
        chunks, chunker = chunk_file(SourceFile(**record), cfg, window)
        out["file_ordinal"].append(ordinal)
        out["chunker"].append(chunker)
        out["chunk_ids"].append([c.id for c in chunks])
        signatures = sign([c.text for c in chunks])
        out["chunks"].append([{"ordinal": ordinal << FILE_BITS | position, **asdict(c),
                               "minhash": signature, "dup_of": None}
                              for position, (c, signature) in enumerate(zip(
                                  chunks, signatures, strict=True))])
    if tally is not None:
        tally.add.remote("chunk", sum(map(len, out["chunk_ids"])))
    return pa.table(out, schema=pa.schema([
        ("file_ordinal", pa.int64()), ("chunker", pa.string()),
        ("chunk_ids", pa.list_(pa.string())), ("chunks", pa.list_(pa.struct(CHUNK_ROW)))]))


@functools.cache
def _window(model: tuple[tuple[str, Any], ...]) -> ModelWindow:
    """One window per model in a worker process: its tokenizer loads once."""
    return ModelWindow(ModelSpec.resolve(**dict(model)))


_SIGNERS: dict[DedupeConfig, Signer] = {}


def _signer(cfg: DedupeConfig) -> Signer:
    if cfg not in _SIGNERS:
        _SIGNERS[cfg] = Signer(cfg)
    return _SIGNERS[cfg]


def explode_chunks(files: pa.Table) -> pa.Table:
    flat = whole(pc.list_flatten(files.column("chunks")))
    if len(flat) == 0:
        return CHUNK_ROW.empty_table()
    return pa.Table.from_batches([pa.RecordBatch.from_struct_array(flat)])


_EXACT, _NEAR = 0, 1


_DEDUPE_KEYS = pa.schema([("kind", pa.int8()), ("key", pa.uint64()), ("ordinal", pa.int64()),
                         ("id", pa.string()), ("content_hash", pa.string()),
                         ("minhash", pa.binary())])


PAIRS = pa.schema([("later", pa.int64()), ("earlier", pa.int64()), ("earlier_id", pa.string()),
                    ("similarity", pa.float64())])
"""Candidate pairs; a null similarity marks an exact duplicate of the earlier chunk."""


def dedupe_keys(rows: pa.Table, rows_per_band: int) -> pa.Table:
    """Every chunk under its content-hash key, and every signed chunk under each of its
    LSH band keys: one shuffle brings exact and near duplicates together. Exact copies
    share all band keys too, so each bucket can drop them itself (``dedupe_group``)."""
    hashes = [xxhash.xxh3_64_intdigest(h.encode()) for h in rows["content_hash"].to_pylist()]
    exact = pa.table({"kind": pa.array([_EXACT] * rows.num_rows, pa.int8()),
                      "key": pa.array(hashes, pa.uint64()),
                      "ordinal": rows["ordinal"], "id": rows["id"],
                      "content_hash": rows["content_hash"],
                      "minhash": pa.nulls(rows.num_rows, pa.binary())}, schema=_DEDUPE_KEYS)
    signed = rows.filter(pc.is_valid(rows["minhash"]))
    if signed.num_rows == 0:
        return exact
    keys = band_keys(_signatures(signed["minhash"]), rows_per_band)
    repeat = pa.array(np.repeat(np.arange(signed.num_rows), keys.shape[1]))
    near = pa.table({"kind": pa.array(np.full(keys.size, _NEAR, np.int8)),
                     "key": pa.array(keys.reshape(-1)),
                     **{c: signed[c].take(repeat) for c in _DEDUPE_KEYS.names[2:]}},
                    schema=_DEDUPE_KEYS)
    return pa.concat_tables([exact, near])


def dedupe_group(group: pa.Table, threshold: float) -> pa.Table:
    """Exact duplicates of a content-hash group's first chunk, or the near pairs of one
    LSH bucket among first-of-hash chunks (earlier in path order first)."""
    group = group.sort_by("ordinal")
    ordinals, ids = group["ordinal"].to_pylist(), group["id"].to_pylist()
    first: dict[str, int] = {}
    copies: list[tuple[int, int]] = []
    for index, content_hash in enumerate(group["content_hash"].to_pylist()):
        earlier = first.setdefault(content_hash, index)
        if earlier != index:
            copies.append((index, earlier))
    if group["kind"][0].as_py() == _EXACT:
        found = [{"later": ordinals[i], "earlier": ordinals[e], "earlier_id": ids[e],
                  "similarity": None} for i, e in copies]
    else:
        bucket = group.take(pa.array(sorted(first.values())))
        found = [pair._asdict() for pair in bucket_pairs(
            bucket["ordinal"].to_numpy(), bucket["id"].to_pylist(),
            _signatures(bucket["minhash"]), threshold)]
    return pa.Table.from_pylist(found, schema=PAIRS)


def _signatures(column: pa.ChunkedArray) -> np.ndarray:
    return np.stack([np.frombuffer(s, np.uint32) for s in column.to_pylist()])


def attach_verdicts(rows: pa.Table, verdicts: dict[int, str]) -> pa.Table:
    dup_of = [verdicts.get(ordinal) for ordinal in rows["ordinal"].to_pylist()]
    return rows.set_column(rows.schema.get_field_index("dup_of"), "dup_of",
                           pa.array(dup_of, pa.string()))


def select_rows(rows: pa.Table, duplicates: bool) -> pa.Table:
    return rows.filter(pc.is_valid(rows["dup_of"]) if duplicates else pc.is_null(rows["dup_of"]))


def _indexed(rows: pa.Table) -> list[IndexedChunk]:
    return [IndexedChunk(Chunk(**{k: r[k] for k in _CHUNK_FIELDS}), signature=r["minhash"],
                         dup_of=r["dup_of"]) for r in rows.to_pylist()]


ACTOR_COLUMNS = [("_embedded", pa.bool_()), ("_backend", pa.string()), ("_tokens", pa.int64()),
                  ("_padded_tokens", pa.int64()), ("_truncated", pa.int64())]
"""Per row: freshly embedded or reused, the actor's backend report (JSON); then the
batch's encode counts, on its first row (zeros elsewhere, so column sums are exact)."""


_EMBEDDED = pa.schema([*CHUNK_SCHEMA, *(pa.field(n, t) for n, t in ACTOR_COLUMNS)])


def preflight(model: dict[str, Any], explicit: str) -> dict[str, str]:
    """Create and probe backend ``explicit`` where an embedding actor would run: nothing
    when it can, else the ssindex error it raised, as data (``errors.ERRORS``)."""
    try:
        select("embed_bulk", ModelSpec.resolve(**model), explicit)
    except SsindexError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {}


class EmbedActor:
    """Embeds and quantizes exemplar chunks; the model is loaded once per actor. Each
    batch's rows, duplicates included, are added to ``tally`` (a ``Tally`` actor's
    handle)."""

    def __init__(self, model: dict[str, Any], batch_tokens: int, explicit: str | None,
                 model_key: str, quantization: Quantization,
                 previous: tuple[str, int, Quantization] | None, tally: Any = None) -> None:
        spec = ModelSpec.resolve(**model)  # ModelSpec.arguments
        self.selection = select("embed_bulk", spec, explicit)
        self._report = json.dumps(self.selection.as_json())
        self.encoder = Encoder(self.selection.backend, spec, batch_tokens)
        self.model_key, self.quantization, self.dim = model_key, quantization, spec.dim
        self.previous = None
        if previous is not None:
            path, version, method = previous
            self.previous = (IndexDir(Path(path)).open_table(version), method)
        self.tally = tally

    def reuse(self, keys: list[str]) -> dict[str, np.ndarray]:
        """Vectors of these embed keys in the previous index (renamed and copied code)."""
        if self.previous is None or not keys:
            return {}
        table, method = self.previous
        quoted = ", ".join(f"'{key}'" for key in keys)
        found = scan(table, ["embed_key", "vec_codes", "vec_scale"],
                     where=f"dup_of IS NULL AND vec_codes IS NOT NULL AND embed_key IN ({quoted})")
        return dict(zip(found["embed_key"].to_pylist(), stored_vectors(found, method, self.dim),
                        strict=True))

    def __call__(self, rows: pa.Table) -> pa.Table:
        # duplicates are filtered here, not by an upstream task: on a small cluster the
        # pool can hold every CPU, and an upstream task would then wait forever
        records = self._embedded(select_rows(rows, duplicates=False))
        if self.tally is not None:
            self.tally.add.remote("embed", rows.num_rows)
        return records

    def _embedded(self, rows: pa.Table) -> pa.Table:
        """The records of ``rows`` (exemplars), with the columns of ``ACTOR_COLUMNS``."""
        if rows.num_rows == 0:
            return _EMBEDDED.empty_table()
        batch = _indexed(rows)
        reused: set[str] = set()

        def reuse(keys: list[str]) -> dict[str, np.ndarray]:
            found = self.reuse(keys)
            reused.update(found)
            return found

        counts = self.encoder.stats
        before = (counts.tokens, counts.padded_tokens, counts.truncated)
        done = next(embed([batch], self.encoder, self.model_key, EmbedStats(), reuse,
                          quantization=self.quantization), batch)
        vectors = np.stack([row.vector for row in done if row.vector is not None])
        codes, scales = quantize_matrix(vectors, self.quantization)
        records = pa.Table.from_batches([to_record_batch(done, codes, scales, self.model_key)])
        size = records.num_rows
        after = (counts.tokens, counts.padded_tokens, counts.truncated)
        extra = [[key not in reused for key in records["embed_key"].to_pylist()],
                 [self._report] * size,
                 *([now - then] + [0] * (size - 1)
                   for now, then in zip(after, before, strict=True))]
        for (name, kind), values in zip(ACTOR_COLUMNS, extra, strict=True):
            records = records.append_column(name, pa.array(values, kind))
        return records


def copy_exemplar_codes(rows: pa.Table, codes: dict[str, tuple[bytes, float]],
                        model_key: str) -> pa.Table:
    if rows.num_rows == 0:
        return CHUNK_SCHEMA.empty_table()
    batch = _indexed(rows)
    code_rows = [codes[row.dup_of or ""] for row in batch]
    matrix = np.stack([np.frombuffer(code, np.uint8) for code, _ in code_rows])
    scales = np.array([scale for _, scale in code_rows], np.float32)
    return pa.Table.from_batches([to_record_batch(batch, matrix, scales, model_key)])


def write_fragments(records: pa.Table, uri: str) -> pa.Table:
    from lance.fragment import write_fragments as lance_write

    fragments = lance_write(records.select(CHUNK_SCHEMA.names).cast(CHUNK_SCHEMA), uri,
                            schema=CHUNK_SCHEMA)
    return pa.table({"fragment": [json.dumps(f.to_json()) for f in fragments],
                     "rows": [f.physical_rows for f in fragments]})
