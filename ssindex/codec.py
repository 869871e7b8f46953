"""Vector codes <-> float32, for build and search alike.

- ``int8``: symmetric, ``code = round(v / scale)``, ``scale = max|v| / 127``;
  one byte per dimension.
- ``int4``: symmetric in [-7, 7], two codes per byte; half a byte per dimension.
- ``none``: the float32 bytes themselves (scale 1).

Codes are stored as raw bytes so the three kinds share one column layout.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ssindex.config import Quantization
from ssindex.util.arrays import binary_matrix, numeric_view, whole

_LEVELS = {"int8": 127, "int4": 7}


def code_width(method: Quantization, dim: int) -> int:
    """Bytes of one vector's codes."""
    return {"int8": dim, "int4": (dim + 1) // 2, "none": 4 * dim}[method]


def bytes_per_vector(method: Quantization, dim: int) -> int:
    """Stored bytes of one vector: codes plus a float32 scale."""
    return code_width(method, dim) + (0 if method == "none" else 4)


def quantize_matrix(vectors: np.ndarray, method: Quantization) -> tuple[np.ndarray, np.ndarray]:
    """(codes as uint8 rows, float32 scales) for a float32 matrix."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if method == "none":
        return vectors.view(np.uint8).reshape(len(vectors), -1), np.ones(len(vectors), np.float32)
    levels = _LEVELS[method]
    scales = np.abs(vectors).max(axis=1) / levels
    scales = np.where(scales > 0, scales, 1.0).astype(np.float32)
    codes = np.clip(np.rint(vectors / scales[:, None]), -levels, levels).astype(np.int8)
    if method == "int8":
        return codes.view(np.uint8), scales
    if codes.shape[1] % 2:
        codes = np.pad(codes, ((0, 0), (0, 1)))
    nibbles = (codes + 8).astype(np.uint8)
    return (nibbles[:, 0::2] << 4) | nibbles[:, 1::2], scales


def dequantize_matrix(
    codes: np.ndarray, scales: np.ndarray, method: Quantization, dim: int
) -> np.ndarray:
    """float32 vectors back from stored codes (uint8 rows)."""
    if method == "none":
        return _unscaled(codes, method, dim)
    return np.multiply(_unscaled(codes, method, dim), scales[:, None], dtype=np.float32)


def stored_scores(codes: np.ndarray, scales: np.ndarray, method: Quantization, dim: int,
                  vector: np.ndarray) -> np.ndarray:
    """Dot products of the stored vectors with ``vector``: the codes' products, scaled
    after (one multiply per row, not one per component: half the decoding work)."""
    products = row_dots(_unscaled(codes, method, dim), vector)
    return products if method == "none" else products * scales


def row_dots(matrix: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """float32 ``matrix @ vector`` (int8 rows converted as they are read).

    ``einsum``, not ``@``: numpy's OpenBLAS computes a matrix-vector product with its
    own threads, which keep spinning after it returns and take a core from the query
    encoder of the next search (hybrid searches at 100k rows: 13.6 → 11.3 ms; query
    embedding and exact scoring of 6.5k rows: 10.5 → 7.3 ms)."""
    return np.einsum("ij,j->i", matrix, vector, dtype=np.float32, casting="unsafe")


def _unscaled(codes: np.ndarray, method: Quantization, dim: int) -> np.ndarray:
    """The codes as numbers (int8 or float32 rows), before their scales."""
    if method == "none":
        return np.ascontiguousarray(codes).view(np.float32).reshape(len(codes), dim)
    if method == "int8":
        return codes.view(np.int8)
    values = np.empty((len(codes), codes.shape[1] * 2), np.float32)
    values[:, 0::2] = (codes >> 4).astype(np.int8) - 8
    values[:, 1::2] = (codes & 0x0F).astype(np.int8) - 8
    return values[:, :dim]


def positive_mask(codes: np.ndarray, method: Quantization, dim: int) -> np.ndarray:
    """Which components of each stored vector are positive, read from the codes alone
    (scales are positive, so a code's sign is its value's)."""
    if method == "none":
        return np.ascontiguousarray(codes).view(np.float32).reshape(len(codes), dim) > 0
    if method == "int8":
        return codes.view(np.int8) > 0
    positive = np.empty((len(codes), codes.shape[1] * 2), bool)
    positive[:, 0::2], positive[:, 1::2] = (codes >> 4) > 8, (codes & 0x0F) > 8
    return positive[:, :dim]


def stored_vectors(rows: pa.Table, method: str, dim: int) -> np.ndarray:
    """The float32 vectors of rows with ``vec_codes`` and ``vec_scale`` columns (a row
    without a vector reads as zeros)."""
    return StoredVectors(rows, method, dim)[:]


class StoredVectors:
    """The float32 vectors of stored rows, decoded a slice at a time: abstention scores every row
    of a version, and decoding them all at once took the standard library's commit
    ~110 MB (float32) on top of the codes."""

    def __init__(self, rows: pa.Table, method: str, dim: int) -> None:
        self._codes, self._scales = stored_codes(rows, method, dim)
        self._method, self._dim = method, dim

    def __len__(self) -> int:
        return len(self._codes)

    def __getitem__(self, rows: slice) -> np.ndarray:
        return dequantize_matrix(self._codes[rows], self._scales[rows],
                                 self._method, self._dim)  # type: ignore[arg-type]


def stored_codes(rows: pa.Table, method: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``vec_codes`` (uint8 rows) and ``vec_scale`` of ``rows``, as views. Rows that a
    ``--no-embed`` build left without a vector read as zero codes (a copy, then)."""
    codes, scales = rows.column("vec_codes"), rows.column("vec_scale")
    if codes.null_count:
        import pyarrow.compute as pc  # here, not above: searches of whole indexes skip it

        width = code_width(method, dim)  # type: ignore[arg-type]
        codes = pc.fill_null(codes, pa.scalar(bytes(width), pa.binary()))
        scales = pc.fill_null(scales, pa.scalar(0.0, pa.float32()))
    return binary_matrix(whole(codes)), numeric_view(scales, np.float32)


def dense_coverage(codes: pa.Array | pa.ChunkedArray) -> float:
    """Share of the rows whose ``vec_codes`` hold a vector (1.0 for no rows)."""
    return embedded_share(len(codes) - codes.null_count, len(codes))


def embedded_share(embedded: int, rows: int) -> float:
    """``embedded`` of ``rows`` as a coverage (1.0 for no rows): one division, so it equals
    ``embedded / rows`` to the last bit (``1 - nulls / rows`` may not)."""
    return embedded / rows if rows else 1.0


def embedded_mask(rows: pa.Table) -> np.ndarray | None:
    """Which rows have a vector; ``None`` when all do."""
    codes = rows.column("vec_codes")
    if not codes.null_count:
        return None
    return np.concatenate([np.asarray(chunk.is_valid()) for chunk in codes.chunks])
