"""The Ray engine: the local engine's stages as a Ray Data pipeline, for clusters.

    driver    walk and manifest diff: only new and changed files are sent out
    tasks     chunk and MinHash-sign blocks of files (``map_batches``)
    shuffle   exact groups by content hash, LSH buckets by band key (``groupby``):
              near duplicates on different workers meet in one bucket
    driver    duplicate verdicts replayed over the sparse candidate pairs in path
              order, so they equal the local engine's (``resolve_duplicates``)
    actors    embed and quantize exemplars: one model per actor, its backend
              picked by the selector on the actor's own hardware
    tasks     duplicates take their exemplar's codes
    write     clean build: workers write Lance fragments, the driver commits them
              as one version; incremental build: the driver merges the changed
              rows (``TableWriter``), as the local engine does

Readers see nothing before the driver commits and moves HEAD. Ray retries a
task or restarts an actor that dies; every stage is a pure function of its
input block, so a retried block yields the same rows.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from ssindex import errors
from ssindex.backends.base import Encoder, EncodeStats
from ssindex.backends.model import ModelSpec
from ssindex.backends.selector import BackendReport, select
from ssindex.config import ChunkConfig, DedupeConfig, Quantization
from ssindex.errors import EngineUnavailable, SsindexError
from ssindex.pipeline.dag import BuildPlan, RayOptions
from ssindex.pipeline.local import RunStats, manifest_entry
from ssindex.pipeline.previous import PreviousIndex
from ssindex.pipeline.progress import Progress
from ssindex.pipeline.rows import to_record_batch
from ssindex.rows import Chunk, IndexedChunk, SourceFile
from ssindex.stages.chunk import chunk_file
from ssindex.stages.dedupe import (
    Candidate,
    Signer,
    band_keys,
    bucket_pairs,
    resolve_duplicates,
    rows_per_band,
)
from ssindex.stages.embed import EmbedStats, embed
from ssindex.stages.quantize import quantize_matrix
from ssindex.stages.walk import reread, walk
from ssindex.store import CHUNK_SCHEMA, IndexDir, TableWriter, scan, stored_vectors

_FILE_BITS = 24
"""A chunk's ordinal is ``file ordinal << 24 | position in file``: path order as one int."""

CHUNK_ROW = pa.schema([
    ("ordinal", pa.int64()), ("id", pa.string()), ("path", pa.string()),
    ("language", pa.string()), ("start_line", pa.int32()), ("end_line", pa.int32()),
    ("symbol", pa.string()), ("kind", pa.string()), ("text", pa.string()),
    ("content_hash", pa.string()), ("file_hash", pa.string()), ("minhash", pa.binary()),
    ("dup_of", pa.string()),
])
_CHUNK_FIELDS = [name for name in CHUNK_ROW.names if name not in ("ordinal", "minhash", "dup_of")]
_PARTICIPANT_COLUMNS = ["ordinal", "id", "content_hash", "minhash"]
_FILE_BLOCK = pa.schema([
    ("file_ordinal", pa.int64()), ("path", pa.string()), ("language", pa.string()),
    ("text", pa.string()), ("size", pa.int64()), ("mtime_ns", pa.int64()),
    ("content_hash", pa.string()),
])


# -- tasks and actors (run on workers; pure functions of their input block) ------------

