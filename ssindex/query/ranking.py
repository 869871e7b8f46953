"""The ranking stage after fusion: what a code reader knows that the two legs do not.

Every rule is general and stated here. A candidate's score is
``(fused × factors + added) × same-file decay``:

- **Path priors** (factors). Tests, examples, documentation and prose, configuration
  and data files, legacy/compat/deprecated trees, vendored and generated code, type
  stubs, and an older versioned tree beside a newer sibling (``v1/`` next to ``v2/``)
  answer fewer questions than the code they describe or copy: each kind scales a
  chunk's score down (``PRIORS``). A prior does not apply when the query asks for that
  kind of file ("test", "example", "docs", "config"...).
- **Definitions** (a factor). A query that is or holds an identifier (``Router``,
  ``parse_addr``, ``a.b``, ``A::B``) promotes the chunks that define it: found by a
  name lookup in the symbol table even when neither leg retrieved them, and by a
  definition line inside a candidate that holds several small definitions. The exact
  case outranks another case, and a definition outranks a mention.
- **Barrels** (a factor). A chunk of imports and re-exports alone names code that
  lives elsewhere.
- **Named files** (a factor). A file or directory named by a query word (or a word
  that starts it, ``types`` for ``ColumnType.kt``) is evidence for its chunks.
- **File evidence** (added). A file with several strong candidates is one strong
  answer: its best chunk gains a share of the top score in proportion to the file's
  summed candidate scores (``COHERENCE``). The pieces of one long definition count as
  one piece of evidence, and a query that is one name skips this rule.
- **Diversity** (the decay). A file is one answer to a reader, and the metric credits
  it once: each further chunk of a file already ranked is scaled by
  ``SAME_FILE_DECAY``.

The constants were tuned on the repobench dev split, with leave-one-repository-out
figures and CoSQA as a check (``docs/benchmarks.md``).
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Set
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from ssindex.query.conventions import (
    ASKS,
    STOP_WORDS,
    VERSIONED,
    definition_pattern,
    file_kinds,
    identifiers,
    is_barrel,
    newest_versions,
    prefixes,
    split_name,
    words_of,
)
from ssindex.query.definitions import Definitions
from ssindex.query.explanation import Explanation
from ssindex.query.fusion import Ranking

SAME_FILE_DECAY = 0.3
DEFINITION_BOOST = 1.3
NAME_DEFINITION_BOOST = 2.0
"""``DEFINITION_BOOST`` for a query that is one name: there a definition is the answer."""
MISSED_DEFINITIONS = 40
"""At most this many definitions that neither leg retrieved join the candidates."""
INSIDE_DEPTH = 30
"""How many of the best fused candidates are searched for a definition inside them."""
CASE_MISMATCH = 0.8
"""Share of the definition boost kept when a definition matches the name but not its case."""
FILE_WORD_BOOST = 1.5
"""Per query word naming the file or its directory (at most two count)."""
COHERENCE = 1.0
"""A file with several strong candidates is one strong answer: its best chunk gains this
share of the top score, scaled by the file's evidence over the best file's. Not for a
query that is one name: there the chunk defining it is the answer."""
PIECE_WEIGHT = 0.3
"""What each further piece of one long definition adds to its file's evidence: a long
function split into chunks is one answer, not several."""
PRIORS = {"test": 0.55, "docs": 0.6, "example": 0.7, "legacy": 0.7, "older": 0.7,
          "vendored": 0.6, "stub": 0.75, "barrel": 0.7, "config": 0.6}
class Evidence(NamedTuple):
    """What file evidence is scaled by: the top candidate's score, the best file's evidence."""

    top: float
    most: float


@dataclass(frozen=True)
class Rated:
    """One query's candidates through the factors, before file evidence and diversity
    (``Ranker.rate``); ``Ranker.ranked`` finishes it, once."""

    fused: Ranking
    bare: bool = False
    scores: dict[int, float] = field(default_factory=dict)
    defined: dict[int, float] = field(default_factory=dict)
    asked: set[str] = field(default_factory=set)
    naming: dict[int, int] = field(default_factory=dict)
    barrel: float = 1.0
    adjusted: dict[int, float] = field(default_factory=dict)


class Ranker:
    """Re-ranks fused candidates of one pinned version's rows (path, symbol, kind)."""

    def __init__(self, rows: pa.Table) -> None:
        self.rows = rows
        self._barrels: dict[int, bool] = {}
        self._file_kinds: dict[int, list[str]] = {}
        self._file_names: dict[int, tuple[set[str], set[str]]] = {}
        self._file_scales: dict[int, float] = {}

    def warm(self, like: Ranker | None = None) -> None:
        """Build the tables the rules read now, not on a query's first need, and find
        every barrel. Those of ``like``, an earlier version's ranker, are taken by chunk
        id (an id names its text): a reopen after a one-file commit tests new chunks only."""
        for table in ("_newest", "_definitions", "_pieces", "_file_ids", "_modules"):
            getattr(self, table)
        self.__dict__.pop("_symbols", None)  # the tables above hold what they need of it
        known = like.barrels_by_id() if like is not None else {}
        modules = np.flatnonzero(self._modules).tolist()
        ids = self.rows.column("id").take(pa.array(modules, pa.int64())).to_pylist()
        self._barrels.update((row, known[i]) for row, i in zip(modules, ids, strict=True)
                             if i in known)
        unknown = [row for row in modules if row not in self._barrels]
        for start in range(0, len(unknown), 4096):
            rows = unknown[start:start + 4096]
            chunks = self.rows.column("text").take(pa.array(rows, pa.int64())).to_pylist()
            self._barrels.update(zip(rows, map(is_barrel, chunks), strict=True))

    def barrels_by_id(self) -> dict[str, bool]:
        """The barrel verdicts found so far, by chunk id."""
        rows = list(self._barrels)
        ids = self.rows.column("id").take(pa.array(rows, pa.int64())).to_pylist()
        return dict(zip(ids, self._barrels.values(), strict=True))

    @cached_property
    def _files(self) -> tuple[list[int], list[str]]:
        """Each row's file number, and the files' paths."""
        numbers: dict[str, int] = {}
        files = [numbers.setdefault(p, len(numbers)) for p in self.rows.column("path").to_pylist()]
        return files, list(numbers)

    @cached_property
    def _newest(self) -> dict[str, int]:
        return newest_versions(self._files[1])

    def _kinds(self, file: int) -> list[str]:
        """The prior kinds of ``file``, found on first need: a file's kinds for the
        100k files of a large index would cost a cold search seconds."""
        if file not in self._file_kinds:
            path = self._files[1][file]
            self._file_kinds[file] = file_kinds(path, self._newest if VERSIONED.search(path)
                                                else {})
        return self._file_kinds[file]

    def _naming(self, words: dict[str, set[str]], candidates: set[int]) -> dict[int, int]:
        """How many query ``words`` (each with its ``prefixes``) name each candidate
        file's name or parent directory: equal, or one starting the other when the
        shorter has ``WORD_PREFIX`` letters. Set lookups only, in one loop: this runs for
        every candidate file of every query."""
        naming = {}
        items = list(words.items())
        forms = set(words).union(*words.values())  # no file they miss is named
        for file in candidates:
            keys, plain = self._file_names.get(file) or self._names(file)
            naming[file] = 0 if keys.isdisjoint(forms) else sum(
                1 for word, prefixes in items if word in keys or not plain.isdisjoint(prefixes))
        return naming

    def _names(self, file: int) -> tuple[set[str], set[str]]:
        """The words of ``file``'s name and its parent directory with their prefixes,
        and the words alone; found on first need, like ``_kinds``."""
        parts = self._files[1][file].split("/")
        words = words_of(f"{parts[-2] if len(parts) > 1 else ''} {split_name(parts[-1])[0]}")
        self._file_names[file] = words.union(*map(prefixes, words)), words
        return self._file_names[file]

    @cached_property
    def _symbols(self) -> list[tuple[str | None, str]]:
        """Each row's symbol and kind, read once for the tables below (``warm`` drops it)."""
        return list(zip(*(self.rows.column(c).to_pylist() for c in ("symbol", "kind")),
                        strict=True))

    @cached_property
    def _definitions(self) -> Definitions:
        return Definitions(self.rows.column("symbol"), self.rows.column("kind"))

    def rank(self, query: str, fused: Ranking, limit: int, allowed: np.ndarray | None = None,
             selected: Set[str] = frozenset(), reference: Evidence | None = None,
             ) -> tuple[Ranking, dict[int, Explanation]]:
        """The top ``limit`` rows after the rules above, with why each scored so. Only
        rows ``allowed`` lets through join the candidates (``ssindex.query.filters``);
        the priors of the kinds of file a filter ``selected`` do not apply. File evidence
        is scaled by ``reference`` when given (several indexes ranked as one)."""
        return self.ranked(self.rate(query, fused, allowed, selected), limit, reference)

    def ranked(self, rated: Rated, limit: int, reference: Evidence | None = None,
               ) -> tuple[Ranking, dict[int, Explanation]]:
        """``rank``'s second half: file evidence, diversity and the explanations."""
        if not len(rated.fused):
            return rated.fused, {}
        added = {} if rated.bare else self._cohere(rated.adjusted, reference)
        ranked, decays = self._diverse(rated.adjusted, limit)
        explained = {}
        files = self._files[0]
        for row in ranked.rows.tolist():
            file = files[row]
            why = explained[row] = Explanation(rated.scores[row], self._priors(
                file, rated.asked, rated.naming[file]))
            if rated.barrel != 1.0 and self._barrel(row):
                why.factors["prior:barrel"] = rated.barrel
            if row in rated.defined:
                why.factors["defines"] = rated.defined[row]
            if row in added:
                why.added["file evidence"] = added[row]
            if row in decays:
                why.factors["same file"] = decays[row]
        return ranked, explained

    def evidence(self, rated: Rated) -> Evidence:
        """The top score and the best file's evidence that ``ranked`` would scale file
        evidence by: several indexes ranked as one scale by the largest of each."""
        if not len(rated.fused):
            return Evidence(0.0, 0.0)
        return self._file_evidence(rated.adjusted)[3]

    def rate(self, query: str, fused: Ranking, allowed: np.ndarray | None = None,
             selected: Set[str] = frozenset()) -> Rated:
        """``rank``'s first half: the candidates with their priors, definition boosts
        and named-file factors."""
        if not len(fused):
            return Rated(fused)
        bare = len(query.split()) == 1
        scores, defined = self._candidates(query, fused, bare, allowed)
        asked = {kind for kind, pattern in ASKS.items() if pattern.search(query)} | selected
        if "legacy" in asked:
            asked.add("older")
        words = {word: prefixes(word) for word in words_of(query) - STOP_WORDS}
        files = self._files[0]
        naming = self._naming(words, {files[row] for row in scores})
        scale = {file: self._scale(file, asked) * (1 + FILE_WORD_BOOST * min(named, 2))
                 for file, named in naming.items()}
        barrel = 1.0 if "barrel" in asked else PRIORS["barrel"]
        adjusted: dict[int, float] = {}
        for row, score in scores.items():  # the hot loop: plain lookups, no objects
            factor = scale[files[row]] * defined.get(row, 1.0)
            adjusted[row] = score * (factor * barrel if self._barrel(row) else factor)
        return Rated(fused, bare, scores, defined, asked, naming, barrel, adjusted)

    def _candidates(self, query: str, fused: Ranking, bare: bool, allowed: np.ndarray | None,
                    ) -> tuple[dict[int, float], dict[int, float]]:
        """The fused rows and the definitions the query names (those the legs missed
        compete from the top score), and each definition's boost."""
        scores = dict(zip(fused.rows.tolist(), fused.scores.tolist(), strict=True))
        names = identifiers(query)
        if not names:
            return scores, {}
        strength = NAME_DEFINITION_BOOST if bare else DEFINITION_BOOST
        defined = self._defines(names, strength)
        if allowed is not None:
            defined = {row: boost for row, boost in defined.items() if allowed[row]}
        top = float(fused.scores[0])
        for row in sorted(defined, key=defined.__getitem__, reverse=True)[:MISSED_DEFINITIONS]:
            scores.setdefault(row, top)
        inside = [row for row in fused.rows[:INSIDE_DEPTH].tolist() if row not in defined]
        for row in self._defined_inside(inside, names):
            defined[row] = strength
        return scores, defined

    def _priors(self, file: int, asked: set[str], named: int) -> dict[str, float]:
        """The path priors and named-file factor of ``file``'s chunks (``named``: how
        many query words name it)."""
        factors = {f"prior:{kind}": PRIORS[kind] for kind in self._kinds(file)
                   if kind not in asked}
        if named:
            factors["file named"] = 1 + FILE_WORD_BOOST * min(named, 2)
        return factors

    def _scale(self, file: int, asked: set[str]) -> float:
        """The product of ``file``'s path priors that apply (cached for a query that
        asks for no kind of file: most queries)."""
        if asked:
            return math.prod(PRIORS[kind] for kind in self._kinds(file) if kind not in asked)
        if file not in self._file_scales:
            self._file_scales[file] = math.prod(PRIORS[kind] for kind in self._kinds(file))
        return self._file_scales[file]

    def _cohere(self, adjusted: dict[int, float], reference: Evidence | None,
                ) -> dict[int, float]:
        """Raise each file's best chunk by ``COHERENCE`` of the top score, times the
        file's evidence over the best file's (``reference``'s, when given); the gains,
        by row."""
        rows, best, evidence, own = self._file_evidence(adjusted)
        top, most = reference or own
        if top <= 0 or most <= 0:
            return {}
        gains = dict(zip(rows[best].tolist(), (COHERENCE * top * evidence / most).tolist(),
                         strict=True))
        for row, gain in gains.items():
            adjusted[row] += gain
        return gains

    def _file_evidence(self, adjusted: dict[int, float],
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Evidence]:
        """The candidates best first, the position of each file's best among them, each
        file's evidence, and the top score with the largest evidence. A file's evidence
        is its candidates' scores summed, each further piece of one definition counting
        ``PIECE_WEIGHT`` of its score. In numpy: it reads every candidate."""
        rows = np.fromiter(adjusted, np.int64, len(adjusted))
        scores = np.fromiter(adjusted.values(), np.float64, len(adjusted))
        order = np.argsort(-scores, kind="stable")
        rows, scores = rows[order], scores[order]
        files = self._file_ids[rows]
        _, firsts = np.unique((files << 32) | self._pieces[rows], return_index=True)
        shares = np.full(len(rows), PIECE_WEIGHT)
        shares[firsts] = 1.0
        _, best, local = np.unique(files, return_index=True, return_inverse=True)
        evidence = np.bincount(local, scores * shares)
        return rows, best, evidence, Evidence(float(scores[0]), float(evidence.max()))

    @cached_property
    def _pieces(self) -> np.ndarray:
        """Which definition each chunk is a piece of, numbered: its symbol's number
        (module-level chunks are each their own)."""
        numbers: dict[str, int] = {}
        return np.array([numbers.setdefault(f"\0{row}" if kind == "module" else symbol or "",
                                            len(numbers))
                         for row, (symbol, kind) in enumerate(self._symbols)], np.int64)

    @cached_property
    def _file_ids(self) -> np.ndarray:
        """Each row's file number, as an array."""
        return np.array(self._files[0], np.int64)

    @cached_property
    def _modules(self) -> np.ndarray:
        """Whether each row is a module-level chunk: the only kind a barrel can be."""
        return np.array([kind == "module" for _, kind in self._symbols], bool)

    def _barrel(self, row: int) -> bool:
        if not self._modules[row]:
            return False
        if row not in self._barrels:
            self._barrels[row] = is_barrel(self.rows.column("text")[row].as_py())
        return self._barrels[row]

    def _defines(self, names: list[str], strength: float) -> dict[int, float]:
        """Rows the symbol table says define one of ``names``, each with its boost: less
        when the case differs (``deserialize`` for ``Deserialize``)."""
        boosts: dict[int, float] = {}
        for name in names:
            for row, defined in self._definitions.get(name):
                boost = strength * (1.0 if defined == name else CASE_MISMATCH)
                boosts[row] = max(boosts.get(row, 0.0), boost)
        return boosts

    def _defined_inside(self, rows: list[int], names: list[str]) -> set[int]:
        """Of ``rows``, those whose text defines one of ``names`` without being named
        after it: a chunk that holds several small definitions carries only the first
        one's name in the symbol table. A substring test first: the pattern is slow."""
        pattern, text = definition_pattern(tuple(names)), self.rows.column("text")
        chunks = ((row, text[row].as_py()) for row in rows)  # not ``take``: it loads pandas
        return {row for row, chunk in chunks
                if any(name in chunk for name in names) and pattern.search(chunk)}

    def _diverse(self, adjusted: dict[int, float], limit: int,
                 ) -> tuple[Ranking, dict[int, float]]:
        """Best first, each further chunk of a ranked file scaled by ``SAME_FILE_DECAY``
        once per chunk of that file above it; and each decay applied, by row."""
        files = self._files[0]
        seen: dict[int, int] = defaultdict(int)
        ranked: list[tuple[int, float]] = []
        decays: dict[int, float] = {}
        best: list[float] = []  # a min-heap of the ``limit`` best scores so far
        for row in sorted(sorted(adjusted), key=adjusted.__getitem__, reverse=True):
            score = adjusted[row]
            if len(best) == limit and score <= best[0]:
                break  # decay only lowers scores: no later row can enter the top
            file = files[row]
            if seen[file]:
                decays[row] = SAME_FILE_DECAY ** seen[file]
                score *= decays[row]
            seen[file] += 1
            ranked.append((row, score))
            (heapq.heappush if len(best) < limit else heapq.heappushpop)(best, score)
        ranked.sort(key=lambda item: (-item[1], item[0]))
        ranked = ranked[:limit]
        return (Ranking(np.array([r for r, _ in ranked], np.int64),
                        np.array([s for _, s in ranked], np.float64)), decays)
