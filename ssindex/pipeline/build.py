"""``build``: plan a run, execute it on an engine, commit it atomically."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from ssindex.backends.inventory import detect
from ssindex.backends.model import ModelSpec
from ssindex.config import BuildConfig
from ssindex.errors import IndexCorrupt
from ssindex.index.layout import (
    IndexDir,
    default_index_path,
)
from ssindex.index.lock import BuildLock
from ssindex.index.remote import RemoteIndex, is_remote, resolve_index
from ssindex.index.table import TableWriter
from ssindex.pipeline.commit import Outcome, Started, commit
from ssindex.pipeline.encoder import LazyEncoder
from ssindex.pipeline.engines.common import RunStats
from ssindex.pipeline.engines.local import run_local
from ssindex.pipeline.engines.pool import default_workers
from ssindex.pipeline.fingerprint import settings_fingerprint
from ssindex.pipeline.plan import BuildPlan, RayOptions
from ssindex.pipeline.previous import PreviousIndex, stale_reasons
from ssindex.pipeline.progress import Progress, SilentProgress
from ssindex.pipeline.staging import Staging
from ssindex.stages.walk import WalkStats, check_root, walk


def _previous(index: IndexDir, cfg: BuildConfig, model: ModelSpec,
              progress: Progress) -> PreviousIndex | None:
    if not index.exists():
        return None
    try:
        head = index.read_head()
        previous = PreviousIndex.load(index, head, settings_fingerprint(cfg, model),
                                      cfg.quantization, cfg.walk)
    except (IndexCorrupt, OSError, KeyError, ValueError) as exc:
        progress.message(f"previous index unreadable, rebuilding from scratch: {exc}")
        return None
    if previous.damaged:
        progress.message(f"repairing damaged files of the previous index: "
                         f"{', '.join(previous.damaged)}")
    return previous


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

    ``ray`` runs the stages on a Ray cluster instead of this process
    (``engines.ray_driver``). ``index_path`` may be an object-store URI
    (``s3://bucket/prefix``): the build runs against a local mirror, then uploads it
    (``ssindex.index.remote``)."""
    if index_path is not None and is_remote(index_path):
        remote = RemoteIndex(str(index_path))
        result = build(root, remote.pull(for_commit=True), config, backend_overrides,
                       progress, ray)
        remote.push()
        return result | {"index": remote.uri}
    started = Started()
    cfg = config or BuildConfig()
    progress = progress or SilentProgress()
    explicit = (dict(cfg.backends) | (backend_overrides or {})).get("embed_bulk")
    root = check_root(Path(root))
    index = IndexDir(Path(index_path) if index_path else default_index_path(root))
    index.ensure_writable()
    with _cluster(ray), BuildLock(index.path, warn=progress.message):
        model = ModelSpec.resolve(cfg.embed.model)
        previous = _previous(index, cfg, model, progress)
        plan, encoder, staging = _plan(root, index, cfg, model, previous, explicit, progress,
                                       ray)
        writer = TableWriter(index, previous.head if previous else None,
                             purge=previous is not None and _secrets_tightened(previous, cfg))
        outcome = _execute(plan, encoder, writer, previous, explicit, model, progress, ray)
        result = commit(index, plan, outcome, writer, previous, model, started)
        staging.clear()
    return result | {"index": str(index.path), "table_version": outcome.version}


def _plan(root: Path, index: IndexDir, cfg: BuildConfig, model: ModelSpec,
          previous: PreviousIndex | None, explicit: str | None, progress: Progress,
          ray: RayOptions | None) -> tuple[BuildPlan, LazyEncoder, Staging]:
    """The build's plan, its encoder, and the staging area its checkpoints go to."""
    reusable = previous if previous is not None and previous.chunks_reusable else None
    # under Ray the actors embed; this process only embeds abstention probes, on the
    # query backend, and the actors' hardware may not be this machine's
    encoder = LazyEncoder(model, cfg, None if ray else explicit, progress,
                          incremental=ray is not None or reusable is not None)
    if explicit and not ray:
        encoder.load()  # an explicit backend that cannot run fails before any work
    model_key = f"{model.fingerprint}:{cfg.embed.max_tokens}"
    staging = Staging(index.path, model_key)
    if staging.load():
        progress.message("resuming: reusing vectors checkpointed by an interrupted build")

    def reuse(keys: list[str]) -> dict[str, np.ndarray]:
        found = previous.vectors(keys) if previous else {}
        return found | staging.lookup([key for key in keys if key not in found])

    plan = BuildPlan(root, index.path, cfg, encoder, model, model_key, reuse, reusable,
                     checkpoint=staging.checkpoint, on_change=encoder.prepare,
                     workers=cfg.workers or default_workers(_gpu_embeds(explicit)))
    return plan, encoder, staging


def _execute(plan: BuildPlan, encoder: LazyEncoder, writer: TableWriter,
             previous: PreviousIndex | None,
             explicit: str | None, model: ModelSpec, progress: Progress,
             ray: RayOptions | None) -> Outcome:
    """Run the plan on its engine; the table version it committed and what ran it."""
    stats = RunStats()
    if ray is not None:
        from ssindex.pipeline.engines.ray_driver import run_ray

        version, backend, encode = run_ray(plan, stats, progress, writer, previous, explicit,
                                           model, ray)
        return Outcome("ray", version, stats, backend, encode, encoder,
                       stats.clock.inclusive["write"])
    write_started = time.perf_counter()
    version = writer.write(run_local(plan, stats, progress),
                           previous.digests if previous and writer.previous else {},
                           stats.row_ids)
    write_seconds = time.perf_counter() - write_started - stats.clock.inclusive.get(
        "quantize", 0.0)
    return Outcome("local", version, stats, encoder.report(),
                   encoder.stats if encoder.selection is not None else None, encoder,
                   write_seconds)


def _gpu_embeds(explicit: str | None) -> bool:
    """Whether a GPU will embed: the backend asked for, else any GPU the driver lists
    (read without importing torch)."""
    if explicit is not None:
        return any(device in explicit for device in ("cuda", "mps", "coreml"))
    return bool(detect(with_torch=False).cuda_devices)


def _secrets_tightened(previous: PreviousIndex, cfg: BuildConfig) -> bool:
    """Whether the previous index was built with ``allow_secrets`` and this build is
    not: then no byte of its versions may stay behind."""
    walk = previous.head.data["settings"]["config"].get("walk", {})
    return bool(walk.get("allow_secrets")) and not cfg.walk.allow_secrets


def _cluster(ray: RayOptions | None) -> contextlib.AbstractContextManager[Any]:
    """The Ray cluster of a Ray build, joined before LanceDB starts its threads (Ray forks
    helper processes); nothing for a local build."""
    if ray is None:
        return contextlib.nullcontext()
    from ssindex.pipeline.engines.ray_driver import ray_cluster

    return ray_cluster(ray)
