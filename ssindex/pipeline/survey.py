"""A quick look at a tree before its first build decides how to run it.

The survey chunks a sample of the tree's files and asks the shared vector cache for
their chunks' vectors. Two choices follow from it:

- A progressive first build (``pipeline.publication``) pays for a second pass over every
  file so that search can start before the model has embedded everything. When this
  machine's cache already holds the tree's vectors (a second clone, a git worktree, a
  branch of code built before) nothing is slow to wait for: one pass, with every core
  preparing files, is then the faster build.
- A build committed once knows its size only once it has chunked every file, but
  whether compiling the model repays (``pipeline.encoder.COMPILE_MIN_CHUNKS``) is settled
  when the model loads, at its first batch. The sample's chunks still to embed, scaled
  to the tree, settle it instead.

Files are drawn by their bytes, not their count: chunks are cut to the model's window,
so a file's chunks follow its size, and a few large files hold most of a tree's chunks.
40 files drawn evenly by count put five trees (the standard library, four installed
packages) at 0.70-1.33 of their chunks; 24 draws by bytes put eight at 0.91-1.09, in
0.1-1.0 s. Written here, not taken from a library: it is a dozen lines of sampling with
probability proportional to size.
"""

from __future__ import annotations

import bisect
import itertools
import os
from dataclasses import dataclass
from pathlib import Path

from ssindex.backends.model import ModelSpec
from ssindex.config import BuildConfig
from ssindex.index.cache import VectorCache
from ssindex.stages.chunk import chunk_file
from ssindex.stages.embed import ModelWindow, embed_key
from ssindex.stages.walk import Candidate, WalkStats, discover, read

SAMPLE_DRAWS = 24
"""Byte offsets drawn, evenly spaced over the tree; the files holding them are chunked."""
CACHED_ENOUGH = 0.9
"""Share of the sampled chunks found in the cache above which one pass is faster."""
_LISTED_AT_MOST = 100_000


@dataclass(frozen=True, slots=True)
class Survey:
    """What a sample of a tree's files held."""

    cached_share: float
    """Share of the sampled chunks whose vectors the shared cache holds (0.0: none)."""
    to_embed: int
    """Chunks the build will embed, estimated for the whole tree."""


def survey(root: Path, exclude: Path, cfg: BuildConfig, model: ModelSpec,
           cache: VectorCache | None) -> Survey:
    """Chunk the files that hold ``SAMPLE_DRAWS`` evenly spaced bytes of the tree, and
    look their chunks up in ``cache`` when there is one."""
    listed = list(itertools.islice(discover(root, cfg.walk, WalkStats(), exclude),
                                   _LISTED_AT_MOST))
    sizes = [_size(candidate, cfg.walk.max_file_bytes) for candidate in listed]
    ends = list(itertools.accumulate(sizes))
    total = ends[-1] if ends else 0
    if not total:
        return Survey(0.0, 0)
    drawn = [bisect.bisect_right(ends, (k + 0.5) * total / SAMPLE_DRAWS)
             for k in range(SAMPLE_DRAWS)]
    window = ModelWindow(model, cache.fitting if cache is not None else None)
    keys: dict[int, list[str]] = {}
    for index in sorted(set(drawn)):
        source = read(listed[index], cfg.walk, WalkStats(), {})
        chunks = chunk_file(source, cfg.chunk, window)[0] if source is not None else []
        keys[index] = [embed_key(chunk, model.key) for chunk in chunks]
    every = [key for file_keys in keys.values() for key in file_keys]
    cached: set[str] = set()
    if cache is not None and every:
        cached = set(cache.lookup(every, model.dim, touch=False))
    # each draw stands for the tree's bytes at its file's rate of chunks to embed per byte
    rates = [sum(key not in cached for key in keys[index]) / sizes[index] for index in drawn]
    return Survey(len(cached) / len(every) if every else 0.0,
                  round(total * sum(rates) / SAMPLE_DRAWS))


def _size(candidate: Candidate, max_file_bytes: int) -> int:
    """The bytes a file adds to the tree: none for one the walk would skip for its size,
    or that is gone."""
    try:
        size = os.stat(candidate.path).st_size
    except OSError:
        return 0
    return size if size <= max_file_bytes else 0
