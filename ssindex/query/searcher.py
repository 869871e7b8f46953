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
from ssindex.index.layout import Head, IndexDir
from ssindex.index.postings import NAME_WEIGHT_IDENTIFIER, NAME_WEIGHT_NATURAL, Lexicon
from ssindex.index.remote import resolve_index
from ssindex.index.search_files import SEARCH_FILE_KEYS, SEARCH_FILES_VERSION, SearchFiles
from ssindex.query.dense import DenseLeg
from ssindex.query.excerpt import Excerpts
from ssindex.query.explanation import Explanation
from ssindex.query.filters import Filters, RowFilter
from ssindex.query.fusion import Hit, Ranking, fuse, lexical_weight
from ssindex.query.ranking import Ranker
from ssindex.text.lexical import names_identifier, query_terms

CANDIDATES = 100
"""Depth of the dense leg's ranking before fusion."""
LEXICAL_CANDIDATES = 200
"""Depth of the lexical leg's. Measured on the repobench dev split and CoSQA
(``docs/benchmarks.md``): 200 lexical candidates against 100 gain on both (macro NDCG@10
0.855 → 0.857, MRR@10 0.5367 → 0.5371), while more dense ones cost CoSQA (0.5325 at 150)."""
_META = ["path", "start_line", "end_line", "language", "symbol", "kind", "is_test"]
_NOTHING = Ranking(np.zeros(0, np.int64), np.zeros(0, np.float64))


@dataclass(frozen=True)
class Legs:
    """One index's answer from each leg, before fusion."""

    dense: Ranking
    lexical: Ranking
    allowed: np.ndarray | None
    """The rows the filters let through (``None``: every row)."""
    abstained: bool

    def filters(self, filters: Filters) -> dict[str, object]:
        """``SearchResponse.filters``: the filters set, and the rows they let through."""
        if self.allowed is None:
            return {}
        return {**filters.as_json(), "rows": int(self.allowed.sum())}


@dataclass(frozen=True)
class Ranked:
    """One index's top rows, with why each scored so (hybrid searches)."""

    ranking: Ranking
    why: dict[int, Explanation] = field(default_factory=dict)
    stage_ms: float | None = None
    """The ranking stage's time, when it ran."""


def check_request(query: str, k: int, mode: str, context: int) -> None:
    """A search's arguments, checked: a bad one is a ``ConfigError``."""
    if mode not in SEARCH_MODES:
        raise ConfigError(f"unknown mode {mode!r} (modes: {', '.join(SEARCH_MODES)})")
    if k < 1:
        raise ConfigError("-k must be at least 1")
    if not query.strip():  # its vector would rank chunks by nothing the user said
        raise ConfigError("the query is empty")
    if context < 0:
        raise ConfigError("--context must be at least 0")


@dataclass
class SearchResponse:
    query: str
    mode: str
    results: list[dict[str, Any]]
    backend: dict[str, Any] | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    abstained: bool = False
    filters: dict[str, object] = field(default_factory=dict)
    """The filters that were set (``Filters.as_json``), with ``rows``: how many rows
    they let through."""
    root: str | None = None
    """The indexed directory that results' paths are relative to."""
    dense_coverage: float = 1.0
    """Share of the rows the dense leg can rank: below 1 while a build has chunks left
    to embed (``ssindex build --no-embed``, or a build still running)."""

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"query": self.query, "mode": self.mode,
                                "abstained": self.abstained, "results": self.results,
                                "dense_coverage": round(self.dense_coverage, 4)}
        if self.filters:
            data["filters"] = self.filters
        if self.root is not None:
            data["root"] = self.root
        if self.backend is not None:
            data["backend"] = self.backend
        data["timings_ms"] = self.timings_ms
        return data