def chunk_block(files: pa.Table, chunk_cfg: dict[str, Any], dedupe_cfg: dict[str, Any],
                ) -> pa.Table:
    """Chunk and sign a block of files: one row per file, its chunks nested."""
    cfg, sign = ChunkConfig(**chunk_cfg), _signer(DedupeConfig(**dedupe_cfg))
    out: dict[str, list[Any]] = {"file_ordinal": [], "chunker": [], "chunk_ids": [],
                                 "chunks": []}
    for record in files.to_pylist():
        ordinal = record.pop("file_ordinal")
        chunks, chunker = chunk_file(SourceFile(**record), cfg)
        out["file_ordinal"].append(ordinal)
        out["chunker"].append(chunker)
        out["chunk_ids"].append([c.id for c in chunks])
        out["chunks"].append([{"ordinal": ordinal << _FILE_BITS | position, **asdict(c),
                               "minhash": sign(c.text), "dup_of": None}
                              for position, c in enumerate(chunks)])
    return pa.table(out, schema=pa.schema([
        ("file_ordinal", pa.int64()), ("chunker", pa.string()),
        ("chunk_ids", pa.list_(pa.string())), ("chunks", pa.list_(pa.struct(CHUNK_ROW)))]))


_SIGNERS: dict[DedupeConfig, Signer] = {}


def _signer(cfg: DedupeConfig) -> Signer:
    if cfg not in _SIGNERS:
        _SIGNERS[cfg] = Signer(cfg)
    return _SIGNERS[cfg]


def explode_chunks(files: pa.Table) -> pa.Table:
    flat = pc.list_flatten(files.column("chunks")).combine_chunks()
    if len(flat) == 0:
        return CHUNK_ROW.empty_table()
    return pa.Table.from_batches([pa.RecordBatch.from_struct_array(flat)])


_EXACT, _NEAR = 0, 1
_DEDUPE_KEYS = pa.schema([("kind", pa.int8()), ("key", pa.uint64()), ("ordinal", pa.int64()),
                         ("id", pa.string()), ("content_hash", pa.string()),
                         ("minhash", pa.binary())])
_PAIRS = pa.schema([("later", pa.int64()), ("earlier", pa.int64()), ("earlier_id", pa.string()),
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
    return pa.Table.from_pylist(found, schema=_PAIRS)


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


_ACTOR_COLUMNS = [("_embedded", pa.bool_()), ("_backend", pa.string()), ("_tokens", pa.int64()),
                  ("_padded_tokens", pa.int64()), ("_truncated", pa.int64())]
"""Per row: freshly embedded or reused, the actor's backend report (JSON); then the
batch's encode counts, on its first row (zeros elsewhere, so column sums are exact)."""
_EMBEDDED = pa.schema([*CHUNK_SCHEMA, *(pa.field(n, t) for n, t in _ACTOR_COLUMNS)])


class EmbedActor:
    """Embeds and quantizes exemplar chunks; the model is loaded once per actor."""

    def __init__(self, model: str, max_tokens: int, batch_tokens: int, explicit: str | None,
                 model_key: str, quantization: Quantization,
                 previous: tuple[str, int, Quantization] | None) -> None:
        spec = ModelSpec.resolve(model)
        self.selection = select("embed_bulk", spec, explicit)
        self._report = json.dumps(self.selection.as_json())
        self.encoder = Encoder(self.selection.backend, spec, max_tokens, batch_tokens)
        self.model_key, self.quantization, self.dim = model_key, quantization, spec.dim
        self.previous = None
        if previous is not None:
            path, version, method = previous
            self.previous = (IndexDir(Path(path)).open_table(version), method)

    def reuse(self, keys: list[str]) -> dict[str, np.ndarray]:
        """Vectors of these embed keys in the previous index (renamed and copied code)."""
        if self.previous is None or not keys:
            return {}
        table, method = self.previous
        quoted = ", ".join(f"'{key}'" for key in keys)
        found = scan(table, ["embed_key", "vec_codes", "vec_scale"],
                     where=f"dup_of IS NULL AND embed_key IN ({quoted})")
        return dict(zip(found["embed_key"].to_pylist(), stored_vectors(found, method, self.dim),
                        strict=True))

    def __call__(self, rows: pa.Table) -> pa.Table:
        # duplicates are filtered here, not by an upstream task: on a small cluster the
        # pool can hold every CPU, and an upstream task would then wait forever
        rows = select_rows(rows, duplicates=False)
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
        done = next(embed([batch], self.encoder, self.model_key, EmbedStats(), reuse), batch)
        vectors = np.stack([row.vector for row in done if row.vector is not None])
        codes, scales = quantize_matrix(vectors, self.quantization)
        records = pa.Table.from_batches([to_record_batch(done, codes, scales, self.model_key)])
        size = records.num_rows
        after = (counts.tokens, counts.padded_tokens, counts.truncated)
        extra = [[key not in reused for key in records["embed_key"].to_pylist()],
                 [self._report] * size,
                 *([now - then] + [0] * (size - 1)
                   for now, then in zip(after, before, strict=True))]
        for (name, kind), values in zip(_ACTOR_COLUMNS, extra, strict=True):
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


# -- the driver ----------------------------------------------------------------------------

@contextlib.contextmanager
def ray_cluster(options: RayOptions) -> Iterator[Any]:
    """Connect to ``options.address``, or start (and afterwards stop) a local cluster."""
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise EngineUnavailable(
            "--engine ray needs the ray extra: pip install 'ssindex[ray]'") from exc
    if ray.is_initialized():
        yield ray
        return
    try:
        ray.init(address=options.address, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.ERROR, configure_logging=False,
                 runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1",
                                           "TOKENIZERS_PARALLELISM": "false"}})
    except Exception as exc:
        raise EngineUnavailable(f"cannot start or reach a Ray cluster: {exc}") from exc
    try:
        yield ray
    finally:
        ray.shutdown()


