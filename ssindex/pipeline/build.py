"""``build``: plan a run, execute it on an engine, commit it atomically."""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ssindex.backends.inventory import detect
from ssindex.backends.model import ModelSpec
from ssindex.config import BuildConfig
from ssindex.errors import ConfigError, IndexCorrupt, IndexNotWritable
from ssindex.index.activity import Activity
from ssindex.index.cache import VectorCache, enabled_by_environment
from ssindex.index.layout import IndexDir, default_index_path
from ssindex.index.lock import BuildLock
from ssindex.index.remote import RemoteIndex, is_remote, resolve_index
from ssindex.index.table import TableWriter
from ssindex.pipeline.commit import Outcome, Started, commit
from ssindex.pipeline.encoder import EncoderPool, LazyEncoder
from ssindex.pipeline.engines.common import RunStats
from ssindex.pipeline.engines.local import run_local
from ssindex.pipeline.engines.pool import default_workers
from ssindex.pipeline.fingerprint import settings_fingerprint
from ssindex.pipeline.placement import check_placement, moved_note
from ssindex.pipeline.plan import BuildPlan, RayOptions
from ssindex.pipeline.previous import PreviousIndex, stale_reasons
from ssindex.pipeline.progress import Progress, SilentProgress, Tracked
from ssindex.pipeline.publication import Publisher
from ssindex.pipeline.staging import Staging
from ssindex.pipeline.survey import CACHED_ENOUGH, survey
from ssindex.stages.walk import WalkStats, check_root, discover, walk
from ssindex.util import heap


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
    previous = _previous(index, cfg, cfg.embed.model_spec(), SilentProgress())
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
    no_embed: bool = False,
    warm: Warm | None = None,
    committed: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Index ``root`` into ``index_path`` (default ``root/.ssindex``); returns build stats.

    ``ray`` runs the stages on a Ray cluster instead of this process
    (``engines.ray_driver``). ``index_path`` may be an object-store URI
    (``s3://bucket/prefix``): the build runs against a local mirror, then uploads it
    (``ssindex.index.remote``). ``no_embed`` builds a lexical index and loads no
    model: new chunks get no vector (stored ones are kept) until a later build. ``warm``
    keeps the encoders and the shared vector cache open across the builds of one
    long-lived process (``ssindex watch``); ``committed`` is called as soon as a version
    is committed, before older ones are cleaned up (a server reopens on it)."""
    if no_embed and ray is not None:
        raise ConfigError("--no-embed is the local engine's: Ray builds embed on actors")
    heap.limit_arenas()
    if index_path is not None and is_remote(index_path):
        remote = RemoteIndex(str(index_path))
        result = build(root, remote.pull(for_commit=True), config, backend_overrides,
                       progress, ray, no_embed, warm, committed)
        remote.push()
        return result | {"index": remote.uri}
    started = Started()
    cfg = config or BuildConfig()
    progress = progress or SilentProgress()
    explicit = (dict(cfg.backends) | (backend_overrides or {})).get("embed_bulk")
    root = check_root(Path(root))
    index = IndexDir(Path(index_path) if index_path else default_index_path(root))
    check_placement(index.path, root)
    index.ensure_writable()
    with _cluster(ray), BuildLock(index.path, warn=progress.message):
        activity = Activity(index.path)
        cache = None
        if ray is None:
            cache = warm.cache(cfg, progress) if warm is not None else shared_cache(cfg, progress)
        try:
            job = _Job(root, index, cfg, cfg.embed.model_spec(), explicit,
                       Tracked(progress, activity), ray, cache,
                       warm.encoders if warm is not None else None, committed)
            return _progressive(job, no_embed, activity, started)
        finally:
            activity.close()
            if cache is not None and warm is None:
                cache.close()


def shared_cache(cfg: BuildConfig, progress: Progress) -> VectorCache | None:
    """This machine's shared vector cache, unless the config or ``SSINDEX_SHARED_CACHE``
    turns it off (the Ray engine's actors do not use it)."""
    if not (cfg.cache.shared and enabled_by_environment()):
        return None
    return VectorCache(cfg.cache.max_mb, warn=progress.message)


class Warm:
    """What one long-lived process keeps open across its builds: loaded encoders and
    the shared vector cache (``ssindex watch``, ``ssindex serve --watch``)."""

    def __init__(self) -> None:
        self.encoders = EncoderPool()
        self._cache: VectorCache | None = None
        self._cache_opened = False

    def cache(self, cfg: BuildConfig, progress: Progress) -> VectorCache | None:
        if not self._cache_opened:
            self._cache, self._cache_opened = shared_cache(cfg, progress), True
        return self._cache

    def close(self) -> None:
        if self._cache is not None:
            self._cache.close()


@dataclass(frozen=True)
class _Job:
    """What every commit of one ``build`` call shares."""

    root: Path
    index: IndexDir
    cfg: BuildConfig
    model: ModelSpec
    explicit: str | None
    progress: Progress
    ray: RayOptions | None
    cache: VectorCache | None
    encoders: EncoderPool | None
    committed: Callable[[], None] | None


def _progressive(job: _Job, no_embed: bool, activity: Activity, started: Started,
                 ) -> dict[str, Any]:
    """The build's commits: for a progressive first build, a lexical version first, then
    partial versions as it embeds (``pipeline.publication``), then the finished one."""
    previous = _previous(job.index, job.cfg, job.model, job.progress)
    if previous is not None and (note := moved_note(previous.head.data["root"], job.root)):
        job.progress.message(note)
    progressive = job.cfg.commit.progressive and not no_embed and job.ray is None
    first: dict[str, Any] | None = None
    first_build = not no_embed and job.ray is None and previous is None and _many_files(job)
    # whether the shared cache holds most of the tree's vectors (then one pass with every
    # core preparing files beats a progressive build's two), and what one pass will embed
    looked = survey(job.root, job.index.path, job.cfg, job.model, job.cache) \
        if first_build and (job.cache is not None or not progressive) else None
    cached = looked is not None and looked.cached_share >= CACHED_ENOUGH
    if first_build and progressive and not cached:
        first = _commit_once(job, None, True, started, None, near=False)
        job.progress.restart(f"searchable now: lexical version of {first['chunks_total']} "
                             f"chunks in {first['wall_seconds']:.1f} s; embedding them next")
        previous = _previous(job.index, job.cfg, job.model, job.progress)
    # a pass after the lexical version knows what is left to embed; one pass, the survey
    expected = looked.to_embed if looked is not None and first is None else \
        _unembedded(previous, no_embed)
    if previous is not None:
        activity.expect(int(previous.head.data["chunks"]),
                        "building" if no_embed else "embedding")
    publisher = None
    if progressive and previous is not None and previous.dense_coverage < 1.0 and \
            previous.chunks_reusable:
        publisher = Publisher(job.index, previous, job.cfg.commit.every_seconds,
                              job.cfg.commit.every_chunks)
    result = _commit_once(job, previous, no_embed, Started(), publisher, expected,
                          every_core=cached)
    if publisher is not None:
        publisher.finish()
    if first is not None:  # counted against the lexical version: against none, all is new
        result["files_new"] += first["files_new"] - result["files_removed"]
        result.update(files_changed=0, files_removed=0, files_unchanged=0)
    result["wall_seconds"] = round(time.perf_counter() - started.seconds, 3)
    result["first_commit_seconds"] = first["wall_seconds"] if first else (
        result["wall_seconds"])
    result["partial_commits"] = publisher.commits if publisher is not None else 0
    result["chunks_from_cache"] = job.cache.stats.hits if job.cache is not None else 0
    result["files_cut_from_cache"] = job.cache.stats.replayed if job.cache is not None else 0
    return result


def _many_files(job: _Job) -> bool:
    """Whether the tree has ``commit.min_files`` files to index (listed, not read)."""
    listed = discover(job.root, job.cfg.walk, WalkStats(), job.index.path)
    return sum(1 for _ in itertools.islice(listed, job.cfg.commit.min_files)) \
        >= job.cfg.commit.min_files


def _commit_once(job: _Job, previous: PreviousIndex | None, no_embed: bool, started: Started,
                 publisher: Publisher | None, expected: int = 0, every_core: bool = False,
                 near: bool = True) -> dict[str, Any]:
    """Run the stages once and commit what they made; ``expected``: chunks it will embed
    (``LazyEncoder.expected``); ``every_core`` prepares files on every core even though a
    model runs (it will embed little); ``near``: dedupe finds near duplicates
    (``BuildPlan.near_duplicates``)."""
    # rows left without a vector make this build a rebuild (vectors reused by key),
    # written anew: it then equals a build that never left any; so does a version
    # whose near duplicates were never looked for
    diffed = previous is not None and bool(previous.head.data.get("near_duplicates", True)) \
        and (no_embed or previous.dense_coverage == 1.0)
    plan, encoder, staging = _plan(job, previous, diffed, no_embed, publisher, expected,
                                   every_core, near)
    writer = TableWriter(job.index, previous.head if previous and diffed else None,
                         purge=previous is not None and _secrets_tightened(previous, job.cfg))
    try:
        outcome = _execute(plan, encoder, writer, previous, job.explicit, job.model,
                           job.progress, job.ray)
    except KeyboardInterrupt:
        # Ctrl-C keeps every vector embedded so far for the next build, where the disk
        # lets it: a disk too full for them must not turn the interrupt into its error
        with contextlib.suppress(IndexNotWritable, OSError):
            staging.flush()
        raise
    result = commit(job.index, plan, outcome, writer, previous, job.model, started,
                    job.committed)
    staging.clear()
    return result | {"index": str(job.index.path), "table_version": outcome.version}


def _unembedded(previous: PreviousIndex | None, no_embed: bool) -> int:
    """Chunks of the previous index still to embed (a progressive build's second pass)."""
    if previous is None or no_embed:
        return 0
    return round(int(previous.head.data["chunks"]) * (1.0 - previous.dense_coverage))


def _plan(job: _Job, previous: PreviousIndex | None, diffed: bool, no_embed: bool,
          publisher: Publisher | None, expected: int, every_core: bool = False,
          near: bool = True) -> tuple[BuildPlan, LazyEncoder, Staging]:
    """The build's plan, its encoder, and the staging area its checkpoints go to;
    ``diffed``: the build carries the previous index's chunks where it can."""
    cfg, model, explicit, ray = job.cfg, job.model, job.explicit, job.ray
    reusable = previous if previous is not None and diffed and previous.chunks_reusable \
        else None
    # under Ray the actors embed; this process only embeds abstention probes, on the
    # query backend, and the actors' hardware may not be this machine's
    encoder = LazyEncoder(model, cfg, None if ray else explicit, job.progress,
                          incremental=ray is not None or reusable is not None,
                          embeds=not no_embed, expected=expected,
                          pool=job.encoders)
    if explicit and not ray and not no_embed:
        encoder.load_ahead()  # and one that cannot run fails before a row is written
    model_key = model.key
    staging = Staging(job.index.path, model_key)
    if job.cache is not None:
        job.cache.ready()  # its tables exist before worker processes read them
    if staging.load():
        job.progress.message("resuming: reusing vectors checkpointed by an interrupted build")

    # a lexical pass stays lexical: it neither reads nor fills the cache (a version with
    # every vector would need the model to calibrate abstention)
    cache = None if no_embed else job.cache

    def reuse(keys: list[str]) -> dict[str, np.ndarray]:
        found = previous.vectors(keys) if previous else {}
        found |= staging.lookup([key for key in keys if key not in found])
        if cache is not None and len(found) < len(keys):
            found |= cache.lookup([key for key in keys if key not in found], model.dim)
        return found

    def checkpoint(keys: list[str], vectors: np.ndarray) -> None:
        staging.checkpoint(keys, vectors)
        if cache is not None:
            cache.store(keys, vectors)
        if publisher is not None:
            publisher.add(keys, vectors)

    if publisher is not None:
        publisher.seed(staging)
    plan = BuildPlan(job.root, job.index.path, cfg, encoder, model, model_key, reuse, reusable,
                     checkpoint=checkpoint,
                     fitted=None if cache is None else cache.store_fits,
                     cache_path=None if job.cache is None else job.cache.path,
                     cut=None if job.cache is None else job.cache.store_cuts,
                     on_change=None if no_embed else encoder.prepare,
                     workers=cfg.workers or default_workers(_gpu_embeds(explicit),
                                                            embeds=not (no_embed or
                                                                        every_core)),
                     embeds=not no_embed, near_duplicates=near,
                     call_chunks=encoder.call_chunks)
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
    version = writer.write(_loaded_first(run_local(plan, stats, progress), encoder),
                           previous.digests if previous and writer.previous else {},
                           stats.row_ids)
    write_seconds = time.perf_counter() - write_started - stats.clock.inclusive.get(
        "quantize", 0.0)
    return Outcome("local", version, stats, encoder.report(),
                   encoder.stats if encoder.selection is not None else None, encoder,
                   write_seconds)


def _loaded_first(batches: Iterator[pa.RecordBatch], encoder: LazyEncoder,
                  ) -> Iterator[pa.RecordBatch]:
    """``batches``, the load ``load_ahead`` started finished before the first is handed
    on: an explicit backend that cannot run fails before a row is written, even where no
    chunk needs it."""
    first = next(batches, None)
    encoder.settle_ahead()
    if first is not None:
        yield first
        yield from batches


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
