"""The local engine: the stages as chained iterators, in two threads.

Walk, chunk and dedupe run in a producer thread and hand batches over a
bounded queue, so parsing overlaps the embedding forward passes (which
release the GIL) while memory stays bounded by the queue depth. A clean build
reads, chunks and prepares its files in ``engines.pool``: in that thread, or in
worker processes (``workers``).

An incremental build chunks only new and changed files; the chunks of
unchanged ones stay in the store as ids, and only those whose dedupe verdict
a change can reach travel on (``stages.dedupe.dedupe_changes``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import pyarrow as pa

from ssindex.pipeline.engines.common import RunStats, manifest_entry
from ssindex.pipeline.engines.pool import Preparation, prepared
from ssindex.pipeline.plan import BuildPlan
from ssindex.pipeline.progress import Progress
from ssindex.records import IndexedChunk, SourceFile, StoredChunks
from ssindex.stages.chunk import chunk
from ssindex.stages.dedupe import Changes, dedupe, dedupe_changes
from ssindex.stages.embed import ModelWindow, embed
from ssindex.stages.quantize import quantize
from ssindex.stages.walk import Candidate, discover, reread, walk
from ssindex.stages.write import to_record_batch

T = TypeVar("T")
_DONE = object()
CUTS_PER_WRITE = 256
"""Files whose cuts go to the shared cache in one transaction."""


def _chunk_ids(manifest: list[dict[str, Any]]) -> list[str]:
    """Every chunk id of the manifest's files, in path order."""
    return [i for entry in manifest for i in entry["chunk_ids"]]


def _rebatch(lists: Iterable[list[T]], size: int) -> Iterator[list[T]]:
    pending: list[T] = []
    for items in lists:
        pending.extend(items)
        while len(pending) >= size:
            yield pending[:size]
            pending = pending[size:]
    if pending:
        yield pending


def _prefetch(items: Iterator[T], depth: int) -> Iterator[T]:
    """Run ``items`` in a daemon thread; re-raise its error in the consumer."""
    buffer: queue.Queue[Any] = queue.Queue(maxsize=depth)
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            for item in items:
                buffer.put(item)
        except BaseException as exc:  # handed to the consumer thread, raised there
            failure.append(exc)
        finally:
            buffer.put(_DONE)

    threading.Thread(target=produce, daemon=True, name="ssindex-producer").start()
    while (item := buffer.get()) is not _DONE:
        yield item
    if failure:
        raise failure[0]


def run_local(plan: BuildPlan, stats: RunStats, progress: Progress) -> Iterator[pa.RecordBatch]:
    """Yield record batches of the new or changed rows of the index, in path order."""
    clock = stats.clock
    progress.advance(_counted(plan), 0)
    handed = clock.timed("wait", _prefetch(_produce(plan, stats, progress), depth=8), None)
    encoder = plan.encoder if plan.embeds else None
    embedded = clock.timed("embed", embed(handed, encoder, plan.model_key, stats.embed,
                                          plan.reuse, plan.checkpoint, plan.fitted,
                                          plan.config.quantization, plan.call_chunks),
                           "wait")
    for batch, codes, scales in clock.timed("quantize", quantize(embedded,
                                                                 plan.config.quantization),
                                            "embed"):
        progress.advance(_counted(plan), len(batch))
        record_batch = to_record_batch(batch, codes, scales, plan.model_key)
        if record_batch is not None:
            yield record_batch


def _counted(plan: BuildPlan) -> str:
    """The stage whose progress a row past the embed stage counts for: a pass that embeds
    nothing (``--no-embed``, a progressive build's lexical version) writes its rows, and
    reporting them as embedded showed a lexical pass "embedding" at 1,400 chunks/s."""
    return "embed" if plan.embeds else "write"


def _produce(plan: BuildPlan, stats: RunStats, progress: Progress,
             ) -> Iterator[list[IndexedChunk]]:
    """Walk, chunk and dedupe (the producer thread's part): batches of chunks to embed."""
    clock, cfg, previous = stats.clock, plan.config, plan.previous

    def track_files(files: Iterable[SourceFile]) -> Iterator[SourceFile]:
        for source in files:
            progress.advance("walk")
            yield source

    def track_chunks(per_file: Iterable[tuple[SourceFile, list[IndexedChunk]]],
                     ) -> Iterator[list[IndexedChunk]]:
        for source, rows in per_file:
            stats.manifest.append(manifest_entry(source, [row.chunk.id for row in rows]))
            progress.advance("chunk", len(rows))
            yield rows

    if previous is None:
        candidates = clock.timed("walk", discover(plan.root, cfg.walk, stats.walk,
                                                  plan.index_path), None)
        per_file = clock.timed("chunk", _chunked(plan, candidates, stats, progress), "walk")
        batches = _rebatch(track_chunks(per_file), plan.batch_chunks)
        yield from clock.timed("dedupe", dedupe(batches, cfg.dedupe, stats.dedupe,
                                                plan.near_duplicates), "chunk")
        stats.row_ids.update(_chunk_ids(stats.manifest))
        return
    files = clock.timed("walk", track_files(walk(
        plan.root, cfg.walk, stats.walk, plan.index_path, previous.known)), None)
    per_file = clock.timed("chunk", chunk(_carry(plan, files, previous, stats, progress),
                                          cfg.chunk, stats.chunk, ModelWindow(plan.model)),
                           "walk")

    def replay() -> Iterator[Changes]:
        fresh = [row for rows in track_chunks(per_file) for row in rows]
        order = _chunk_ids(stats.manifest)
        stats.row_ids.update(order)
        yield dedupe_changes(fresh, order, cfg.dedupe, stats.dedupe, previous)

    replayed, settled = next(clock.timed("dedupe", replay(), "chunk"))
    stats.embed.reused += settled
    progress.advance(_counted(plan), stats.chunk.chunks - len(replayed))
    yield from _rebatch([replayed], plan.batch_chunks)


def _chunked(plan: BuildPlan, candidates: Iterable[Candidate], stats: RunStats,
             progress: Progress) -> Iterator[tuple[SourceFile, list[IndexedChunk]]]:
    """A clean build's files read, chunked and prepared (``engines.pool``)."""
    preparation = Preparation(plan.config, plan.model, plan.model_key, tokenize=plan.embeds,
                              cache_path=plan.cache_path, sign=plan.near_duplicates)
    cuts: dict[str, str | None] = {}
    for source, chunker, rows, cut in prepared(candidates, preparation, plan.workers,
                                               stats.walk):
        progress.advance("walk")
        if cut is not None and plan.cut is not None:
            cuts[cut[0]] = cut[1]
            if len(cuts) >= CUTS_PER_WRITE:
                plan.cut(cuts)
                cuts = {}
        if source is None:
            continue
        stats.chunk.count(chunker, len(rows))
        yield source, rows
    if cuts and plan.cut is not None:
        plan.cut(cuts)


def _carry(plan: BuildPlan, files: Iterable[SourceFile], previous: StoredChunks,
           stats: RunStats, progress: Progress) -> Iterator[SourceFile]:
    """The files to chunk; unchanged ones are only recorded, with their stored chunk ids."""
    for source in files:
        ids = previous.carried(source)
        if ids is None:
            if plan.on_change is not None:
                plan.on_change()
            read = reread(plan.root, source, plan.config.walk, stats.walk)
            if read is not None:
                yield read
            continue
        stats.chunk.files += 1
        stats.chunk.files_unchanged += 1
        stats.chunk.chunks += len(ids)
        stats.manifest.append(manifest_entry(source, ids))
        progress.advance("chunk", len(ids))