def run_ray(plan: BuildPlan, stats: RunStats, progress: Progress, writer: TableWriter,
            previous: PreviousIndex | None, explicit: str | None, model: ModelSpec,
            options: RayOptions) -> tuple[int, BackendReport, EncodeStats]:
    """Run the build on Ray and commit it; returns the table version, a report of the
    backends the actors chose, and their encode counts."""
    with ray_cluster(options) as ray:
        context = ray.data.DataContext.get_current()
        context.print_on_execution_start = False
        logging.getLogger("ray.data").setLevel(logging.ERROR)
        try:
            return _Run(ray, plan, stats, progress, previous, model, options).execute(
                writer, explicit)
        except Exception as exc:
            raise _user_error(exc) or exc from None


def _user_error(exc: BaseException) -> SsindexError | None:
    """The ssindex error (an explicit backend that cannot run on an actor, say) that a
    Ray task raised, rebuilt so the CLI reports it in one line. Ray Data keeps only the
    remote traceback's text, so the error is read back from its last line."""
    found = _REMOTE_ERROR.findall(str(exc))
    if not found:
        return None
    name, message = found[-1]
    kind = getattr(errors, name, None)
    if isinstance(kind, type) and issubclass(kind, SsindexError):
        return kind(message)
    return None


_REMOTE_ERROR = re.compile(r"ssindex\.errors\.(\w+): (.+)")


