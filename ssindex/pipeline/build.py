"""``build``: plan a run, execute it on an engine, commit it atomically."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

from ssindex.abstain import Thresholds, calibrate, recalibrate
from ssindex.backends.base import Encoder, EncodeStats
from ssindex.backends.inventory import detect
from ssindex.backends.model import ModelSpec
from ssindex.backends.selector import BackendReport, Selection, select
from ssindex.config import BuildConfig, Quantization, settings_fingerprint_fields
from ssindex.errors import IndexCorrupt
from ssindex.lock import BuildLock
from ssindex.pipeline.dag import STAGES, BuildPlan, RayOptions
from ssindex.pipeline.local import RunStats, run_local
from ssindex.pipeline.previous import PreviousIndex, stale_reasons
from ssindex.pipeline.progress import Progress, SilentProgress
from ssindex.pipeline.staging import Staging
from ssindex.remote import RemoteIndex, is_remote, resolve_index
from ssindex.snapshot import SEARCH_FILES_VERSION, update_search_files, write_search_files
from ssindex.stages.quantize import bytes_per_vector
from ssindex.stages.walk import WalkStats, check_root, walk
from ssindex.store import (
    FORMAT_VERSION,
    MANIFEST_SCHEMA,
    IndexDir,
    TableWriter,
    default_index_path,
    now_iso,
    stored_vectors,
)


def settings_fingerprint(cfg: BuildConfig, model: ModelSpec) -> str:
    fields = {"format": FORMAT_VERSION, "model": model.fingerprint,
              **settings_fingerprint_fields(cfg)}
    return xxhash.xxh3_64_hexdigest(repr(sorted(fields.items())).encode())


SMALL_EMBED_LIMIT = 256
"""An incremental build embedding at most this many chunks uses the query backend."""


class LazyEncoder:
    """Selects and loads a backend only when a chunk really needs embedding, so a
    rebuild that reuses every vector never loads a model.

    An incremental build starts on the ``embed_query`` backend (ONNX Runtime on a
    CPU: ready in a fraction of a second, where loading torch takes seconds) and
    moves to the ``embed_bulk`` backend once it has more than ``SMALL_EMBED_LIMIT``
    chunks to embed. Both agree to cosine ≥ 0.999 (see the backend tests)."""

    def __init__(self, model: ModelSpec, cfg: BuildConfig, explicit: str | None,
                 progress: Progress, incremental: bool = False) -> None:
        self.model = model
        self.quantization: Quantization = cfg.quantization
        self._cfg = cfg
        self._explicit = explicit
        self._progress = progress
        self._phase = "embed_query" if incremental and not explicit else "embed_bulk"
        self._embedded = 0
        self.stats = EncodeStats()
        self.selection: Selection | None = None
        self.encoder: Encoder | None = None
        self._loading: threading.Thread | None = None

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.model.dim), dtype=np.float32)
        self._settle()
        self._embedded += len(texts)
        if self._phase == "embed_query" and self._embedded > SMALL_EMBED_LIMIT:
            self._phase, self.encoder = "embed_bulk", None
        return self.load().encode(texts)

    def prepare(self) -> None:
        """Start loading the backend in a background thread. An incremental build calls
        this on meeting a changed file, so that the load (~0.4 s for ONNX Runtime)
        overlaps the walk and dedupe instead of following them. A failure there is
        left for ``load`` to meet again, in the caller's thread."""
        if self.encoder is None and self._loading is None:
            def load_quietly() -> None:
                with contextlib.suppress(Exception):
                    self._load()

            self._loading = threading.Thread(target=load_quietly, daemon=True,
                                             name="ssindex-encoder-load")
            self._loading.start()

    def _settle(self) -> None:
        if self._loading is not None:
            self._loading.join()
            self._loading = None

    def load(self) -> Encoder:
        self._settle()
        return self._load()

    def _load(self) -> Encoder:
        if self.encoder is None:
            query = self._phase == "embed_query"
            # the query backends are probed anyway: importing torch (seconds) to take
            # the machine's inventory would cost a one-file rebuild most of its time
            self.selection = select(self._phase, self.model, None if query else self._explicit,
                                    inventory=detect(with_torch=not query),
                                    warn=self._progress.message)
            self.encoder = Encoder(self.selection.backend, self.model,
                                   self._cfg.embed.max_tokens, self._cfg.embed.batch_tokens)
            self.encoder.stats = self.stats
        return self.encoder

    def report(self) -> BackendReport:
        self._settle()
        if self.selection is None:
            return BackendReport.unloaded("not loaded: every vector was reused")
        report = self.selection.report()
        if self._phase == "embed_query" and not self._embedded:
            reason = f"loaded for changed files, but every vector was reused ({report.reason})"
        elif self._phase == "embed_query":
            reason = (f"incremental build with {self._embedded} chunks to embed: "
                      f"the query backend starts faster ({report.reason})")
        else:
            return report
        return dataclasses.replace(report, reason=reason)


