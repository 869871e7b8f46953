"""Quantize: float32 unit vectors → compact codes with a per-vector scale.

- ``int8``: symmetric, ``code = round(v / scale)``, ``scale = max|v| / 127``;
  one byte per dimension.
- ``int4``: symmetric in [-7, 7], two codes per byte; half a byte per dimension.
- ``none``: the float32 bytes themselves (scale 1).

Codes are stored as raw bytes so the three kinds share one column layout.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from ssindex.codec import quantize_matrix
from ssindex.config import Quantization
from ssindex.records import IndexedChunk


def quantize(
    batches: Iterable[list[IndexedChunk]], method: Quantization
) -> Iterator[tuple[list[IndexedChunk], np.ndarray, np.ndarray]]:
    """Attach codes and scales to each batch of chunks; a chunk without a vector
    (``--no-embed``) gets a row of zero codes that ``stages.write`` stores as none."""
    for batch in batches:
        if not batch:
            continue
        present = [row.vector for row in batch if row.vector is not None]
        if len(present) == len(batch):
            yield batch, *quantize_matrix(np.stack(present), method)
            continue
        dims = {len(row.vector) for row in batch if row.vector is not None}
        vectors = np.zeros((len(batch), dims.pop() if dims else 0), np.float32)
        for position, row in enumerate(batch):
            if row.vector is not None:
                vectors[position] = row.vector
        if not vectors.shape[1]:
            yield batch, np.zeros((len(batch), 0), np.uint8), np.ones(len(batch), np.float32)
            continue
        yield batch, *quantize_matrix(vectors, method)
