"""Arrow columns as numpy views, without copies (and without pyarrow's pandas import)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ssindex.errors import IndexCorrupt


def whole(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A column as one array: its only chunk as it is (``combine_chunks`` copies even
    that one, and so reads every page of a mapped file: the standard library's postings,
    ~80 MB, as a search process opened them)."""
    if isinstance(array, pa.Array):
        return array
    return array.chunk(0) if array.num_chunks == 1 else array.combine_chunks()


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


def binary_rows(values: np.ndarray, present: np.ndarray) -> pa.Array:
    """``binary_matrix`` reversed: a binary column with one value for each True of
    ``present`` (the rows of ``values``, uint8, in order) and a null for each False,
    built from one buffer rather than a bytes object a row."""
    offsets = np.zeros(len(present) + 1, np.int32)
    np.cumsum(present * values.shape[1], out=offsets[1:])
    validity = np.packbits(present, bitorder="little")
    return pa.Array.from_buffers(pa.binary(), len(present), [
        pa.py_buffer(validity), pa.py_buffer(offsets),
        pa.py_buffer(np.ascontiguousarray(values))], null_count=len(present) - len(values))


def numeric_view(array: pa.Array | pa.ChunkedArray, dtype: type[np.generic]) -> np.ndarray:
    """A null-free, fixed-width Arrow array as a numpy view.

    Not ``to_numpy``: pyarrow's conversions import pandas where it is installed,
    ~0.5 s of a cold search that never needs it."""
    array = whole(array)
    if len(array) == 0:
        return np.zeros(0, dtype)
    if array.null_count:
        raise IndexCorrupt(f"unexpected nulls in a stored {array.type} column")
    return np.frombuffer(array.buffers()[1], dtype)[array.offset : array.offset + len(array)]


def flags(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean Arrow array (bit-packed) as a numpy bool array; nulls read as False."""
    array = whole(array)
    if len(array) == 0:
        return np.zeros(0, bool)
    validity, values = array.buffers()[:2]
    start, end = array.offset, array.offset + len(array)

    def bits(buffer: pa.Buffer) -> np.ndarray:
        return np.unpackbits(np.frombuffer(buffer, np.uint8), bitorder="little")[start:end]

    marks = bits(values).astype(bool)
    return marks & bits(validity).astype(bool) if validity is not None else marks


def distinct(column: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, np.ndarray]:
    """``column``'s distinct values (null among them, as a value) and each row's index
    into them: a dictionary encoding."""
    import pyarrow.compute as pc  # here, not above: a search without filters never needs it

    encoded = whole(pc.dictionary_encode(column, null_encoding="encode"))
    return encoded.dictionary, numeric_view(encoded.indices, np.int32)


def best_first(scores: np.ndarray, limit: int) -> np.ndarray:
    """Indices of the ``limit`` highest ``scores``, best first, equal scores by index: the
    same answer every time, where ``argpartition`` picks among ties at the cut at random."""
    top = np.arange(len(scores))
    if len(scores) > limit > 0:
        cut = np.partition(scores, len(scores) - limit)[len(scores) - limit]
        above = np.flatnonzero(scores > cut)
        top = np.concatenate([above, np.flatnonzero(scores == cut)[: limit - len(above)]])
    elif limit <= 0:
        top = top[:0]
    return top[np.lexsort((top, -scores[top]))]
