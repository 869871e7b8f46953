"""A quick look at a tree before its first build decides how to run it.

A progressive first build (``pipeline.publication``) pays for a second pass over every
file so that search can start before the model has embedded everything. When this
machine's shared vector cache already holds the tree's vectors (a second clone, a git
worktree, a branch of code built before) nothing is slow to wait for: one pass, with
every core preparing files, is then the faster build. The survey chunks an even sample
of the tree's files and asks the cache for their chunks' vectors.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from ssindex.backends.model import ModelSpec
from ssindex.config import BuildConfig
from ssindex.index.cache import VectorCache
from ssindex.stages.chunk import chunk_file
from ssindex.stages.embed import ModelWindow, embed_key
from ssindex.stages.walk import WalkStats, discover, read

SAMPLE_FILES = 40
CACHED_ENOUGH = 0.9
"""Share of the sampled chunks found in the cache above which one pass is faster."""
_LISTED_AT_MOST = 100_000


def cached_share(root: Path, exclude: Path, cfg: BuildConfig, model: ModelSpec,
                 cache: VectorCache) -> float:
    """Share of the chunks of ``SAMPLE_FILES`` files spread over the tree whose vectors
    the cache holds (0.0 when the sample has no chunk)."""
    listed = list(itertools.islice(discover(root, cfg.walk, WalkStats(), exclude),
                                   _LISTED_AT_MOST))
    step = max(1, len(listed) // SAMPLE_FILES)
    window = ModelWindow(model, cache.fitting)
    keys: list[str] = []
    for candidate in listed[::step][:SAMPLE_FILES]:
        source = read(candidate, cfg.walk, WalkStats(), {})
        if source is not None:
            chunks, _ = chunk_file(source, cfg.chunk, window)
            keys += [embed_key(chunk, model.key) for chunk in chunks]
    if not keys:
        return 0.0
    return len(cache.lookup(keys, model.dim, touch=False)) / len(keys)
