"""Search an index: lexical (BM25 over identifier-aware terms), semantic, hybrid.

A ``Searcher`` pins the version ``HEAD.json`` names when it opens, memory-maps
its search files (``ssindex.index.search_files``), loads the build's BM25 postings, and
keeps its query backend warm, so repeated searches pay only for the query. The dense
leg is ``ssindex.query.dense``; a hybrid search runs its lexical leg on a second
thread while this thread scans.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from ssindex.backends.base import Encoder
from ssindex.backends.inventory import detect
from ssindex.backends.model import ModelSpec
from ssindex.backends.selector import Selection, select
from ssindex.config import SEARCH_MODES
from ssindex.errors import ConfigError, IndexCorrupt
from ssindex.index.abstention import TermStats, Thresholds
from ssindex.index.integrity import verify
from ssindex.index.layout import IndexDir
from ssindex.index.postings import NAME_WEIGHT_IDENTIFIER, NAME_WEIGHT_NATURAL, Postings
from ssindex.index.remote import resolve_index
from ssindex.index.search_files import SEARCH_FILES_VERSION
from ssindex.query.dense import DenseLeg
from ssindex.query.fusion import Hit, Ranking, fuse, lexical_weight
from ssindex.query.ranking import Explanation, Ranker
from ssindex.text.lexical import names_identifier, query_terms

CANDIDATES = 100
"""Depth of each leg's ranking before fusion."""
_META = ["path", "start_line", "end_line", "language", "symbol", "kind"]
_NOTHING = Ranking(np.zeros(0, np.int64), np.zeros(0, np.float64))


@dataclass
class SearchResponse:
    query: str
    mode: str
    results: list[dict[str, Any]]
    backend: dict[str, Any] | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    abstained: bool = False

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"query": self.query, "mode": self.mode,
                                "abstained": self.abstained, "results": self.results}
        if self.backend is not None:
            data["backend"] = self.backend
        data["timings_ms"] = self.timings_ms
        return data


