"""MinHash signatures of chunk texts, and the LSH band keys dedupe buckets them by.

Signatures are MinHashes over word 3-shingles with datasketch's permutations and hash
scheme; band keys hash each band of a batch's signatures in one numpy expression.
"""

from __future__ import annotations

import re

import numpy as np
import xxhash

from ssindex.config import DedupeConfig

_WORD = re.compile(r"\w+")
_MAX_HASH = (1 << 32) - 1
_MIX = np.array([0x9E3779B97F4A7C15 * (i + 1) % 2**64 for i in range(64)], dtype=np.uint64)


def rows_per_band(threshold: float, num_perm: int) -> int:
    """Band height whose LSH S-curve turns at ``threshold - 0.2``: high recall at the
    threshold, with every candidate verified afterwards."""
    target = max(threshold - 0.2, 0.05)
    return min(range(1, 17), key=lambda r: abs((1 / (num_perm // r)) ** (1 / r) - target))


class Signer:
    """MinHash signatures (uint32 rows) of chunk texts, with shared permutations.

    datasketch's permutations and hash scheme (affine32: each shingle's 32-bit hash
    mixed by the MurmurHash3 finalizer, then ``a * h + b`` mod 2**32), applied here to
    many texts at once: ``MinHash.update_batch`` ran a handful of numpy calls per chunk,
    which took 45% of signing the standard library. Tests hold the signatures equal to
    datasketch's."""

    BLOCK = 1 << 14
    """Shingles permuted in one numpy expression (8 MB of uint32 work at 128 permutations)."""

    def __init__(self, cfg: DedupeConfig) -> None:
        self._cfg = cfg
        self._a, self._b = affine_permutations(cfg.num_perm)
        self._unset = np.full(cfg.num_perm, _MAX_HASH, np.uint32).tobytes()
        """The signature of no shingles (fewer words than a shingle), datasketch's."""

    def __call__(self, texts: list[str]) -> list[bytes | None]:
        """Each text's signature as bytes; ``None`` for texts too short to compare."""
        signatures: list[bytes | None] = [None] * len(texts)
        rows: list[int] = []
        hashes: list[int] = []
        starts: list[int] = []
        for row, text in enumerate(texts):
            shingles = self._shingles(text)
            if shingles is None:
                continue
            if not shingles:
                signatures[row] = self._unset
                continue
            if hashes and len(hashes) + len(shingles) > self.BLOCK:
                self._minima(rows, hashes, starts, signatures)
                rows, hashes, starts = [], [], []
            rows.append(row)
            starts.append(len(hashes))
            hashes.extend(shingles)
        if rows:
            self._minima(rows, hashes, starts, signatures)
        return signatures

    def _shingles(self, text: str) -> set[int] | None:
        """The 32-bit hashes of the text's word shingles; ``None`` below ``min_tokens``."""
        words = _WORD.findall(text.lower())
        if len(words) < self._cfg.min_tokens:
            return None
        shifted = (words[at:] for at in range(self._cfg.shingle_size))
        joined = map(" ".join, zip(*shifted, strict=False))  # stops at the last whole one
        return set(map(xxhash.xxh32_intdigest, map(str.encode, joined)))

    def _minima(self, rows: list[int], hashes: list[int], starts: list[int],
                signatures: list[bytes | None]) -> None:
        mixed = _fmix32(np.asarray(hashes, np.uint32))
        with np.errstate(over="ignore"):
            # a permutation a row, so that each text's minima reduce contiguous runs:
            # than a shingle a row, 1.8x as fast on one file's chunks, 14x on a full block
            permuted = np.multiply(self._a[:, None], mixed)
            permuted += self._b[:, None]  # in place: one pass fewer over the largest array
        minima = np.minimum.reduceat(permuted, starts, axis=1).T.copy()
        for row, signature in zip(rows, minima, strict=True):
            signatures[row] = signature.tobytes()


def affine_permutations(num_perm: int) -> tuple[np.ndarray, np.ndarray]:
    """datasketch's affine32 permutations, ``a * h + b`` mod 2**32 (those of
    ``MinHash(num_perm, scheme="affine32")``): odd ``a``, then ``b``, drawn from numpy's
    legacy generator with datasketch's default seed. Drawn here rather than read off a
    ``MinHash``: importing datasketch imports scipy, ~0.35 s of the start of every
    process that signs chunks (each worker's, the driver's). Tests hold them equal to
    datasketch's, which tests alone import."""
    draw = np.random.RandomState(1)
    odd = draw.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    return odd, draw.randint(0, 1 << 32, num_perm, dtype=np.uint32)


def _fmix32(values: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer, elementwise (wrapping uint32 arithmetic)."""
    with np.errstate(over="ignore"):
        values = values ^ (values >> np.uint32(16))
        values = values * np.uint32(0x85EBCA6B)
        values = values ^ (values >> np.uint32(13))
        values = values * np.uint32(0xC2B2AE35)
        return values ^ (values >> np.uint32(16))


def band_keys(signatures: np.ndarray, rows_per_band: int = 8) -> np.ndarray:
    """(n, bands) uint64 keys; equal keys mean equal signature bands."""
    n, perms = signatures.shape
    bands = perms // rows_per_band
    rows = signatures[:, : bands * rows_per_band].reshape(n, bands, rows_per_band)
    keys = np.zeros((n, bands), np.uint64)
    with np.errstate(over="ignore"):
        # one row of each band at a time: 5x faster than a (n, bands, rows) product
        # summed (this runs over every stored chunk of an incremental build)
        for row in range(rows_per_band):
            keys += rows[:, :, row].astype(np.uint64) * _MIX[row]
        keys ^= np.arange(bands, dtype=np.uint64) * np.uint64(0xD6E8FEB86659FD93)
    return keys
