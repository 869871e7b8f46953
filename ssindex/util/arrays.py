"""Arrow columns as numpy views, without copies (and without pyarrow's pandas import)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ssindex.errors import IndexCorrupt


def binary_matrix(column: pa.Array) -> np.ndarray:
    """Equal-length binary values as one (rows, width) uint8 matrix, without copies per row."""
    if len(column) == 0:
        return np.zeros((0, 0), np.uint8)
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int32)[column.offset :][: len(column) + 1]
    width = int(offsets[1] - offsets[0])
    if not np.all(np.diff(offsets) == width):
        raise IndexCorrupt("stored vectors have mixed sizes")
    data = np.frombuffer(column.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
    return data.reshape(len(column), width)


def numeric_view(array: pa.Array | pa.ChunkedArray, dtype: type[np.generic]) -> np.ndarray:
    """A null-free, fixed-width Arrow array as a numpy view.

    Not ``to_numpy``: pyarrow's conversions import pandas where it is installed,
    ~0.5 s of a cold search that never needs it."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if len(array) == 0:
        return np.zeros(0, dtype)
    if array.null_count:
        raise IndexCorrupt(f"unexpected nulls in a stored {array.type} column")
    return np.frombuffer(array.buffers()[1], dtype)[array.offset : array.offset + len(array)]
