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

from ssindex.lexical import names_identifier

RRF_K = 60
LEXICAL_WEIGHT_NATURAL = 0.15
LEXICAL_WEIGHT_IDENTIFIER = 0.6


@dataclass
class Hit:
    row_id: int
    score: float


def lexical_weight(query: str) -> float:
    """How much the lexical leg counts for ``query`` (0..1)."""
    if names_identifier(query):
        return LEXICAL_WEIGHT_IDENTIFIER
    return LEXICAL_WEIGHT_NATURAL


def reciprocal_rank_fusion(rankings: list[list[Hit]], k: int = RRF_K) -> list[Hit]:
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking):
            scores[hit.row_id] = scores.get(hit.row_id, 0.0) + 1.0 / (k + rank + 1)
    return [Hit(row, score) for row, score in sorted(scores.items(), key=lambda x: -x[1])]


def _normalized(hits: list[Hit]) -> dict[int, float] | None:
    """Min-max scaled scores in [0, 1]; ``None`` when the scores are all equal."""
    if not hits:
        return {}
    scores = [h.score for h in hits]
    low, high = min(scores), max(scores)
    if high <= low:
        return None
    return {h.row_id: (h.score - low) / (high - low) for h in hits}


def fuse(dense: list[Hit], lexical: list[Hit], lexical_share: float) -> list[Hit]:
    """Convex fusion of min-max normalized scores; RRF when a leg is degenerate."""
    dense_n, lexical_n = _normalized(dense), _normalized(lexical)
    if dense_n is None or lexical_n is None:
        return reciprocal_rank_fusion([dense, lexical])
    rows = dense_n.keys() | lexical_n.keys()
    fused = {row: (1 - lexical_share) * dense_n.get(row, 0.0)
             + lexical_share * lexical_n.get(row, 0.0) for row in rows}
    return [Hit(row, score) for row, score in sorted(fused.items(), key=lambda x: (-x[1], x[0]))]