class _Run:
    def __init__(self, ray: Any, plan: BuildPlan, stats: RunStats, progress: Progress,
                 previous: PreviousIndex | None, model: ModelSpec, options: RayOptions) -> None:
        self.ray, self.plan, self.stats, self.progress = ray, plan, stats, progress
        self.previous, self.model, self.options = previous, model, options
        self.cfg = plan.config
        self.encode = EncodeStats()
        self.resources = ray.cluster_resources()

    def _timed(self, stage: str, started: float) -> float:
        now = time.perf_counter()
        self.stats.clock.inclusive[stage] = self.stats.clock.inclusive.get(stage, 0.0) + (
            now - started)
        return now

    def execute(self, writer: TableWriter, explicit: str | None,
                ) -> tuple[int, BackendReport, EncodeStats]:
        started = time.perf_counter()
        files, stored = self._walk()
        started = self._timed("walk", started)
        rows = self._chunk(files)
        started = self._timed("chunk", started)
        if self.stats.chunk.chunks == 0:  # an empty tree: nothing to shuffle or embed
            return self._write_nothing(writer, started, "no chunks")
        rows, needed = self._dedupe(rows, stored)
        started = self._timed("dedupe", started)
        if rows is None:  # every file unchanged, every verdict kept
            return self._write_nothing(writer, started, "every vector reused")
        embedded, backends = self._embed(rows, explicit)
        started = self._timed("embed", started)
        records = embedded.union(self._copy_duplicates(rows, embedded, needed))
        if self.previous is None:
            version = self._commit_fragments(records, writer)
        else:
            version = writer.write(_record_batches(records), self.previous.digests,
                                   self.stats.row_ids)
        self._timed("write", started)
        actors, cpus, gpus = self._actors()
        report = BackendReport.merged(
            [BackendReport.from_json(json.loads(chosen)) for chosen in sorted(backends)],
            {"embed_actors": actors, "cpus_per_actor": cpus, "gpus_per_actor": gpus})
        return version, report, self.encode

    def _write_nothing(self, writer: TableWriter, started: float, reason: str,
                       ) -> tuple[int, BackendReport, EncodeStats]:
        """Commit no new rows (deleting those of removed files) without starting actors."""
        version = writer.write(iter(()), self.previous.digests if self.previous else {},
                               self.stats.row_ids)
        self._timed("write", started)
        return version, BackendReport.unloaded(reason), self.encode

    def _walk(self) -> tuple[list[pa.Table], list[dict[str, Any]]]:
        """Blocks of changed files to send out; unchanged files' stored rows stay here."""
        block: list[dict[str, Any]] = []
        blocks: list[pa.Table] = []
        previous = self.plan.previous
        positions: list[int] = []
        ordinals: list[int] = []
        for source in walk(self.plan.root, self.cfg.walk, self.stats.walk, self.plan.index_path,
                           previous.known if previous is not None else None):
            self.progress.advance("walk")
            ordinal = len(self.stats.manifest)  # the file's place in the manifest
            if previous is not None and (kept := previous.carried(source)) is not None:
                self.stats.chunk.files_unchanged += 1
                self.stats.manifest.append(manifest_entry(source, kept))
                positions += [previous.position[i] for i in kept]
                ordinals += [ordinal << _FILE_BITS | position for position in range(len(kept))]
                continue
            read = reread(self.plan.root, source, self.cfg.walk, self.stats.walk)
            if read is None:
                continue
            source = read
            self.stats.manifest.append(manifest_entry(source, []))
            block.append({"file_ordinal": ordinal, **asdict(source)})
            if len(block) == self.options.files_per_block:
                blocks.append(pa.Table.from_pylist(block, schema=_FILE_BLOCK))
                block = []
        if block:
            blocks.append(pa.Table.from_pylist(block, schema=_FILE_BLOCK))
        stored = [] if self.previous is None or not positions else [
            {**row, "ordinal": ordinal} for row, ordinal in
            zip(self.previous.rows(positions).to_pylist(), ordinals, strict=True)]
        return blocks, stored

    def _chunk(self, blocks: list[pa.Table]) -> Any | None:
        """Chunk rows of the changed files (``None`` when no file changed)."""
        data = self.ray.data
        manifest = self.stats.manifest
        if blocks:
            files = data.from_arrow(blocks).map_batches(
                chunk_block, batch_format="pyarrow", batch_size=None,
                fn_kwargs={"chunk_cfg": asdict(self.cfg.chunk),
                           "dedupe_cfg": asdict(self.cfg.dedupe)}).materialize()
            columns = ["file_ordinal", "chunker", "chunk_ids"]
            for batch in files.select_columns(columns).iter_batches(batch_format="pyarrow",
                                                                    batch_size=None):
                for ordinal, chunker, ids in zip(*(batch[c].to_pylist() for c in columns),
                                                 strict=True):
                    manifest[ordinal]["chunk_ids"] = ids
                    self.stats.chunk.chunkers[chunker] += 1
            rows = files.map_batches(explode_chunks, batch_format="pyarrow",
                                     batch_size=None).materialize()
        else:  # no empty dataset: Ray's shuffle would meet its schema-less blocks
            rows = None
        self.stats.chunk.files = len(manifest)
        self.stats.chunk.chunks = sum(len(entry["chunk_ids"]) for entry in manifest)
        self.stats.row_ids.update(i for entry in manifest for i in entry["chunk_ids"])
        self.progress.advance("chunk", self.stats.chunk.chunks)
        return rows

    def _dedupe(self, rows: Any | None, stored: list[dict[str, Any]],
                ) -> tuple[Any | None, set[str]]:
        """Rows to write with their verdicts (``None`` when there are none), and the
        exemplars whose codes they copy."""
        data, cfg = self.ray.data, self.cfg.dedupe
        parts = [rows.select_columns(_PARTICIPANT_COLUMNS)] if rows is not None else []
        if stored:
            parts.append(data.from_arrow(pa.Table.from_pylist(
                stored, schema=CHUNK_ROW).select(_PARTICIPANT_COLUMNS)))
        participants = _union(parts)
        partitions = max(2, int(self.resources.get("CPU", 1)))
        found = participants.map_batches(
            dedupe_keys, batch_format="pyarrow", batch_size=None,
            fn_kwargs={"rows_per_band": rows_per_band(cfg.near_threshold, cfg.num_perm)},
        ).groupby(["kind", "key"], num_partitions=partitions).map_groups(
            dedupe_group, batch_format="pyarrow", fn_kwargs={"threshold": cfg.near_threshold})
        exact: dict[int, tuple[int, str]] = {}
        pairs: list[Candidate] = []
        for batch in found.iter_batches(batch_format="pyarrow", batch_size=None):
            for later, earlier, earlier_id, similarity in zip(
                    *(batch[c].to_pylist() for c in _PAIRS.names), strict=True):
                if similarity is None:
                    exact[later] = (earlier, earlier_id)
                else:
                    pairs.append(Candidate(later, earlier, earlier_id, similarity))
        verdicts = resolve_duplicates(exact, pairs, self.stats.dedupe)
        # unchanged exemplars keep their stored vectors: reused, as the local engine counts them
        self.stats.embed.reused = sum(1 for r in stored if r["dup_of"] is None
                                      and r["ordinal"] not in verdicts)
        parts = [rows.map_batches(attach_verdicts, batch_format="pyarrow", batch_size=None,
                                  fn_kwargs={"verdicts": verdicts})] if rows is not None else []
        moved = [{**r, "dup_of": verdicts.get(r["ordinal"])} for r in stored
                 if verdicts.get(r["ordinal"]) != r["dup_of"]]
        if moved:  # an unchanged file whose duplicate verdict moved is written again
            parts.append(data.from_arrow(pa.Table.from_pylist(moved, schema=CHUNK_ROW)))
        if not parts:
            return None, set()
        rows = _union(parts).materialize()
        needed = {v for b in rows.select_columns(["dup_of"]).iter_batches(
            batch_format="pyarrow", batch_size=None) for v in b["dup_of"].to_pylist() if v}
        return rows, needed

    def _actors(self) -> tuple[int, float, float]:
        gpus, cpus = float(self.resources.get("GPU", 0)), float(self.resources.get("CPU", 1))
        per_gpu = self.options.gpus_per_actor
        if per_gpu is None:
            per_gpu = 1.0 if gpus else 0.0
        actors = self.options.embed_actors or (
            max(1, int(gpus // per_gpu)) if per_gpu else max(1, int(cpus) // 2))
        cpus_per_actor = 1.0 if per_gpu else max(1.0, cpus // actors)
        return actors, cpus_per_actor, per_gpu

    def _embed(self, rows: Any, explicit: str | None) -> tuple[Any, set[str]]:
        actors, cpus_per_actor, gpus_per_actor = self._actors()
        previous = self.previous
        reuse = (str(self.plan.index_path), previous.head.table_version,
                 previous.head.quantization) if previous and previous.vectors_reusable else None
        embedded = rows.map_batches(
            EmbedActor, batch_format="pyarrow", num_cpus=cpus_per_actor,
            compute=self.ray.data.ActorPoolStrategy(size=actors),
            num_gpus=gpus_per_actor or None, batch_size=self.options.rows_per_embed_batch,
            fn_constructor_kwargs={
                "model": str(self.model.path), "max_tokens": self.cfg.embed.max_tokens,
                "batch_tokens": self.cfg.embed.batch_tokens, "explicit": explicit,
                "model_key": self.plan.model_key, "quantization": self.cfg.quantization,
                "previous": reuse},
            runtime_env={"env_vars": {"OMP_NUM_THREADS": str(int(cpus_per_actor))}},
        ).materialize()
        backends: set[str] = set()
        for batch in embedded.select_columns([name for name, _ in _ACTOR_COLUMNS]).iter_batches(
                batch_format="pyarrow", batch_size=None):
            fresh = int(pc.sum(batch["_embedded"]).as_py() or 0)
            self.stats.embed.embedded += fresh
            self.stats.embed.reused += batch.num_rows - fresh
            backends.update(batch["_backend"].unique().to_pylist())
            for name in ("tokens", "padded_tokens", "truncated"):
                total = getattr(self.encode, name) + int(pc.sum(batch[f"_{name}"]).as_py() or 0)
                setattr(self.encode, name, total)
            self.encode.texts += fresh
        self.progress.advance("embed", self.stats.chunk.chunks)
        return embedded.drop_columns([name for name, _ in _ACTOR_COLUMNS]).materialize(), backends

    def _copy_duplicates(self, rows: Any, embedded: Any, needed: set[str]) -> Any:
        codes: dict[str, tuple[bytes, float]] = {}
        if needed:
            for batch in embedded.select_columns(["id", "vec_codes", "vec_scale"]).iter_batches(
                    batch_format="pyarrow", batch_size=None):
                wanted = pc.is_in(batch["id"], pa.array(sorted(needed)))
                for row in batch.filter(wanted).to_pylist():
                    codes[row["id"]] = (row["vec_codes"], row["vec_scale"])
        if self.previous is not None and needed - codes.keys():
            position = self.previous.position
            kept = self.previous.rows([position[i] for i in sorted(needed - codes.keys())],
                                      ["id", "vec_codes", "vec_scale"])
            for row in kept.to_pylist():
                codes[row["id"]] = (row["vec_codes"], row["vec_scale"])
        return rows.map_batches(select_rows, batch_format="pyarrow", batch_size=None,
                                fn_kwargs={"duplicates": True}).map_batches(
            copy_exemplar_codes, batch_format="pyarrow", batch_size=None,
            fn_kwargs={"codes": codes, "model_key": self.plan.model_key})

    def _commit_fragments(self, records: Any, writer: TableWriter) -> int:
        uri = str(writer.index.db_path / "chunks.lance")
        written = records.map_batches(write_fragments, batch_format="pyarrow", batch_size=None,
                                      fn_kwargs={"uri": uri}).take_all()
        writer.rows_written = sum(row["rows"] for row in written)
        return writer.commit_fragments([row["fragment"] for row in written])


def _union(datasets: list[Any]) -> Any:
    return datasets[0].union(*datasets[1:]) if len(datasets) > 1 else datasets[0]


def _record_batches(records: Any) -> Iterator[pa.RecordBatch]:
    for table in records.iter_batches(batch_format="pyarrow", batch_size=None):
        yield from table.select(CHUNK_SCHEMA.names).cast(CHUNK_SCHEMA).to_batches()
