"""``build``: plan a run, execute it on an engine, commit it atomically."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

from ssindex.backends.base import Encoder
from ssindex.backends.model import ModelSpec
from ssindex.backends.selector import select
from ssindex.config import BuildConfig, Quantization, settings_fingerprint_fields
from ssindex.errors import IndexCorrupt
from ssindex.lock import BuildLock
from ssindex.pipeline.dag import STAGES, BuildPlan
from ssindex.pipeline.local import RunStats, run_local
from ssindex.pipeline.progress import Progress, SilentProgress
from ssindex.stages.quantize import bytes_per_vector, dequantize_matrix
from ssindex.stages.walk import check_root
from ssindex.store import (
    FORMAT_VERSION,
    MANIFEST_SCHEMA,
    Head,
    IndexDir,
    TableWriter,
    binary_matrix,
    load_digests,
    now_iso,
    scan,
)


def default_index_path(root: Path) -> Path:
    return Path(root) / ".ssindex"


def settings_fingerprint(cfg: BuildConfig, model: ModelSpec) -> str:
    fields = {"model": model.fingerprint, **settings_fingerprint_fields(cfg)}
    return xxhash.xxh3_64_hexdigest(repr(sorted(fields.items())).encode())


def _reuse_from(index: IndexDir, head: Head | None, quantization: Quantization,
                ) -> Callable[[list[str]], dict[str, np.ndarray]] | None:
    """Vectors of the committed index by embed key, when stored at this quantization."""
    if head is None or head.quantization != quantization:
        return None
    data = scan(index.open_table(head.table_version), ["embed_key", "vec_codes", "vec_scale"],
                where="dup_of IS NULL")
    keys = data.column("embed_key").to_pylist()
    if not keys:
        return None
    vectors = dequantize_matrix(binary_matrix(data.column("vec_codes").combine_chunks()),
                                data.column("vec_scale").to_numpy(), quantization, head.dim)
    position = {key: row for row, key in enumerate(keys)}

    def lookup(wanted: list[str]) -> dict[str, np.ndarray]:
        return {key: vectors[position[key]] for key in wanted if key in position}

    return lookup


def _previous_head(index: IndexDir, warn: Callable[[str], None]) -> Head | None:
    if not index.exists():
        return None
    try:
        return index.read_head()
    except IndexCorrupt as exc:
        warn(f"previous index unreadable, rebuilding from scratch: {exc}")
        return None


def build(
    root: Path,
    index_path: Path | None = None,
    config: BuildConfig | None = None,
    backend_overrides: dict[str, str] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Index ``root`` into ``index_path`` (default ``root/.ssindex``); returns build stats."""
    started = time.perf_counter()
    cfg = config or BuildConfig()
    progress = progress or SilentProgress()
    overrides = dict(cfg.backends) | (backend_overrides or {})
    root = check_root(Path(root))
    index = IndexDir(index_path or default_index_path(root))
    index.ensure_writable()
    with BuildLock(index.path, warn=progress.message):
        previous = _previous_head(index, progress.message)
        model = ModelSpec.resolve(cfg.embed.model)
        selection = select("embed_bulk", model, overrides.get("embed_bulk"), warn=progress.message)
        encoder = Encoder(selection.backend, model, cfg.embed.max_tokens, cfg.embed.batch_tokens)
        model_key = f"{model.fingerprint}:{cfg.embed.max_tokens}"
        plan = BuildPlan(root, index.path, cfg, encoder, model_key,
                         _reuse_from(index, previous, cfg.quantization))
        stats = RunStats()
        writer = TableWriter(index, previous)
        digests = load_digests(index, previous)
        write_started = time.perf_counter()
        version = writer.write(run_local(plan, stats, progress), digests)
        write_seconds = time.perf_counter() - write_started - stats.clock.inclusive.get(
            "quantize", 0.0)
        manifest = index.write_manifest(
            f"v{version}.arrow", pa.Table.from_pylist(stats.manifest, schema=MANIFEST_SCHEMA))
        result = _stats(stats, selection.as_json(), model, cfg, encoder, write_seconds,
                        time.perf_counter() - started, writer)
        head = {
            "format_version": FORMAT_VERSION,
            "table_version": version,
            "manifest": manifest,
            "root": str(root),
            "built_at": now_iso(),
            "model": {"name": model.name, "id": model.model_id, "path": str(model.path),
                      "fingerprint": model.fingerprint, "dim": model.dim,
                      "max_tokens": cfg.embed.max_tokens},
            "quantization": cfg.quantization,
            "settings": {"fingerprint": settings_fingerprint(cfg, model),
                         "config": dataclasses.asdict(cfg)},
            "files": result["files_indexed"],
            "chunks": result["chunks_total"],
            "stats": result,
        }
        index.write_head(head)
        writer.cleanup()
    result["index"] = str(index.path)
    result["table_version"] = version
    return result


def _stats(stats: RunStats, bulk: dict[str, Any], model: ModelSpec, cfg: BuildConfig,
           encoder: Encoder, write_seconds: float, wall: float, writer: TableWriter,
           ) -> dict[str, Any]:
    seconds = stats.clock.exclusive()
    seconds["write"] = round(max(write_seconds, 0.0), 3)
    return {
        "files_seen": stats.walk.files_seen,
        "files_indexed": stats.chunk.files,
        "files_skipped": dict(sorted(stats.walk.skipped.items())),
        "dirs_pruned": dict(sorted(stats.walk.dirs_pruned.items())),
        "chunkers": dict(stats.chunk.chunkers),
        "chunks_total": stats.chunk.chunks,
        "chunks_embedded": stats.embed.embedded,
        "chunks_deduplicated": stats.dedupe.exact + stats.dedupe.near,
        "chunks_near_duplicates": stats.dedupe.near,
        "chunks_reused": stats.embed.reused,
        "chunks_truncated": encoder.stats.truncated,
        "tokens_embedded": encoder.stats.tokens,
        "padding_fraction": round(1 - encoder.stats.tokens / encoder.stats.padded_tokens, 4)
        if encoder.stats.padded_tokens else 0.0,
        "rows_written": writer.rows_written,
        "rows_deleted": writer.rows_deleted,
        "stage_seconds": {stage: seconds.get(stage, 0.0) for stage in STAGES},
        "wall_seconds": round(wall, 3),
        "backends": {"embed_bulk": bulk},
        "model": model.model_id,
        "quantization": cfg.quantization,
        "vector_bytes_per_chunk": bytes_per_vector(cfg.quantization, model.dim),
    }