def _previous(index: IndexDir, cfg: BuildConfig, model: ModelSpec,
              progress: Progress) -> PreviousIndex | None:
    if not index.exists():
        return None
    try:
        head = index.read_head()
        return PreviousIndex.load(index, head, settings_fingerprint(cfg, model),
                                  cfg.quantization, cfg.walk)
    except (IndexCorrupt, OSError, KeyError, ValueError) as exc:
        progress.message(f"previous index unreadable, rebuilding from scratch: {exc}")
        return None


def check(root: Path, index_path: str | os.PathLike[str] | None = None,
          config: BuildConfig | None = None) -> list[str]:
    """Why the index is stale against the tree at ``root``; empty when it is current."""
    cfg = config or BuildConfig()
    root = check_root(Path(root))
    index = IndexDir(resolve_index(index_path) if index_path else default_index_path(root))
    previous = _previous(index, cfg, ModelSpec.resolve(cfg.embed.model), SilentProgress())
    known = previous.known if previous is not None else None
    files = {f.path: f.content_hash for f in walk(root, cfg.walk, WalkStats(), index.path, known)}
    return stale_reasons(previous, files)


def build(
    root: Path,
    index_path: str | os.PathLike[str] | None = None,
    config: BuildConfig | None = None,
    backend_overrides: dict[str, str] | None = None,
    progress: Progress | None = None,
    ray: RayOptions | None = None,
) -> dict[str, Any]:
    """Index ``root`` into ``index_path`` (default ``root/.ssindex``); returns build stats.

    ``ray`` runs the stages on a Ray cluster instead of this process (``ray_engine``).
    ``index_path`` may be an object-store URI (``s3://bucket/prefix``): the build runs
    against a local mirror, then uploads it (``ssindex.remote``)."""
    if index_path is not None and is_remote(index_path):
        remote = RemoteIndex(str(index_path))
        result = build(root, remote.pull(), config, backend_overrides, progress, ray)
        remote.push()
        return result | {"index": remote.uri}
    started = time.perf_counter()
    walk_started_ns = time.time_ns()
    cfg = config or BuildConfig()
    progress = progress or SilentProgress()
    overrides = dict(cfg.backends) | (backend_overrides or {})
    root = check_root(Path(root))
    index = IndexDir(Path(index_path) if index_path else default_index_path(root))
    index.ensure_writable()
    with _cluster(ray), BuildLock(index.path, warn=progress.message):
        model = ModelSpec.resolve(cfg.embed.model)
        previous = _previous(index, cfg, model, progress)
        explicit = overrides.get("embed_bulk")
        # under Ray the actors embed; this process only embeds abstention probes, on the
        # query backend, and the actors' hardware may not be this machine's
        encoder = LazyEncoder(model, cfg, None if ray else explicit, progress,
                              incremental=ray is not None or (
                                  previous is not None and previous.chunks_reusable))
        if explicit and not ray:
            encoder.load()  # an explicit backend that cannot run fails before any work
        model_key = f"{model.fingerprint}:{cfg.embed.max_tokens}"
        staging = Staging(index.path, model_key)
        if staging.load():
            progress.message("resuming: reusing vectors checkpointed by an interrupted build")

        def reuse(keys: list[str]) -> dict[str, np.ndarray]:
            found = previous.vectors(keys) if previous else {}
            return found | staging.lookup([key for key in keys if key not in found])

        plan = BuildPlan(root, index.path, cfg, encoder, model_key, reuse,
                         previous if previous is not None and previous.chunks_reusable else None,
                         checkpoint=staging.checkpoint, on_change=encoder.prepare)
        stats = RunStats()
        writer = TableWriter(index, previous.head if previous else None)
        write_started = time.perf_counter()
        encode: EncodeStats | None
        if ray is not None:
            from ssindex.pipeline.ray_engine import run_ray

            version, backend, encode = run_ray(plan, stats, progress, writer, previous, explicit,
                                               model, ray)
            write_seconds = stats.clock.inclusive["write"]
        else:
            version = writer.write(run_local(plan, stats, progress),
                                   previous.digests if previous else {}, stats.row_ids)
            write_seconds = time.perf_counter() - write_started - stats.clock.inclusive.get(
                "quantize", 0.0)
            backend = encoder.report()
            encode = encoder.stats if encoder.selection is not None else None
        manifest = index.write_manifest(
            f"v{version}.arrow", pa.Table.from_pylist(stats.manifest, schema=MANIFEST_SCHEMA))
        kept = previous.head.data if previous is not None else {}
        current = kept.get("search_files") == SEARCH_FILES_VERSION
        if current and writer.rows_written == writer.rows_deleted == 0:
            # same rows: the search files and thresholds of the previous build still hold
            files = {name: kept[name] for name in _HEAD_FILES[1:]}
            thresholds = Thresholds(**kept["abstention"])
        else:
            files, thresholds = _search_files(index, version, encoder, model_key, kept,
                                              writer.changes if current else None)
        result = _stats(stats, encode, backend, model, cfg, write_seconds, writer, previous)
        result["engine"] = "ray" if ray is not None else "local"
        result["wall_seconds"] = round(time.perf_counter() - started, 3)
        index.write_head({
            "format_version": FORMAT_VERSION,
            "table_version": version,
            "manifest": manifest,
            "root": str(root),
            "built_at": now_iso(),
            "walk_started_ns": walk_started_ns,
            "model": {"name": model.name, "id": model.model_id, "path": str(model.path),
                      "fingerprint": model.fingerprint, "dim": model.dim,
                      "max_tokens": cfg.embed.max_tokens},
            "quantization": cfg.quantization,
            "settings": {"fingerprint": settings_fingerprint(cfg, model),
                         "config": dataclasses.asdict(cfg)},
            **files,
            "search_files": SEARCH_FILES_VERSION,
            "abstention": thresholds.as_json(),
            "files": result["files_indexed"],
            "chunks": result["chunks_total"],
            "stats": result,
        })
        writer.cleanup()
        # readers may still be pinned to the previous head: its files stay too
        heads = [kept, {"manifest": manifest, **files}]
        index.prune_manifests(keep={head[key] for head in heads for key in _HEAD_FILES
                                    if key in head})
        staging.clear()
    result["index"] = str(index.path)
    result["table_version"] = version
    return result


