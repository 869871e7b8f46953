"""Abstention: knowing when an index has nothing to say about a query.

A query is answered when it is *lexically grounded* (the summed IDF of its
terms that occur in the corpus reaches ``lexical``) or *semantically
confident* (its best cosine reaches ``semantic``); otherwise the search
abstains. IDF comes from term collection frequencies over the analyzed chunk
text, counted with the BM25 postings and stored in them.

Thresholds are calibrated per index at build time against queries of random
pseudo-words, which no corpus should answer. The semantic threshold sits just
above the best cosine any of them reaches. The lexical one sits above both
what they reach and the IDF of the rarest possible term: a pseudo-word that
happens to spell one real word (``gate``) is not grounding, while real
queries, which share several words with the corpus, clear it easily (on
CoSQA the least grounded of 500 real queries sums to 18.9, one rare term at
most 12.6).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import cache
from typing import Any, Protocol

import numpy as np

from ssindex.text.lexical import query_terms

CALIBRATION_QUERIES = 200
BLOCK = 8192
"""Rows scored at a time against the nonsense queries (a 200 x 8,192 float32 block)."""
_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "gl",
           "kr", "pl", "st", "tr", "sk", "fl", "dr", "sn"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou", "ee", "oa"]
_CODAS = ["", "", "n", "r", "x", "th", "sk", "m", "nd"]


@dataclass(frozen=True)
class Thresholds:
    lexical: float
    semantic: float
    nearest: str | None = None
    """Id of the row that a nonsense query came closest to (what ``semantic`` rests on)."""
    nearest_cosine: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TermStats:
    """Collection frequencies of the index's terms (over body and name, ``sym:`` tokens
    included), as the BM25 postings count them (``postings.Lexicon``)."""

    frequency: Callable[[str], int]
    """Occurrences of a term in the index (0: none)."""
    occurrences: int
    """Of every term."""

    @property
    def total(self) -> int:
        return max(self.occurrences, 1)

    def grounding(self, query: str) -> float:
        """Summed IDF of the query's distinct terms that occur in the corpus."""
        found = (self.frequency(t) for t in set(query_terms(query).split()))
        return sum(math.log(1 + self.total / count) for count in found if count)


def nonsense_queries(count: int, seed: int) -> list[str]:
    """Queries of pronounceable random pseudo-words (``"plouvex draith"``)."""
    rng = random.Random(seed)

    def word() -> str:
        return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                       for _ in range(rng.randint(2, 3)))

    return [" ".join(word() for _ in range(rng.randint(1, 4))) for _ in range(count)]


@cache
def _calibration_queries() -> tuple[str, ...]:
    """The nonsense queries both thresholds are calibrated on (made once per process)."""
    return tuple(nonsense_queries(CALIBRATION_QUERIES, seed=0))


class Rows(Protocol):
    """Row vectors to score: an array, or ``codec.StoredVectors`` decoding them lazily."""

    def __len__(self) -> int: ...

    def __getitem__(self, rows: slice) -> np.ndarray: ...


def calibrate(stats: TermStats, matrix: Rows, ids: Sequence[str], embed: Any) -> Thresholds:
    """Thresholds just above what nonsense queries reach on this index (rows ``ids``,
    their vectors ``matrix``)."""
    return _thresholds(stats, *_nearest(matrix, ids, embed))


def recalibrate(previous: Thresholds, stats: TermStats, written: Rows,
                written_ids: Sequence[str], removed: set[str], embed: Any) -> Thresholds | None:
    """``calibrate`` for an index that differs from the previous one by rows ``written``
    (new or replaced) and ids ``removed``, from the new rows alone; ``None`` when the
    row the semantic threshold rests on is gone (then ``calibrate`` must see every row).
    A one-file rebuild of the standard library spent ~0.5 s scoring all 62k vectors."""
    if previous.nearest is None or previous.nearest in removed or previous.nearest in set(
            written_ids):
        return None
    nearest, cosine = _nearest(written, written_ids, embed)
    if cosine <= previous.nearest_cosine:
        nearest, cosine = previous.nearest, previous.nearest_cosine
    return _thresholds(stats, nearest, cosine)


def _nearest(matrix: Rows, ids: Sequence[str], embed: Any) -> tuple[str | None, float]:
    """The row a nonsense query comes closest to (the first, on a tie), and that cosine;
    the rows are read ``BLOCK`` at a time."""
    if not len(matrix):
        return None, 0.0
    queries = np.asarray(embed(list(_calibration_queries())))
    nearest, best = 0, -math.inf
    for start in range(0, len(matrix), BLOCK):
        closest = (queries @ matrix[start:start + BLOCK].T).max(axis=0)
        row = int(np.argmax(closest))
        if closest[row] > best:
            nearest, best = start + row, float(closest[row])
    return ids[nearest], best


def _thresholds(stats: TermStats, nearest: str | None, cosine: float) -> Thresholds:
    lexical = [stats.grounding(q) for q in _calibration_queries()]
    rarest_term = math.log(1 + stats.total)
    return Thresholds(lexical=round(max(float(np.percentile(lexical, 99.5)), rarest_term)
                                    + 0.01, 4),
                      semantic=round(cosine + 0.01, 4), nearest=nearest, nearest_cosine=cosine)
