from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from ssindex.codec import (
    bytes_per_vector,
    dequantize_matrix,
    positive_mask,
    quantize_matrix,
    stored_scores,
)
from ssindex.stages.embed import Exemplars
from ssindex.util.arrays import binary_matrix, binary_rows


@pytest.mark.parametrize(("method", "min_cosine"), [("none", 0.999999), ("int8", 0.999),
                                                    ("int4", 0.95)])
def test_roundtrip_preserves_direction(method: str, min_cosine: float) -> None:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(200, 383)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    codes, scales = quantize_matrix(vectors, method)  # type: ignore[arg-type]
    assert codes.dtype == np.uint8
    assert codes.shape[1] + (0 if method == "none" else 4) == bytes_per_vector(method, 383)  # type: ignore[arg-type]
    restored = dequantize_matrix(codes, scales, method, 383)  # type: ignore[arg-type]
    cosines = (restored * vectors).sum(1) / np.linalg.norm(restored, axis=1)
    assert cosines.min() >= min_cosine


def test_requantizing_dequantized_codes_is_exact() -> None:
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(50, 384)).astype(np.float32)
    for method in ("int8", "int4"):
        codes, scales = quantize_matrix(vectors, method)  # type: ignore[arg-type]
        again = quantize_matrix(dequantize_matrix(codes, scales, method, 384), method)  # type: ignore[arg-type]
        assert np.array_equal(again[0], codes) and np.allclose(again[1], scales)


@pytest.mark.parametrize("method", ["int8", "int4", "none"])
def test_a_duplicate_takes_its_exemplars_codes(method: str) -> None:
    """The embed stage keeps exemplars as codes (``Exemplars``); a duplicate's decoded
    vector stores as the exemplar's own codes, its scale within an ulp."""
    rng = np.random.default_rng(2)
    vectors = rng.normal(size=(500, 383)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = [f"c{i}" for i in range(len(vectors))]
    exemplars = Exemplars(method)  # type: ignore[arg-type]
    for start, end in ((0, 1), (1, 200), (200, 500)):  # kept a batch at a time
        exemplars.keep(ids[start:end], list(vectors[start:end]))
    exemplars.keep(["none"], [None])
    assert exemplars.vector("none") is None
    copied = np.stack([exemplars.vector(i) for i in ids])
    codes, scales = quantize_matrix(vectors, method)  # type: ignore[arg-type]
    again, again_scales = quantize_matrix(copied, method)  # type: ignore[arg-type]
    assert np.array_equal(again, codes)
    assert np.allclose(again_scales, scales, rtol=2**-22, atol=0)


def test_zero_vector_does_not_divide_by_zero() -> None:
    codes, scales = quantize_matrix(np.zeros((1, 8), np.float32), "int8")
    assert np.all(np.isfinite(dequantize_matrix(codes, scales, "int8", 8)))


@pytest.mark.parametrize("method", ["none", "int8", "int4"])
@pytest.mark.parametrize("dim", [384, 383])
def test_signs_read_from_codes_match_the_dequantized_vectors(method: str, dim: int) -> None:
    vectors = np.random.default_rng(3).standard_normal((50, dim)).astype(np.float32)
    codes, scales = quantize_matrix(vectors, method)  # type: ignore[arg-type]
    expected = dequantize_matrix(codes, scales, method, dim) > 0  # type: ignore[arg-type]
    assert np.array_equal(positive_mask(codes, method, dim), expected)  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["none", "int8", "int4"])
def test_scores_from_codes_equal_the_dequantized_products(method: str) -> None:
    rng = np.random.default_rng(4)
    vectors = rng.standard_normal((300, 383)).astype(np.float32)
    query = rng.standard_normal(383).astype(np.float32)
    codes, scales = quantize_matrix(vectors, method)  # type: ignore[arg-type]
    scores = stored_scores(codes, scales, method, 383, query)  # type: ignore[arg-type]
    expected = dequantize_matrix(codes, scales, method, 383) @ query  # type: ignore[arg-type]
    assert scores.dtype == np.float32
    assert np.allclose(scores, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", ["none", "int8", "int4"])
def test_codes_stored_as_binary_rows_read_back_with_their_nulls(method: str) -> None:
    rng = np.random.default_rng(1)
    codes, _ = quantize_matrix(rng.normal(size=(37, 383)).astype(np.float32), method)  # type: ignore[arg-type]
    present = rng.random(37) < 0.6
    column = binary_rows(codes[present], present)
    assert column.to_pylist() == [row.tobytes() if keep else None
                                  for row, keep in zip(codes, present, strict=True)]
    assert np.array_equal(binary_matrix(column.filter(pa.array(present))), codes[present])