def _cluster(ray: RayOptions | None) -> contextlib.AbstractContextManager[Any]:
    """The Ray cluster of a Ray build, joined before LanceDB starts its threads (Ray forks
    helper processes); nothing for a local build."""
    if ray is None:
        return contextlib.nullcontext()
    from ssindex.pipeline.ray_engine import ray_cluster

    return ray_cluster(ray)


_HEAD_FILES = ("manifest", "postings", "snapshot")
"""Keys of ``HEAD.json`` that name per-version manifests."""


def _search_files(index: IndexDir, version: int, encoder: LazyEncoder, model_key: str,
                  previous: dict[str, Any], changes: tuple[pa.Table, set[str]] | None,
                  ) -> tuple[dict[str, str], Thresholds]:
    """The search files of the committed version (``ssindex.snapshot``), and abstention
    thresholds calibrated on its rows. ``changes`` (rows written, ids deleted) against the
    version whose search files ``previous`` names update those; without, they are
    written from the table.

    The nonsense queries' vectors depend on the model alone, so they are kept
    beside the index and a rebuild that embeds nothing never loads the model."""
    if changes is not None:
        files, data, stats = update_search_files(index, version, previous, *changes)
    else:
        files, data, stats = write_search_files(index, version)
    key = xxhash.xxh3_64_hexdigest(model_key.encode())
    cache = index.path / "manifests" / f"nonsense-{key}.arrow"

    def embed(queries: list[str]) -> np.ndarray:
        if cache.is_file():
            return np.stack(index.read_manifest(cache.name).column("vector").to_numpy(
                zero_copy_only=False))
        vectors = encoder.encode(queries)
        index.write_manifest(cache.name, pa.table({"vector": pa.array(
            list(vectors), type=pa.list_(pa.float32()))}))
        return vectors

    def vectors(rows: pa.Table) -> np.ndarray:
        return stored_vectors(rows, encoder.quantization, encoder.model.dim)

    if changes is not None:
        written, removed = changes
        thresholds = recalibrate(Thresholds(**previous["abstention"]), stats, vectors(written),
                                 written.column("id").to_pylist(), removed, embed)
        if thresholds is not None:
            return files, thresholds
    return files, calibrate(stats, vectors(data), data.column("id").to_pylist(), embed)


