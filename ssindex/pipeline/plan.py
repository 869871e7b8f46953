"""The build as data: which stages run, in which order, with which settings.

Both engines (``engines.local``, ``engines.ray_driver``) read one ``BuildPlan`` and
turn it into execution; stages never import an engine. The Ray engine reads the
plan's tree, settings, model key and previous chunks; its actors embed with their
own encoders and find reusable vectors in the previous table themselves, so
``encoder``, ``reuse`` and ``checkpoint`` serve the local engine alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ssindex.backends.model import ModelSpec
from ssindex.config import BuildConfig
from ssindex.records import StoredChunks
from ssindex.stages.embed import TextEncoder

STAGES: tuple[str, ...] = ("walk", "chunk", "dedupe", "embed", "quantize", "write")


@dataclass(frozen=True)
class BuildPlan:
    root: Path
    index_path: Path
    config: BuildConfig
    encoder: TextEncoder
    model: ModelSpec
    """The model: its tokenizer prepares chunks ahead of the embed stage."""
    model_key: str
    """Model content hash and token limit: the part of a vector's identity outside its text."""
    reuse: Callable[[list[str]], dict[str, np.ndarray]] | None
    """Vectors the previous index holds, by embed key."""
    previous: StoredChunks | None
    """The previous version's chunks when its chunker and dedupe settings (and so its
    vectors) are this build's: unchanged files keep them, and dedupe replays only
    what the changes reach."""
    checkpoint: Callable[[list[str], np.ndarray], None] | None = None
    """Receives freshly embedded vectors as they are made."""
    fitted: Callable[[list[str]], None] | None = None
    """Receives the embed keys of chunks measured to fit the model's window."""
    cache_path: Path | None = None
    """The shared vector cache, whose record of what fits spares the chunker tokenizing."""
    cut: Callable[[dict[str, str | None]], None] | None = None
    """Receives files' cuts by key (``engines.pool.Prepared.cut``) for the shared cache."""
    on_change: Callable[[], None] | None = None
    """Called when an incremental build meets each new or changed file."""
    batch_chunks: int = 256
    """Chunks per batch between dedupe and write."""
    call_chunks: int = 0
    """Chunks the embed stage hands the encoder at once, in whole batches (0: a batch at a
    time; ``pipeline.encoder.LARGE_CALL_CHUNKS`` in a large build)."""
    workers: int = 1
    """Processes of the CPU side (``engines.pool``); 1 is the producer thread."""
    embeds: bool = True
    """Whether chunks without a stored vector are embedded; ``False`` (``--no-embed``)
    leaves them without one and never loads the model."""
    near_duplicates: bool = True
    """Whether dedupe finds near duplicates (MinHash-LSH) besides exact ones. Not in a
    progressive build's lexical pass: its version is searched lexically alone and then
    replaced, and a near-duplicate verdict only decides which rows share a vector."""


@dataclass(frozen=True)
class RayOptions:
    address: str | None = None
    """An existing cluster (``ray://host:10001``, ``auto``); ``None`` starts a local one."""
    embed_actors: int | None = None
    """Embedding actors; default: one per GPU, else one per two CPUs."""
    gpus_per_actor: float | None = None
    """GPUs each actor holds; default: 1 when the cluster has GPUs, else CPU actors."""
    files_per_block: int = 64
    """Files per chunking task: the unit Ray schedules, retries and shuffles."""
    rows_per_embed_batch: int = 256
