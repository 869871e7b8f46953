"""What a build commits after its rows: search files, abstention thresholds, stats, HEAD."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

from ssindex.backends.base import EncodeStats
from ssindex.backends.model import ModelSpec
from ssindex.backends.selector import BackendReport
from ssindex.codec import StoredVectors, bytes_per_vector, dense_coverage
from ssindex.config import BuildConfig
from ssindex.index.abstention import TermStats, Thresholds, calibrate, recalibrate
from ssindex.index.integrity import checksums, table_files
from ssindex.index.layout import FILE_KEYS, FORMAT_VERSION, MANIFEST_SCHEMA, IndexDir, now_iso
from ssindex.index.search_files import (
    SEARCH_FILE_KEYS,
    SEARCH_FILES_VERSION,
    revectored_search_files,
    update_search_files,
    write_search_files,
)
from ssindex.index.table import TableWriter
from ssindex.pipeline.encoder import LazyEncoder
from ssindex.pipeline.engines.common import RunStats
from ssindex.pipeline.fingerprint import settings_fingerprint
from ssindex.pipeline.plan import STAGES, BuildPlan
from ssindex.pipeline.previous import PreviousIndex
from ssindex.util import heap


@dataclass(frozen=True)
class Started:
    """When a build started: its wall clock, and the walk's stat-trust reference."""

    seconds: float = field(default_factory=time.perf_counter)
    walk_ns: int = field(default_factory=time.time_ns)


@dataclass(frozen=True)
class Outcome:
    """What an engine did: the table version it committed, and how."""

    engine: str
    version: int
    stats: RunStats
    backend: BackendReport
    encode: EncodeStats | None
    encoder: LazyEncoder
    write_seconds: float


def commit(index: IndexDir, plan: BuildPlan, outcome: Outcome, writer: TableWriter,
           previous: PreviousIndex | None, model: ModelSpec, started: Started,
           committed: Callable[[], None] | None = None) -> dict[str, Any]:
    """Write the version's manifest and search files, then move ``HEAD.json`` to it
    (and call ``committed``); returns the build stats. Old versions and files no reader
    can hold are dropped. The heap is trimmed before and after (``util.heap``), so what
    the pass freed is not resident under the commit's peak, nor the commit's under the
    next pass's."""
    heap.trim()
    stats, version, cfg = outcome.stats, outcome.version, plan.config
    manifest = index.write_manifest(
        f"v{version}.arrow", pa.Table.from_pylist(stats.manifest, schema=MANIFEST_SCHEMA))
    kept = previous.head.data if previous is not None else {}
    current = kept.get("search_files") == SEARCH_FILES_VERSION and not (
        previous is not None and previous.damaged)
    if current and writer.rows_written == writer.rows_deleted == 0:
        # same rows: the search files and thresholds of the previous build still hold
        files = {name: kept[name] for name in SEARCH_FILE_KEYS if name in kept}
        thresholds = Thresholds(**kept["abstention"])
        coverage = float(kept.get("dense_coverage", 1.0))
        how = "kept"
    else:
        files, thresholds, coverage, how = search_files_of(
            index, version, outcome.encoder, plan.model_key, kept, current,
            writer.changes if current else None)
    result = build_stats(stats, outcome.encode, outcome.backend, model, cfg,
                         outcome.write_seconds, writer, previous)
    result["engine"] = outcome.engine
    result["dense_coverage"] = coverage
    result["search_files"] = how
    result["wall_seconds"] = round(time.perf_counter() - started.seconds, 3)
    # the build manifest is hashed afresh (a build that changed no row rewrote it under
    # its name); search files are never rewritten under theirs but by a repair, which
    # records their new hashes, and Lance files never: the previous head's hashes hold
    known = kept.get("checksums", {}) if current else {}
    recorded = checksums(index, [f"manifests/{manifest}"], {}) | checksums(
        index, [f"manifests/{name}" for name in files.values()], known) | checksums(
        index, table_files(index, version), kept.get("checksums", {}))
    index.write_head({
        "format_version": FORMAT_VERSION, "table_version": version, "manifest": manifest,
        "root": str(plan.root), "built_at": now_iso(), "walk_started_ns": started.walk_ns,
        "model": {"name": model.name, "id": model.model_id, "path": str(model.path),
                  "fingerprint": model.fingerprint, "key": model.key, "dim": model.dim,
                  "max_tokens": model.window, "dims": model.dims,
                  "trust_remote_code": model.trust_remote_code},
        "quantization": cfg.quantization,
        "settings": {"fingerprint": settings_fingerprint(cfg, model),
                     "config": dataclasses.asdict(cfg)},
        **files, "search_files": SEARCH_FILES_VERSION, "abstention": thresholds.as_json(),
        "dense_coverage": coverage, "near_duplicates": plan.near_duplicates,
        "files": result["files_indexed"], "chunks": result["chunks_total"], "stats": result,
        "checksums": recorded,
    })
    if committed is not None:
        committed()
    _drop_old(index, writer, {"manifest": manifest, **files}, kept, version)
    heap.trim()
    return result


