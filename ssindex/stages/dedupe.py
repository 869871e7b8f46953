"""Dedupe: exact (normalized content hash) and near duplicates (MinHash-LSH).

Chunks arrive in path order, so the first chunk of a duplicate group (the one
with the smallest path and line) becomes its exemplar; later members record
``dup_of`` and reuse the exemplar's vector instead of being embedded.

Near duplicates: MinHash over word shingles, LSH banding from datasketch, and
each LSH candidate confirmed by its estimated Jaccard similarity, so a
banding false positive never marks a chunk as a duplicate.

State grows with the number of exemplars (one hash entry and one MinHash
signature each, about 1 KiB at 128 permutations): 1M chunks cost about 1 GiB.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import xxhash
from datasketch import MinHash, MinHashLSH

from ssindex.config import DedupeConfig
from ssindex.rows import Chunk, IndexedChunk

_WORD = re.compile(r"\w+")


@dataclass(slots=True)
class DedupeStats:
    exact: int = 0
    near: int = 0


def _hash32(data: bytes) -> int:
    return xxhash.xxh32_intdigest(data)


class Deduper:
    """Streaming duplicate finder; feed chunks in a stable order."""

    def __init__(self, cfg: DedupeConfig) -> None:
        self._cfg = cfg
        self._exact: dict[str, str] = {}
        self._lsh = MinHashLSH(threshold=cfg.near_threshold, num_perm=cfg.num_perm)
        self._signatures: dict[str, MinHash] = {}

    def signature(self, text: str) -> MinHash | None:
        """MinHash of the word shingles of ``text``; ``None`` when too short to compare."""
        words = _WORD.findall(text.lower())
        if len(words) < self._cfg.min_tokens:
            return None
        size = self._cfg.shingle_size
        shingles = {" ".join(words[i : i + size]).encode() for i in range(len(words) - size + 1)}
        minhash = MinHash(num_perm=self._cfg.num_perm, hashfunc=_hash32)
        minhash.update_batch(list(shingles))
        return minhash

    def classify(self, chunk: Chunk) -> tuple[str | None, bool]:
        """(exemplar id or ``None``, whether the match is near rather than exact)."""
        exemplar = self._exact.get(chunk.content_hash)
        if exemplar is not None:
            return exemplar, False
        self._exact[chunk.content_hash] = chunk.id
        minhash = self.signature(chunk.text)
        if minhash is None:
            return None, False
        best: tuple[float, str] | None = None
        for candidate in self._lsh.query(minhash):
            similarity = minhash.jaccard(self._signatures[candidate])
            if similarity >= self._cfg.near_threshold and (best is None or similarity > best[0]):
                best = (similarity, candidate)
        if best is not None:
            self._exact[chunk.content_hash] = best[1]
            return best[1], True
        self._lsh.insert(chunk.id, minhash, check_duplication=False)
        self._signatures[chunk.id] = minhash
        return None, False


def dedupe(
    batches: Iterable[list[Chunk]], cfg: DedupeConfig, stats: DedupeStats
) -> Iterator[list[IndexedChunk]]:
    """Mark each chunk's ``dup_of``; exemplars pass through with ``dup_of = None``."""
    deduper = Deduper(cfg)
    for batch in batches:
        out = []
        for chunk in batch:
            exemplar, near = deduper.classify(chunk)
            if exemplar is not None:
                if near:
                    stats.near += 1
                else:
                    stats.exact += 1
            out.append(IndexedChunk(chunk, dup_of=exemplar))
        yield out