def _stats(stats: RunStats, encode: EncodeStats | None, backend: BackendReport,
           model: ModelSpec, cfg: BuildConfig, write_seconds: float, writer: TableWriter,
           previous: PreviousIndex | None) -> dict[str, Any]:
    seconds = stats.clock.exclusive()
    seconds["write"] = round(max(write_seconds, 0.0), 3)
    known = previous.files if previous is not None else {}
    paths = {entry["path"] for entry in stats.manifest}
    return {
        "files_seen": stats.walk.files_seen,
        "files_read": stats.walk.files_read,
        "files_indexed": stats.chunk.files,
        "files_skipped": dict(sorted(stats.walk.skipped.items())),
        "dirs_pruned": dict(sorted(stats.walk.dirs_pruned.items())),
        "files_unchanged": stats.chunk.files_unchanged,
        "files_changed": sum(1 for e in stats.manifest
                             if e["path"] in known and known[e["path"]][0] != e["content_hash"]),
        "files_new": sum(1 for p in paths if p not in known),
        "files_removed": sum(1 for p in known if p not in paths),
        "chunkers": dict(stats.chunk.chunkers),
        "chunks_total": stats.chunk.chunks,
        "chunks_embedded": stats.embed.embedded,
        "chunks_deduplicated": stats.dedupe.exact + stats.dedupe.near,
        "chunks_near_duplicates": stats.dedupe.near,
        "chunks_reused": stats.embed.reused,
        "chunks_truncated": encode.truncated if encode else 0,
        "tokens_embedded": encode.tokens if encode else 0,
        "padding_fraction": round(1 - encode.tokens / encode.padded_tokens, 4)
        if encode and encode.padded_tokens else 0.0,
        "rows_written": writer.rows_written,
        "rows_deleted": writer.rows_deleted,
        "stage_seconds": {stage: seconds.get(stage, 0.0) for stage in STAGES},
        "backends": {"embed_bulk": backend.as_json()},
        "model": model.model_id,
        "quantization": cfg.quantization,
        "vector_bytes_per_chunk": bytes_per_vector(cfg.quantization, model.dim),
    }
