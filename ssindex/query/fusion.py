"""Fusing the lexical and dense rankings.

Plain reciprocal rank fusion throws the scores away: a chunk the dense leg
is sure about and BM25 ranks 20th loses to chunks both legs find mediocre.
ssindex fuses *normalized scores* convexly, with a weight that depends on
the query: identifier-like queries (``parse_addr``, ``HTTPServer.serve``,
one bare word) lean on the lexical leg, natural-language ones on the dense
leg. RRF remains as the fallback when a leg's scores carry no information
(all equal).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ssindex.text.lexical import names_identifier

RRF_K = 60
LEXICAL_WEIGHT_NATURAL = 0.25
LEXICAL_WEIGHT_IDENTIFIER = 0.6


@dataclass
class Hit:
    row_id: int
    score: float


@dataclass(frozen=True)
class Ranking:
    """Rows best first with their scores: one leg's answer, or a fused one. Arrays, not
    ``Hit`` objects: a hybrid search ranks 200 candidates and keeps ~10 of them."""

    rows: np.ndarray  # int64
    scores: np.ndarray  # float64

    @classmethod
    def of(cls, hits: list[Hit]) -> Ranking:
        return cls(np.fromiter((h.row_id for h in hits), np.int64, len(hits)),
                   np.fromiter((h.score for h in hits), np.float64, len(hits)))

    def __len__(self) -> int:
        return len(self.rows)

    def hits(self, limit: int | None = None) -> list[Hit]:
        return [Hit(row, score) for row, score in zip(self.rows[:limit].tolist(),
                                                      self.scores[:limit].tolist(), strict=True)]


def lexical_weight(query: str) -> float:
    """How much the lexical leg counts for ``query`` (0..1)."""
    if names_identifier(query):
        return LEXICAL_WEIGHT_IDENTIFIER
    return LEXICAL_WEIGHT_NATURAL


def reciprocal_rank_fusion(rankings: list[Ranking], k: int = RRF_K) -> Ranking:
    """Summed ``1 / (k + rank)``; ties keep the order in which rows first appear."""
    rows = np.concatenate([r.rows for r in rankings])
    shares = np.concatenate([1.0 / (k + np.arange(1, len(r) + 1)) for r in rankings])
    return _summed(rows, shares, tie_break="first")


@dataclass(frozen=True)
class Bounds:
    """The score ranges each leg is normalized by: several indexes searched as one share
    them (``ssindex.query.workspace``), so that their fused scores compare."""

    dense: tuple[float, float]
    lexical: tuple[float, float]

    @classmethod
    def over(cls, dense: list[Ranking], lexical: list[Ranking]) -> Bounds:
        """The lowest and highest score of each leg over several rankings."""
        def span(rankings: list[Ranking]) -> tuple[float, float]:
            scores = [r.scores for r in rankings if len(r)]
            if not scores:
                return (0.0, 0.0)
            return (min(float(s.min()) for s in scores), max(float(s.max()) for s in scores))

        return cls(span(dense), span(lexical))


def _normalized(ranking: Ranking, bounds: tuple[float, float] | None = None,
                ) -> np.ndarray | None:
    """Min-max scaled scores in [0, 1] (by ``bounds``, when given, else by the ranking's
    own range); ``None`` when the range is empty."""
    if not len(ranking):
        return ranking.scores
    low, high = bounds or (ranking.scores.min(), ranking.scores.max())
    if high <= low:
        return None
    return (ranking.scores - low) / (high - low)


def fuse(dense: Ranking, lexical: Ranking, lexical_share: float,
         bounds: Bounds | None = None, unembedded: np.ndarray | None = None) -> Ranking:
    """Convex fusion of min-max normalized scores; RRF when a leg is degenerate.

    ``unembedded`` marks (by row) the rows a build has not embedded yet, which the dense
    leg cannot rank: such a lexical candidate counts its lexical score for both legs,
    so it is not buried under rows that both legs score. With no row embedded, the
    fused order is the lexical leg's."""
    dense_n = _normalized(dense, bounds.dense if bounds else None)
    lexical_n = _normalized(lexical, bounds.lexical if bounds else None)
    if dense_n is None or lexical_n is None:
        return reciprocal_rank_fusion([dense, lexical])
    shares = np.full(len(lexical), lexical_share)
    if unembedded is not None:
        shares[unembedded[lexical.rows]] = 1.0
    return _summed(np.concatenate([dense.rows, lexical.rows]),
                   np.concatenate([(1 - lexical_share) * dense_n, shares * lexical_n]),
                   tie_break="row")


def _summed(rows: np.ndarray, shares: np.ndarray, tie_break: str) -> Ranking:
    """Each distinct row with its shares summed, best first; equal sums ordered by row
    id or by first appearance."""
    distinct, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
    sums = np.bincount(inverse, shares, len(distinct))
    order = np.lexsort((distinct if tie_break == "row" else first, -sums))
    return Ranking(distinct[order], sums[order])