class Searcher:
    """Queries one committed version of an index, through its search files
    (``ssindex.index.search_files``); a ``Hit``'s ``row_id`` is the row's position in them."""

    def __init__(self, index_path: str | os.PathLike[str], backend: str | None = None) -> None:
        self.index = IndexDir(resolve_index(index_path))
        self.head = self.index.read_head()
        if self.head.data.get("search_files") != SEARCH_FILES_VERSION:
            raise IndexCorrupt(f"the index at {self.index.path} has search files of another "
                               "ssindex release: run `ssindex build` once more (nothing is "
                               "re-embedded)")
        self._checksums: dict[str, str] = self.head.data.get("checksums", {})
        verify(self.index, self._checksums, f"manifests/{self.head.data['snapshot']}")
        self.rows = self.index.read_manifest(self.head.data["snapshot"], mmap=True)
        """Every row of the pinned version: metadata, text and vector codes (memory-mapped)."""
        self._backend_choice = backend
        self._selection: Selection | None = None
        self._encoder: Encoder | None = None
        self.dense = DenseLeg(self.rows, self.head.quantization,  # type: ignore[arg-type]
                              self.head.dim)
        self.ranker = Ranker(self.rows)
        self._terms: TermStats | None = None
        self._postings: Postings | None = None

    # -- the legs -------------------------------------------------------------------------
    def lexical(self, query: str, limit: int = CANDIDATES) -> list[Hit]:
        return self._lexical(query, limit).hits()

    def semantic(self, query: str, limit: int = CANDIDATES) -> list[Hit]:
        if len(self.rows) == 0:
            return []
        return self.dense.nearest(self.embed_query(query), limit).hits()

    def _lexical(self, query: str, limit: int) -> Ranking:
        terms = query_terms(query).split()
        if not terms:
            return _NOTHING
        name_weight = (NAME_WEIGHT_IDENTIFIER if names_identifier(query)
                       else NAME_WEIGHT_NATURAL)
        docs, scores = self.postings.top(terms, limit, name_weight)
        return Ranking(docs.astype(np.int64), scores.astype(np.float64))

    def embed_query(self, query: str) -> np.ndarray:
        return self.encoder.encode([query])[0]

    # -- public ---------------------------------------------------------------------------
    def warm(self) -> Searcher:
        """Load everything a search needs now (query backend, vectors, postings, term
        statistics), so that a long-lived searcher's first request is as fast as the rest."""
        self.search("warm up", k=1, abstain=False)
        self.ranker.warm()
        self.term_stats  # noqa: B018 (loads the abstention statistics)
        return self

    def search(self, query: str, k: int = 10, mode: str = "hybrid",
               abstain: bool = True, explain: bool = False) -> SearchResponse:
        """The top ``k`` chunks; none, with ``abstained`` set, when the index has nothing
        to say (see ``ssindex.index.abstention``; ``abstain=False`` always answers).
        ``explain`` adds each hybrid result's leg scores and ranking factors."""
        if mode not in SEARCH_MODES:
            raise ConfigError(f"unknown mode {mode!r} (modes: {', '.join(SEARCH_MODES)})")
        if k < 1:
            raise ConfigError("-k must be at least 1")
        if not query.strip():  # its vector would rank chunks by nothing the user said
            raise ConfigError("the query is empty")
        started = time.perf_counter()
        depth = max(CANDIDATES, k)
        dense = lexical = _NOTHING
        why: dict[int, Explanation] = {}
        ranking_ms = 0.0
        lexical_leg: Future[Ranking] | None = None
        if mode != "lexical" and len(self.rows):
            vector = self.embed_query(query)
            if mode == "hybrid":  # the dense scan is single-threaded: the other core is free
                lexical_leg = self._lexical_worker.submit(self._lexical, query, depth)
            dense = self.dense.nearest(vector, depth)
        if lexical_leg is not None:
            lexical = lexical_leg.result()
        abstained = abstain and self._abstains(query, dense)
        if abstained:
            ranking = _NOTHING
        elif mode == "lexical":
            ranking = self._lexical(query, k)
        elif mode == "semantic":
            ranking = dense
        else:
            fused = fuse(dense, lexical, lexical_weight(query))
            ranking_started = time.perf_counter()
            ranking, why = self.ranker.rank(query, fused, k)
            ranking_ms = (time.perf_counter() - ranking_started) * 1000
        ranked = self._fetch(ranking.hits(k))
        if explain and mode == "hybrid" and not abstained:
            for hit, row in zip(ranked, ranking.rows.tolist(), strict=True):
                hit["explain"] = why[row].as_json(dense, lexical, row)
        elapsed = {"total": round((time.perf_counter() - started) * 1000, 2)}
        if mode == "hybrid" and not abstained:
            elapsed["ranking"] = round(ranking_ms, 3)
        backend = self._selection.as_json() if self._selection is not None else None
        return SearchResponse(query, mode, ranked, backend, elapsed, abstained)

    def _abstains(self, query: str, dense: Ranking) -> bool:
        thresholds = self._thresholds
        if thresholds is None:
            return False
        if self.term_stats.grounding(query) >= thresholds.lexical:
            return False
        if not len(dense) and len(self.rows):  # a lexical search: the dense leg did not run
            dense = self.dense.nearest(self.embed_query(query), 1)
        best = float(dense.scores[0]) if len(dense) else 0.0
        return best < thresholds.semantic

    @cached_property
    def _lexical_worker(self) -> ThreadPoolExecutor:
        """One thread for the lexical leg of hybrid searches (it exits with the searcher)."""
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="ssindex-lexical")

    @property
    def _thresholds(self) -> Thresholds | None:
        data = self.head.data.get("abstention")
        return Thresholds(**data) if data else None

    @property
    def term_stats(self) -> TermStats:
        if self._terms is None:
            self._terms = TermStats(self.postings.vocabulary, self.postings.counts)
        return self._terms

    @property
    def postings(self) -> Postings:
        if self._postings is None:
            verify(self.index, self._checksums, f"manifests/{self.head.data['postings']}")
            self._postings = Postings.from_table(
                self.index.read_manifest(self.head.data["postings"], mmap=True), len(self.rows))
        return self._postings

    @property
    def encoder(self) -> Encoder:
        if self._encoder is None:
            model = ModelSpec.resolve(self.head.data["model"]["path"])
            if model.fingerprint != self.head.data["model"]["fingerprint"]:
                raise IndexCorrupt(
                    f"the model at {model.path} changed since the index was built; rebuild"
                )
            self._selection = select("embed_query", model, self._backend_choice,
                                     inventory=detect(with_torch=False))
            self._encoder = Encoder(self._selection.backend, model,
                                    int(self.head.data["model"]["max_tokens"]))
        return self._encoder

    # -- internals ------------------------------------------------------------------------
    def _fetch(self, hits: list[Hit]) -> list[dict[str, Any]]:
        # one value per column: no ``take`` (it imports pyarrow.compute, ~0.1 s of a cold
        # search) and no one-row tables (3× slower)
        columns = {name: self.rows.column(name) for name in [*_META, "text"]}
        return [{**{name: column[hit.row_id].as_py() for name, column in columns.items()},
                 "score": round(hit.score, 6)} for hit in hits]

