"""Several indexes searched as one: ``ssindex search --index A --index B``, or a
workspace file that lists them.

Each index ranks its own candidates, but the scores must compare across indexes. A
leg's scores do: the indexes share one model, so cosines are on one scale, and BM25
scores are close enough to one (their idf differ by collection, not by kind). Fused
scores would not: each index normalizes its legs by its own range, which makes every
index's best hit score ~1 however poor it is. So the legs run in every index first,
each leg is normalized over the union of all indexes' candidates (``Bounds``), and
only then does each index fuse and rank, its file evidence scaled by the best over all
indexes (``Evidence``) for the same reason; the merged top ``k`` is taken by score.

A workspace file is TOML:

    indexes = ["../api/.ssindex", "../web/.ssindex", "s3://bucket/shared-lib"]

Relative paths are relative to the file.
"""

from __future__ import annotations

import os
import time
import tomllib
from pathlib import Path
from typing import Any

from ssindex.errors import ConfigError
from ssindex.query.filters import Filters
from ssindex.query.fusion import Bounds, fuse, lexical_weight
from ssindex.query.ranking import Evidence
from ssindex.query.searcher import Legs, Ranked, Searcher, SearchResponse, check_request

SETTINGS = ("model.fingerprint", "model.key", "model.max_tokens", "model.dim", "quantization",
            "settings.config.chunk")
"""What indexes searched together must share, from each one's ``HEAD.json``: their
vectors and scores compare only then (the walk's settings may differ by repository)."""


def workspace_indexes(path: Path) -> list[str]:
    """The indexes a workspace file lists, relative ones made relative to the file."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read the workspace file {path}: {exc}") from exc
    listed = data.get("indexes")
    if not isinstance(listed, list) or not listed or \
            not all(isinstance(item, str) and item for item in listed):
        raise ConfigError(f"{path}: `indexes` must be a list of index paths or URIs")
    return [item if "://" in item or os.path.isabs(item) else os.fspath(path.parent / item)
            for item in listed]


class Workspace:
    """Searches several indexes of one model and settings as one."""

    def __init__(self, searchers: list[Searcher]) -> None:
        if not searchers:
            raise ConfigError("a workspace needs at least one index")
        self.searchers = searchers
        first, seen = searchers[0], set()
        for searcher in searchers:  # one index under two names (a link) is still one
            if (real := searcher.index.path.resolve()) in seen:
                raise ConfigError(f"the index {searcher.index.path} is given twice")
            seen.add(real)
        for other in searchers[1:]:
            for setting in SETTINGS:
                if _setting(other, setting) != _setting(first, setting):
                    raise ConfigError(
                        f"{other.index.path} and {first.index.path} differ in {setting} "
                        f"({_setting(other, setting)} vs {_setting(first, setting)}): indexes "
                        "searched together need one model and the same settings")

    def search(self, query: str, k: int = 10, mode: str = "hybrid", abstain: bool = True,
               explain: bool = False, filters: Filters | None = None, context: int = 0,
               ) -> SearchResponse:
        """``Searcher.search`` over every index, merged by score; each result names its
        ``index`` and ``root``. It abstains only when every index does."""
        check_request(query, k, mode, context)
        started = time.perf_counter()
        filters = filters or Filters()
        first = self.searchers[0]
        vector = first.embed_query(query) if mode != "lexical" and any(
            len(s.rows) and s.dense.coverage for s in self.searchers) else None
        legs = [s.legs(query, k, mode, filters, abstain, vector) for s in self.searchers]
        answering = [leg for leg in legs if not leg.abstained]
        bounds = Bounds.over([leg.dense for leg in answering],
                             [leg.lexical for leg in answering])
        ranked = self._ranked(query, k, mode, legs, filters, bounds)
        merged: list[tuple[float, int, dict[str, Any]]] = []
        for number, (searcher, leg) in enumerate(zip(self.searchers, legs, strict=True)):
            for hit in searcher.results(ranked[number], leg, explain, context):
                hit.update(index=os.fspath(searcher.index.path),
                           root=searcher.head.data.get("root"))
                merged.append((hit["score"], number, hit))
        merged.sort(key=lambda item: (-item[0], item[1]))
        chosen = {**filters.as_json(), "rows": sum(int(leg.allowed.sum()) for leg in legs
                                                   if leg.allowed is not None)}
        rows = sum(len(s.rows) for s in self.searchers)
        return SearchResponse(
            query, mode, [hit for _, _, hit in merged[:k]], first.backend,
            {"total": round((time.perf_counter() - started) * 1000, 2)},
            abstained=not answering, filters=chosen if filters.active else {},
            dense_coverage=sum(s.dense.coverage * len(s.rows) for s in self.searchers)
            / rows if rows else 1.0)

    def _ranked(self, query: str, k: int, mode: str, legs: list[Legs], filters: Filters,
                bounds: Bounds) -> list[Ranked]:
        """Each index's top ``k``. A hybrid search fuses each by the shared ``bounds``
        and scales file evidence by the largest over the indexes: each index's own
        would raise its best file as if it were the best of all."""
        if mode != "hybrid":
            return [searcher.ranked(query, k, mode, leg, filters)
                    for searcher, leg in zip(self.searchers, legs, strict=True)]
        rated = [searcher.ranker.rate(query, fuse(leg.dense, leg.lexical, lexical_weight(query),
                                                  bounds, searcher.unembedded),
                                      leg.allowed, filters.asked())
                 if not leg.abstained else None
                 for searcher, leg in zip(self.searchers, legs, strict=True)]
        found = [searcher.ranker.evidence(one)
                 for searcher, one in zip(self.searchers, rated, strict=True) if one]
        reference = Evidence(max((e.top for e in found), default=0.0),
                             max((e.most for e in found), default=0.0))
        return [Ranked(*searcher.ranker.ranked(one, k, reference)) if one  # abstained: none
                else searcher.ranked(query, k, mode, leg, filters)
                for searcher, leg, one in zip(self.searchers, legs, rated, strict=True)]


def _setting(searcher: Searcher, dotted: str) -> Any:
    value: Any = searcher.head.data
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value
