"""Why a hybrid result scored as it did (``ssindex search --explain``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ssindex.query.fusion import Ranking


@dataclass
class Explanation:
    """Why a result scored as it did: its fused score, the factors and additive terms
    applied, in the order ``ssindex.query.ranking`` applies them."""

    fused: float
    factors: dict[str, float] = field(default_factory=dict)
    added: dict[str, float] = field(default_factory=dict)
    """Additive terms, applied after the factors."""

    def as_json(self, dense: Ranking, lexical: Ranking, row: int) -> dict[str, object]:
        def leg(ranking: Ranking) -> float | None:
            found = np.flatnonzero(ranking.rows == row)
            return round(float(ranking.scores[found[0]]), 6) if len(found) else None

        return {"dense": leg(dense), "lexical": leg(lexical), "fused": round(self.fused, 6),
                "factors": {name: round(value, 4) for name, value in self.factors.items()},
                "added": {name: round(value, 6) for name, value in self.added.items()}}