class Searcher:
    """Queries one committed version of an index, through its search files
    (``ssindex.index.search_files``); a ``Hit``'s ``row_id`` is the row's position in them."""

    def __init__(self, index_path: str | os.PathLike[str], backend: str | None = None,
                 trust_remote_code: bool = False) -> None:
        """``trust_remote_code`` lets the index's model run its own code, as its build
        had to (``ModelSpec``)."""
        self.index = IndexDir(resolve_index(index_path))
        self.head, self._files = self._pinned()
        self.rows = self._files.rows
        """Every row of the committed version: metadata, text and vector codes
        (memory-mapped)."""
        self._backend_choice = backend
        self._trust_remote_code = trust_remote_code
        self._selection: Selection | None = None
        self._encoder: Encoder | None = None
        self.dense = DenseLeg(self.rows, self.head.quantization,  # type: ignore[arg-type]
                              self.head.dim)
        self.ranker = Ranker(self.rows)
        self.row_filter = RowFilter(self.rows)
        self.excerpts = Excerpts(self.rows, self.row_filter)
        self._terms: TermStats | None = None
        self._lexicon: Lexicon | None = None

    def _pinned(self) -> tuple[Head, SearchFiles]:
        """The version ``HEAD.json`` names and its search files, mapped now: a commit
        removes the files of versions older than the one it replaces, and a progressive
        build older partial snapshots (``ssindex.pipeline.publication``), so files gone
        between reading ``HEAD.json`` and opening them are read again at the new head. A
        mapped file stays readable after it is removed."""
        while True:
            head = self.index.read_head()
            if head.data.get("search_files") != SEARCH_FILES_VERSION:
                raise IndexCorrupt(f"the index at {self.index.path} has search files of "
                                   "another ssindex release: run `ssindex build` once more "
                                   "(nothing is re-embedded)")
            names = [head.data[key] for key in SEARCH_FILE_KEYS if key in head.data]
            try:
                for name in names:
                    verify(self.index, head.data.get("checksums", {}), f"manifests/{name}")
                return head, SearchFiles.read(self.index, head.data)
            except IndexCorrupt:
                if all((self.index.path / "manifests" / name).is_file() for name in names) \
                        or self.index.read_head().data.get("snapshot") == names[0]:
                    raise

    # -- the legs -------------------------------------------------------------------------
    def lexical(self, query: str, limit: int = CANDIDATES, filters: Filters | None = None,
                ) -> list[Hit]:
        return self._lexical(query, limit, self.row_filter.mask(filters or Filters())).hits()

    def semantic(self, query: str, limit: int = CANDIDATES, filters: Filters | None = None,
                 ) -> list[Hit]:
        if len(self.rows) == 0:
            return []
        return self.dense.nearest(self.embed_query(query), limit,
                                  self.row_filter.mask(filters or Filters())).hits()

    def _lexical(self, query: str, limit: int, allowed: np.ndarray | None) -> Ranking:
        terms = query_terms(query).split()
        if not terms:
            return _NOTHING
        name_weight = (NAME_WEIGHT_IDENTIFIER if names_identifier(query)
                       else NAME_WEIGHT_NATURAL)
        docs, scores = self.lexicon.top(terms, limit, name_weight, allowed)
        return Ranking(docs.astype(np.int64), scores.astype(np.float64))

    def embed_query(self, query: str) -> np.ndarray:
        return self.encoder.encode([query])[0]

    # -- public ---------------------------------------------------------------------------
    def warm(self, like: Searcher | None = None) -> Searcher:
        """Load everything a search needs now (query backend, vectors, postings, term
        statistics), so that a long-lived searcher's first request is as fast as the rest.
        ``like``, a searcher of an earlier version of this index, lends what still holds:
        its loaded query encoder, when the model and its settings are the same, and its
        ranking stage's findings for unchanged chunks (a server reopening after a commit)."""
        if like is not None:
            self._adopt_encoder(like)
        self.search("warm up", k=1, abstain=False)
        self.ranker.warm(like.ranker if like is not None else None)
        self.term_stats  # noqa: B018 (loads the abstention statistics)
        return self

    def _adopt_encoder(self, other: Searcher) -> None:
        ours, theirs = self.head.data["model"], other.head.data["model"]
        if other._encoder is not None and self._backend_choice == other._backend_choice \
                and (ours["fingerprint"], ours.get("key")) == (theirs["fingerprint"],
                                                               theirs.get("key")):
            self._encoder, self._selection = other._encoder, other._selection

    def search(self, query: str, k: int = 10, mode: str = "hybrid", abstain: bool = True,
               explain: bool = False, filters: Filters | None = None, context: int = 0,
               ) -> SearchResponse:
        """The top ``k`` chunks of those ``filters`` let through; none, with ``abstained``
        set, when the index has nothing to say (see ``ssindex.index.abstention``;
        ``abstain=False`` always answers). ``explain`` adds each hybrid result's leg
        scores and ranking factors, ``context`` that many lines around each result."""
        check_request(query, k, mode, context)
        started = time.perf_counter()
        filters = filters or Filters()
        legs = self.legs(query, k, mode, filters, abstain)
        ranked = self.ranked(query, k, mode, legs, filters)
        results = self.results(ranked, legs, explain, context)
        elapsed = {"total": round((time.perf_counter() - started) * 1000, 2)}
        if ranked.stage_ms is not None:
            elapsed["ranking"] = round(ranked.stage_ms, 3)
        return SearchResponse(query, mode, results, self.backend, elapsed, legs.abstained,
                              legs.filters(filters), self.head.data.get("root"),
                              self.dense.coverage)

    def legs(self, query: str, k: int, mode: str, filters: Filters, abstain: bool,
             vector: np.ndarray | None = None) -> Legs:
        """Each leg's best rows of those ``filters`` let through (``CANDIDATES`` dense,
        ``LEXICAL_CANDIDATES`` lexical, at least ``k``) for ``mode``, and whether to
        abstain; ``vector`` is the query's, when embedded."""
        allowed = self.row_filter.mask(filters)
        depth, lexical_depth = max(CANDIDATES, k), max(LEXICAL_CANDIDATES, k)
        dense = lexical = _NOTHING
        lexical_leg: Future[Ranking] | None = None
        if mode == "semantic" and len(self.rows) and not self.dense.coverage:
            raise ConfigError(f"the index at {self.index.path} has no vectors yet (built "
                              "with --no-embed): search with --mode lexical or hybrid, or "
                              "run `ssindex build` to embed it")
        if mode != "lexical" and len(self.rows) and self.dense.coverage:
            vector = self.embed_query(query) if vector is None else vector
            if mode == "hybrid":  # the dense scan is single-threaded: the other core is free
                lexical_leg = self._lexical_worker.submit(self._lexical, query, lexical_depth,
                                                          allowed)
            dense = self.dense.nearest(vector, depth, allowed)
        if lexical_leg is not None:
            lexical = lexical_leg.result()
        elif mode != "semantic":  # lexical, or hybrid over an index with no vector yet
            lexical = self._lexical(query, lexical_depth, allowed)
        # a filter that lets nothing through has an empty answer, not an abstention
        abstained = abstain and (allowed is None or bool(allowed.any())) and \
            self._abstains(query, dense, allowed)
        return Legs(dense, lexical, allowed, abstained)

    def ranked(self, query: str, k: int, mode: str, legs: Legs, filters: Filters) -> Ranked:
        """The top ``k`` of ``legs`` for ``mode``: a leg's own, or fused and re-ranked."""
        if legs.abstained:
            return Ranked(_NOTHING)
        if mode != "hybrid":
            ranking = legs.lexical if mode == "lexical" else legs.dense
            return Ranked(Ranking(ranking.rows[:k], ranking.scores[:k]))
        fused = fuse(legs.dense, legs.lexical, lexical_weight(query),
                     unembedded=self.unembedded)
        started = time.perf_counter()
        ranking, why = self.ranker.rank(query, fused, k, legs.allowed, filters.asked())
        return Ranked(ranking, why, (time.perf_counter() - started) * 1000)

    def results(self, ranked: Ranked, legs: Legs, explain: bool = False, context: int = 0,
                ) -> list[dict[str, Any]]:
        """The rows of ``ranked`` as results: metadata, text, score, and the explanation
        and context lines when asked."""
        results = self._fetch(ranked.ranking.hits())
        for hit, row in zip(results, ranked.ranking.rows.tolist(), strict=True):
            if explain and row in ranked.why:
                hit["explain"] = ranked.why[row].as_json(legs.dense, legs.lexical, row)
            if context:
                hit["context"] = self.excerpts.around(row, context)
        return results

    @property
    def backend(self) -> dict[str, Any] | None:
        """The query backend chosen, once the query encoder has loaded."""
        return self._selection.as_json() if self._selection is not None else None

    @cached_property
    def unembedded(self) -> np.ndarray | None:
        """Which rows have no vector yet (``None`` when every row has one)."""
        return None if self.dense.embedded is None else ~self.dense.embedded

    def _abstains(self, query: str, dense: Ranking, allowed: np.ndarray | None) -> bool:
        thresholds = self._thresholds
        # rows still to embed could answer semantically: the finished index might not
        # abstain, so a partial one never does
        if thresholds is None or self.dense.coverage < 1.0:
            return False
        if self.term_stats.grounding(query) >= thresholds.lexical:
            return False
        if not len(dense) and len(self.rows):  # a lexical search: the dense leg did not run
            dense = self.dense.nearest(self.embed_query(query), 1, allowed)
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
            self._terms = TermStats(self.lexicon.frequency, self.lexicon.total)
        return self._terms

    @property
    def lexicon(self) -> Lexicon:
        """BM25 over the rows (``ssindex.index.postings``), loaded at first use."""
        if self._lexicon is None:
            self._lexicon = self._files.lexicon()
        return self._lexicon

    @property
    def encoder(self) -> Encoder:
        if self._encoder is None:
            built = self.head.data["model"]
            model = ModelSpec.resolve(built["path"], int(built["max_tokens"]),
                                      int(built.get("dims", 0)), self._trust_remote_code)
            if model.fingerprint != built["fingerprint"] or built.get("key", model.key) \
                    != model.key:
                raise IndexCorrupt(f"the model at {model.path} or its settings changed since "
                                   "the index was built; rebuild")
            self._selection = select("embed_query", model, self._backend_choice,
                                     inventory=detect(with_torch=False))
            self._encoder = Encoder(self._selection.backend, model, role="query")
        return self._encoder

    # -- internals ------------------------------------------------------------------------
    def _fetch(self, hits: list[Hit]) -> list[dict[str, Any]]:
        # one value per column: no ``take`` (it imports pyarrow.compute, ~0.1 s of a cold
        # search) and no one-row tables (3× slower)
        columns = {name: self.rows.column(name) for name in [*_META, "text"]}
        return [{**{name: column[hit.row_id].as_py() for name, column in columns.items()},
                 "score": round(hit.score, 6)} for hit in hits]

