"""The local engine's CPU side: read, chunk and prepare files, in worker processes.

Everything a build works out from one file alone happens here: reading it (secrets
redacted), chunking it, and for each chunk its MinHash signature, lexical terms,
embed key, tokens and the digest of its stored fields. With one worker that runs in
the producer thread; with more, blocks of files go to a pool of processes (the GIL
would serialize threads: most of this is Python). Results come back in path order,
through a window of blocks in flight, so memory is bounded and the index is the
one-worker index, row for row.
What needs every chunk so far stays in the driver: dedupe verdicts, embedding,
writing.

Workers start through ``forkserver``: the driver holds threads (LanceDB's, the
tokenizer's) that a plain ``fork`` would copy in an unknown state. They ignore
SIGINT, so Ctrl-C reaches the driver alone, which shuts the pool down; a worker whose
driver is killed notices within half a second and exits.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, replace
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path, PurePosixPath
from typing import NamedTuple

import xxhash

from ssindex.backends.model import ModelSpec
from ssindex.config import BuildConfig
from ssindex.errors import WorkerLost
from ssindex.index.cache import VectorCache
from ssindex.index.layout import fixed_digest
from ssindex.records import Chunk, IndexedChunk, SourceFile
from ssindex.stages.chunk import CHUNKER_VERSION, chunk_file, replay
from ssindex.stages.embed import ModelWindow, embed_key
from ssindex.stages.lines import text_rows
from ssindex.stages.signature import Signer
from ssindex.stages.walk import Candidate, WalkStats, read
from ssindex.stages.write import fixed_fields, lexical_terms
from ssindex.util.cores import usable_cores

FILES_PER_BLOCK = 16
"""Files per task: large enough that the hand-off costs little against chunking them."""
BLOCKS_PER_WORKER = 4
"""Blocks in flight per worker: enough to keep every worker busy, few enough to bound
memory."""
DRIVER_WATCH_SECONDS = 0.5
"""How often a worker checks that its driver still lives."""
EXIT_GRACE_SECONDS = 5.0
"""How long a shut-down pool's workers get to exit before they are killed: an idle
worker exits within milliseconds of its stop sentinel, a busy one after its block."""


class Prepared(NamedTuple):
    """A file read and chunked, its chunks prepared (``None`` source: skipped)."""

    source: SourceFile | None
    chunker: str
    rows: list[IndexedChunk]
    cut: tuple[str, str | None] | None = None
    """The file's cuts for the shared cache: their key, and their JSON when made here
    (``None``: replayed from the cache)."""


@dataclass(frozen=True)
class Preparation:
    """What a worker needs to prepare files as the build would."""

    config: BuildConfig
    model: ModelSpec
    model_key: str
    tokenize: bool = True
    """Whether prepared chunks keep their tokens: not for a build that embeds nothing
    (``--no-embed``)."""
    cache_path: Path | None = None
    """The shared vector cache: chunks it knows to fit the window are not tokenized."""
    sign: bool = True
    """Whether chunks get MinHash signatures (``BuildPlan.near_duplicates``)."""


class Preparer:
    """Prepares files one at a time (in a worker, or in the producer thread).

    The chunker tokenizes every chunk to fit it to the model's window
    (``stages.lines.Window``); the chunks keep those tokens for the embed stage."""

    def __init__(self, preparation: Preparation) -> None:
        self._preparation = preparation
        self._sign = Signer(preparation.config.dedupe) if preparation.sign else None
        self._cache = None if preparation.cache_path is None else VectorCache(
            0, preparation.cache_path, readonly=True)
        self._window = ModelWindow(preparation.model,
                                   self._cache.fitting if self._cache else None)
        # what every file's cut key starts with: the chunker's code and settings, the window
        self._cut_settings = json.dumps([CHUNKER_VERSION, preparation.model_key,
                                         asdict(preparation.config.chunk)], sort_keys=True)

    def __call__(self, candidate: Candidate, stats: WalkStats) -> Prepared:
        cfg = self._preparation.config
        source = read(candidate, cfg.walk, stats, {})
        if source is None:
            return Prepared(None, "", [])
        chunks, chunker, cut = self._chunks(source)
        signatures = self._sign([c.text for c in chunks]) if self._sign else [None] * len(chunks)
        model_key = self._preparation.model_key
        rows = [IndexedChunk(c, signature=signature, terms=lexical_terms(c),
                             key=embed_key(c, model_key))
                for c, signature in zip(chunks, signatures, strict=True)]
        for row in rows:
            row.digest = fixed_digest(fixed_fields(row, model_key))
        if self._preparation.tokenize and rows:  # measured by the chunker: not tokenized again
            for row, tokens in zip(rows, self._window.tokens(chunks, text_rows(source.text)),
                                          strict=True):
                row.tokens = tokens
        # the text lives on in the chunks; the driver needs only the file's stamp
        return Prepared(replace(source, text=""), chunker, rows, cut)

    def _chunks(self, source: SourceFile) -> tuple[list[Chunk], str,
                                                   tuple[str, str | None] | None]:
        """The file's chunks and chunker, replayed from the cuts the shared cache holds
        for its text and settings when it has them: parsing files and fitting their
        chunks to the window took two thirds of a build whose vectors the cache held (a
        second worktree). Cuts that do not fit the text are not trusted."""
        cfg = self._preparation.config
        if self._cache is None:
            return (*chunk_file(source, cfg.chunk, self._window), None)
        key = self._cut_key(source)
        recorded = self._cache.cuts(key)
        if recorded is not None:
            try:
                chunker, cuts = json.loads(recorded)
                chunks = replay(source, [(int(a), int(b), str(c), str(d))
                                         for a, b, c, d in cuts])
            except (ValueError, TypeError):
                chunks = None
            if chunks is not None:
                return chunks, str(chunker), (key, None)
        chunks, chunker = chunk_file(source, cfg.chunk, self._window)
        cuts = [(c.start_line, c.end_line, c.symbol, c.kind) for c in chunks]
        return chunks, chunker, (key, json.dumps([chunker, cuts]))

    def _cut_key(self, source: SourceFile) -> str:
        """What a file's cuts depend on: the chunker's code and settings, the model's
        window, the file's language, name (a module's chunks are named for it) and text."""
        digest = xxhash.xxh3_128()
        for part in (self._cut_settings, source.language or "",
                     PurePosixPath(source.path).stem, source.text):
            digest.update(part.encode("utf-8", "surrogatepass") + b"\0")
        return digest.hexdigest()


def default_workers(gpu: bool, embeds: bool = True) -> int:
    """Nearly every core when a GPU embeds; one (the producer thread) when the model
    needs the cores itself: there the CPU side is under 1% of a build. Every core when
    nothing is embedded (``--no-embed``, a progressive build's lexical pass): the CPU
    side is then the whole build."""
    cores = usable_cores()
    if not embeds:
        return cores
    return max(1, cores - 1) if gpu else 1


def prepared(candidates: Iterable[Candidate], preparation: Preparation, workers: int,
             stats: WalkStats) -> Iterator[Prepared]:
    """Every candidate prepared, in order; ``workers`` > 1 runs a process pool."""
    if workers <= 1:
        preparer = Preparer(preparation)
        for candidate in candidates:
            yield preparer(candidate, stats)
        return
    context = multiprocessing.get_context("forkserver")
    others = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_start,
                               initargs=(preparation, os.getpid()))
    window: deque[tuple[list[Candidate], Future[tuple[list[Prepared], WalkStats]]]] = deque()
    try:
        for block in _blocks(candidates, FILES_PER_BLOCK):
            try:
                window.append((block, pool.submit(_prepare_block, block)))
            except BrokenProcessPool as exc:  # a worker died before its block came back
                raise _lost(window[0][0] if window else block) from exc
            if len(window) >= workers * BLOCKS_PER_WORKER:
                yield from _collect(*window.popleft(), stats)
        while window:
            yield from _collect(*window.popleft(), stats)
    finally:
        _close(pool, others)


def _close(pool: ProcessPoolExecutor, others: set[BaseProcess]) -> None:
    """Shut the pool down, killing workers that do not exit within the grace period.

    A worker killed while it waits for a task dies holding the task queue's lock. While
    the pool runs, the executor sees the death and ends every worker; once it is shutting
    down it no longer looks, and waits forever for the dead worker's partner, which waits
    for that lock instead of its stop sentinel (seen on CPython 3.11, in CI). By then
    every file is back, or the build is failing anyway."""
    pool.shutdown(wait=False, cancel_futures=True)
    running = [p for p in multiprocessing.active_children() if p not in others]
    deadline = time.monotonic() + EXIT_GRACE_SECONDS
    while running and (left := deadline - time.monotonic()) > 0:
        exited = set(wait([worker.sentinel for worker in running], left))
        running = [worker for worker in running if worker.sentinel not in exited]
    for worker in running:
        worker.kill()
    pool.shutdown(wait=True)


def _collect(block: list[Candidate], future: Future[tuple[list[Prepared], WalkStats]],
             stats: WalkStats) -> list[Prepared]:
    try:
        files, counted = future.result()
    except BrokenProcessPool as exc:
        raise _lost(block) from exc
    stats.add(counted)
    return files


def _lost(block: list[Candidate]) -> WorkerLost:
    return WorkerLost(
        f"a worker process died (killed, out of memory or crashed) while the files "
        f"from {block[0].rel} on were read and chunked; nothing was committed. "
        f"--workers 1 does the same work in the build's own process")


def _blocks(candidates: Iterable[Candidate], size: int) -> Iterator[list[Candidate]]:
    block: list[Candidate] = []
    for candidate in candidates:
        block.append(candidate)
        if len(block) == size:
            yield block
            block = []
    if block:
        yield block


_preparer: Preparer | None = None


def _start(preparation: Preparation, driver: int) -> None:
    """A worker's start: Ctrl-C is the driver's to handle, the driver's death ends it,
    and the chunker's state is loaded once."""
    global _preparer
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_outlive, args=(driver,), daemon=True,
                     name="ssindex-driver-watch").start()
    _preparer = Preparer(preparation)


def _outlive(driver: int) -> None:
    """Exit once the driver is gone. A killed driver closes no pipe a worker would see:
    each worker holds both ends of its own task queue, so it would wait forever."""
    while True:
        time.sleep(DRIVER_WATCH_SECONDS)
        try:
            os.kill(driver, 0)
        except ProcessLookupError:
            os._exit(1)


def _prepare_block(block: list[Candidate]) -> tuple[list[Prepared], WalkStats]:
    assert _preparer is not None, "worker started without its initializer"
    stats = WalkStats()
    return [_preparer(candidate, stats) for candidate in block], stats
