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
    """Attach codes and scales to each batch of chunks. A chunk without a vector
    (``--no-embed``) gets zero codes and a NaN scale, which ``stages.write`` stores as
    no vector."""
    for batch in batches:
        if not batch:
            continue
        present = [row.vector for row in batch if row.vector is not None]
        if len(present) == len(batch):
            yield batch, *quantize_matrix(np.stack(present), method)
            continue
        missing = np.array([row.vector is None for row in batch])
        if not present:
            yield batch, np.zeros((len(batch), 0), np.uint8), np.full(len(batch), np.nan,
                                                                      np.float32)
            continue
        vectors = np.zeros((len(batch), len(present[0])), np.float32)
        vectors[~missing] = np.stack(present)
        codes, scales = quantize_matrix(vectors, method)
        scales[missing] = np.nan
        yield batch, codes, scales