def _drop_old(index: IndexDir, writer: TableWriter, head: dict[str, str],
              kept: dict[str, Any], version: int) -> None:
    """Drop table versions and manifests that neither ``head`` (the new one) nor readers
    still pinned to ``kept`` (the previous one; but for a purge) can hold."""
    writer.cleanup()
    heads = [head] + ([] if writer.purge else [kept])
    index.prune_manifests(keep={h[key] for h in heads for key in FILE_KEYS if key in h},
                          oldest=min(version, int(kept.get("table_version", version))),
                          min_age_s=0 if writer.purge else 3600)


def search_files_of(index: IndexDir, version: int, encoder: LazyEncoder, model_key: str,
                    previous: dict[str, Any], current: bool,
                    changes: tuple[pa.Table, set[str]] | None,
                    ) -> tuple[dict[str, str], Thresholds, float, str]:
    """The search files of the committed version (``ssindex.index.search_files``),
    abstention thresholds calibrated on its rows, the share of its rows that have a
    vector, and how the files were made. ``changes`` (rows written, ids deleted)
    against the version whose search files ``previous`` names (``current``: in this
    layout) update those; without, the same rows with new vectors take their postings
    (``revectored``); else they are written from the table.

    The nonsense queries' vectors depend on the model alone, so they are kept
    beside the index and a rebuild that embeds nothing never loads the model. An
    index with rows still to embed is calibrated lexically alone: searches do not
    abstain on it (``Searcher``), so a ``--no-embed`` build never loads the model."""
    made = None
    if changes is not None:
        made = update_search_files(index, version, previous, *changes)
        how = "updated" if "delta_snapshot" in made[0] else "merged"
    elif current:
        made, how = revectored_search_files(index, version, previous), "revectored"
    if made is None:
        made, how = write_search_files(index, version), "written"
    files, data, lexicon = made
    stats = TermStats(lexicon.frequency, lexicon.total)
    coverage = dense_coverage(data.column("vec_codes"))
    if coverage < 1.0:
        return files, calibrate(stats, np.zeros((0, encoder.model.dim), np.float32), [],
                                None), coverage, how
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

    def vectors(rows: pa.Table) -> StoredVectors:
        return StoredVectors(rows, encoder.quantization, encoder.model.dim)

    if changes is not None and previous.get("dense_coverage", 1.0) == 1.0:
        written, removed = changes
        thresholds = recalibrate(Thresholds(**previous["abstention"]), stats, vectors(written),
                                 written.column("id").to_pylist(), removed, embed)
        if thresholds is not None:
            return files, thresholds, coverage, how
    return files, calibrate(stats, vectors(data), data.column("id").to_pylist(),
                            embed), coverage, how


def build_stats(stats: RunStats, encode: EncodeStats | None, backend: BackendReport,
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
        "ignore_skipped": dict(sorted(stats.walk.ignore_skipped.items())),
        "secrets_allowed": cfg.walk.allow_secrets,
        "secrets_redacted": sum(entry["secrets_redacted"] for entry in stats.manifest),
        "secrets_redacted_now": dict(sorted(stats.walk.secrets_redacted.items())),
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
        "chunks_windowed": encode.windowed if encode else 0,
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
