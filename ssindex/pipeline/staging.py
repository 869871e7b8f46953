"""Checkpoints of finished embedding work, so a killed build does not redo it.

Embedded batches are written to ``INDEX/staging/<model key>/`` as Arrow IPC
files (write to temp, fsync, rename: a file is whole or absent), at most one a
``CHECKPOINT_SECONDS``: a killed build redoes at most that much embedding. The
next build reads them back as reusable vectors; a committed build removes them.
Vectors are stored as float32, so a resumed build quantizes exactly as an
uninterrupted one would.
"""

from __future__ import annotations

import itertools
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import xxhash

from ssindex.errors import storage_faults
from ssindex.util.fsio import atomic_write_bytes

CHECKPOINT_SECONDS = 1.0
"""How long embedded batches may wait to be checkpointed together. A file a batch
(two fsyncs, ~4 ms) was ~5% of the driver's time when the CPU side ran without the
model, as it nearly does beside a GPU, which embeds a batch in milliseconds."""
CHECKPOINT_ROWS = 8192
"""Vectors that may wait at most (12 MB at 384 dimensions), however fast they come."""


class Staging:
    def __init__(self, index_path: Path, model_key: str) -> None:
        self.root = Path(index_path) / "staging"
        self.path = self.root / xxhash.xxh3_64_hexdigest(model_key.encode())
        self._counter = itertools.count()
        self._vectors: dict[str, np.ndarray] = {}
        self._waiting: list[tuple[list[str], np.ndarray]] = []
        self._due = 0.0
        """When the waiting batches are checkpointed (``time.monotonic``): the first
        batch is at once."""

    def load(self) -> int:
        """Read checkpoints left by a killed build; returns how many vectors they hold."""
        for file in sorted(self.path.glob("*.arrow")) if self.path.is_dir() else []:
            try:
                with ipc.open_file(str(file)) as reader:
                    table = reader.read_all()
            except (OSError, pa.ArrowInvalid):
                continue  # a torn file cannot exist (atomic rename), but never trust disk
            vectors = np.stack(table.column("vector").to_numpy(zero_copy_only=False))
            self._vectors.update(zip(table.column("embed_key").to_pylist(), vectors,
                                     strict=True))
        self._counter = itertools.count(len(list(self.path.glob("*.arrow")))
                                        if self.path.is_dir() else 0)
        return len(self._vectors)

    def lookup(self, keys: list[str]) -> dict[str, np.ndarray]:
        return {key: self._vectors[key] for key in keys if key in self._vectors}

    def checkpoint(self, keys: list[str], vectors: np.ndarray) -> None:
        """Keep a batch's vectors for a build that would resume this one: on disk now,
        or with the next batches within ``CHECKPOINT_SECONDS``."""
        if keys:
            self._waiting.append((keys, vectors.astype(np.float32)))
        waiting = sum(len(batch_keys) for batch_keys, _ in self._waiting)
        if time.monotonic() >= self._due or waiting >= CHECKPOINT_ROWS:
            self.flush()

    def flush(self) -> None:
        """Checkpoint the batches still waiting."""
        if not self._waiting:
            return
        keys = [key for batch_keys, _ in self._waiting for key in batch_keys]
        vectors = np.concatenate([batch for _, batch in self._waiting])
        self._waiting = []
        self._due = time.monotonic() + CHECKPOINT_SECONDS
        self.path.mkdir(parents=True, exist_ok=True)
        table = pa.table({"embed_key": keys,
                          "vector": pa.FixedSizeListArray.from_arrays(vectors.ravel(),
                                                                      vectors.shape[1])})
        sink = pa.BufferOutputStream()
        with ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        with storage_faults("a checkpoint of embedded vectors", self.path):
            atomic_write_bytes(self.path / f"batch-{next(self._counter):06d}.arrow",
                               sink.getvalue().to_pybytes())

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
