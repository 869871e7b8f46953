"""The ranking stage after fusion: what a code reader knows that the two legs do not.

Every rule is general, multiplicative on the fused score, and stated here:

- **Path priors.** Tests, examples, documentation and prose, legacy/compat/deprecated
  trees, vendored and generated code, type stubs, and an older versioned tree beside a
  newer sibling (``v1/`` next to ``v2/``) answer fewer questions than the code they
  describe or copy: each kind scales a chunk's score down (``PRIORS``). A prior does
  not apply when the query asks for that kind of file ("test", "example", "docs"...).
- **Definitions.** A query that is or holds an identifier (``Router``, ``parse_addr``,
  ``a.b``, ``A::B``) promotes the chunks that define it, found by a name lookup in the
  symbol table even when neither leg retrieved them; a definition outranks a mention.
- **Barrels.** A chunk of imports and re-exports alone names code that lives elsewhere.
- **File evidence.** A file or directory named by a query word is evidence for its
  chunks.
- **Diversity.** A file is one answer to a reader, and the metric credits it once:
  each further chunk of a file already ranked is scaled by ``SAME_FILE_DECAY``.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import PurePosixPath

import numpy as np
import pyarrow as pa

from ssindex.query.fusion import Ranking

SAME_FILE_DECAY = 0.3
DEFINITION_BOOST = 1.3
FILE_WORD_BOOST = 0.5
"""Per query word naming the file or its directory (at most two count)."""

PRIORS = {"test": 0.55, "docs": 0.6, "example": 0.7, "legacy": 0.7, "older": 0.7,
          "vendored": 0.6, "stub": 0.75, "barrel": 0.7}
BARREL_SHARE = 0.7
"""A chunk whose code lines are at least this share of imports and re-exports is a
barrel (``__init__.py``, ``index.ts``, ``mod.rs``): it names the code, it is not it."""
_ASKS = {
    "test": re.compile(r"\b(tests?|testing|spec|specs|fixtures?|mocks?)\b", re.I),
    "docs": re.compile(r"\b(docs?|documentation|readme|guide|changelog|markdown)\b", re.I),
    "example": re.compile(r"\b(examples?|samples?|demos?|tutorials?)\b", re.I),
    "legacy": re.compile(r"\b(legacy|compat|compatibility|deprecated|old)\b", re.I),
    "stub": re.compile(r"\b(stubs?|typings?|declarations?)\b", re.I),
}
_TEST_DIRS = {"test", "tests", "__tests__", "spec", "specs", "testing", "testdata", "fixtures"}
_TEST_NAME = re.compile(r"(^test_|_test\.|\.test\.|\.spec\.|_spec\.|Tests?\.[a-z]+$|Spec\.[a-z]+$)")
_DOC_SUFFIXES = {".md", ".rst", ".txt", ".adoc", ".markdown"}
_DOC_DIRS = {"docs", "doc", "documentation"}
_EXAMPLE_DIRS = {"example", "examples", "sample", "samples", "demo", "demos"}
_LEGACY_DIRS = {"legacy", "compat", "deprecated", "old"}
_VENDORED_DIRS = {"vendor", "vendored", "third_party", "thirdparty", "node_modules",
                  "generated", "_generated", "external"}
_VERSION_DIR = re.compile(r"v(\d+)")
_REEXPORT = re.compile(r"\s*(import\s|from\s\S+\s+import\s|export\s+(\*|\{|type\s+\{)|"
                       r"pub\s+(use|mod)\s|mod\s+\w+;|use\s|require|#include|__all__|"
                       r"module\.exports|[)}\]],?\s*$|\w+,\s*$)")
_DEFINITIONS = {"function", "method", "class", "struct", "interface", "enum", "trait",
                "type", "impl", "object", "protocol"}
_IDENTIFIER = re.compile(
    r"[A-Za-z_][A-Za-z0-9_]*(?:(?:\.|::)[A-Za-z_][A-Za-z0-9_]*)+"  # a.b, A::B
    r"|[A-Za-z]*[a-z][A-Z][A-Za-z0-9]*|[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*"  # camelCase, CamelCase
    r"|[A-Za-z0-9]+_[A-Za-z0-9_]+")  # snake_case
_WORD = re.compile(r"[a-z][a-z0-9]+")
_STOP = {"the", "and", "for", "how", "what", "where", "with", "from", "into", "that", "this",
         "are", "is", "does", "when", "which", "code", "function", "method", "class",
         "implementation", "works", "work", "handled", "handle", "used", "using"}


@dataclass
class Explanation:
    """Why a result scored as it did: its fused score, then each factor applied."""

    fused: float
    factors: dict[str, float] = field(default_factory=dict)

    def as_json(self, dense: Ranking, lexical: Ranking, row: int) -> dict[str, object]:
        def leg(ranking: Ranking) -> float | None:
            found = np.flatnonzero(ranking.rows == row)
            return round(float(ranking.scores[found[0]]), 6) if len(found) else None

        return {"dense": leg(dense), "lexical": leg(lexical), "fused": round(self.fused, 6),
                "factors": {name: round(value, 4) for name, value in self.factors.items()}}


def file_kinds(path: str, newer_versions: dict[str, int]) -> list[str]:
    """The prior kinds that ``path`` is (``PRIORS``' keys)."""
    parts = PurePosixPath(path).parts
    dirs = {part.lower() for part in parts[:-1]}
    name = parts[-1] if parts else ""
    kinds = []
    if dirs & _TEST_DIRS or _TEST_NAME.search(name):
        kinds.append("test")
    if PurePosixPath(name).suffix.lower() in _DOC_SUFFIXES or dirs & _DOC_DIRS:
        kinds.append("docs")
    if dirs & _EXAMPLE_DIRS:
        kinds.append("example")
    if dirs & _LEGACY_DIRS:
        kinds.append("legacy")
    if dirs & _VENDORED_DIRS or ".generated." in name or name.endswith(("_pb2.py", ".min.js")):
        kinds.append("vendored")
    if name.endswith((".d.ts", ".pyi")):
        kinds.append("stub")
    for depth, part in enumerate(parts[:-1]):
        match = _VERSION_DIR.fullmatch(part.lower())
        parent = "/".join(parts[:depth])
        if match and newer_versions.get(parent, -1) > int(match.group(1)):
            kinds.append("older")
            break
    return kinds


def identifiers(query: str) -> list[str]:
    """Identifier-like names in ``query``, by their last part, lower-cased; a one-word
    query is taken as a name too."""
    found = [m.group(0) for m in _IDENTIFIER.finditer(query)]
    words = query.split()
    if not found and len(words) == 1 and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", words[0]):
        found = words
    return [re.split(r"\.|::", name)[-1].lower() for name in found]


class Ranker:
    """Re-ranks fused candidates of one pinned version's rows (path, symbol, kind)."""

    def __init__(self, rows: pa.Table) -> None:
        self.rows = rows
        self._barrels: dict[int, bool] = {}

    @cached_property
    def _files(self) -> tuple[list[int], list[str]]:
        """Each row's file number, and the files' paths."""
        numbers: dict[str, int] = {}
        files = [numbers.setdefault(p, len(numbers)) for p in self.rows.column("path").to_pylist()]
        return files, list(numbers)

    @cached_property
    def _kinds(self) -> list[list[str]]:
        """The prior kinds of each file."""
        _, paths = self._files
        newest: dict[str, int] = {}
        for path in paths:
            parts = PurePosixPath(path).parts
            for depth, part in enumerate(parts[:-1]):
                if match := _VERSION_DIR.fullmatch(part.lower()):
                    parent = "/".join(parts[:depth])
                    newest[parent] = max(newest.get(parent, -1), int(match.group(1)))
        return [file_kinds(path, newest) for path in paths]

    @cached_property
    def _words(self) -> list[set[str]]:
        """The words of each file's name and its parent directory."""
        _, paths = self._files
        out = []
        for path in paths:
            pure = PurePosixPath(path.lower())
            named = f"{pure.parent.name} {pure.stem}".replace("_", " ").replace("-", " ")
            out.append(set(_WORD.findall(re.sub(r"([a-z])([A-Z])", r"\1 \2", named))))
        return out

    @cached_property
    def _definitions(self) -> dict[str, list[int]]:
        """Rows that define a name, by the name's last part, lower-cased."""
        table: dict[str, list[int]] = defaultdict(list)
        for row, (symbol, kind) in enumerate(zip(self.rows.column("symbol").to_pylist(),
                                                 self.rows.column("kind").to_pylist(),
                                                 strict=True)):
            if symbol and kind in _DEFINITIONS:
                table[re.split(r"\.|::", symbol)[-1].lower()].append(row)
        return table

    def rank(self, query: str, fused: Ranking, limit: int,
             ) -> tuple[Ranking, dict[int, Explanation]]:
        """The top ``limit`` rows after the rules above, with why each scored so."""
        if not len(fused):
            return fused, {}
        scores = dict(zip(fused.rows.tolist(), fused.scores.tolist(), strict=True))
        names = identifiers(query)
        top = float(fused.scores[0])
        for name in names:  # definitions the legs missed compete from the top score
            for row in self._definitions.get(name, [])[:20]:
                scores.setdefault(row, top)
        asked = {kind for kind, pattern in _ASKS.items() if pattern.search(query)}
        if "legacy" in asked:
            asked.add("older")
        words = {w for w in _WORD.findall(query.lower()) if w not in _STOP}
        files = self._files[0]
        defined = self._defines(names)
        explained: dict[int, Explanation] = {}
        adjusted: dict[int, float] = {}
        for row, score in scores.items():
            why = Explanation(score)
            file = files[row]
            for kind in self._kinds[file]:
                if kind not in asked:
                    why.factors[f"prior:{kind}"] = PRIORS[kind]
            if "barrel" not in asked and self._barrel(row):
                why.factors["prior:barrel"] = PRIORS["barrel"]
            if row in defined:
                why.factors["defines"] = DEFINITION_BOOST
            named = len(words & self._words[file])
            if named:
                why.factors["file named"] = 1 + FILE_WORD_BOOST * min(named, 2)
            adjusted[row] = score * math.prod(why.factors.values())
            explained[row] = why
        return self._diverse(adjusted, explained, limit), explained

    @cached_property
    def _modules(self) -> list[bool]:
        """Whether each row is a module-level chunk: the only kind a barrel can be."""
        return [kind == "module" for kind in self.rows.column("kind").to_pylist()]

    def _barrel(self, row: int) -> bool:
        if not self._modules[row]:
            return False
        if row not in self._barrels:
            lines = [line for line in self.rows.column("text")[row].as_py().splitlines()
                     if line.strip() and not line.lstrip().startswith(("#", "//", '"""'))]
            reexports = sum(1 for line in lines if _REEXPORT.match(line))
            self._barrels[row] = bool(lines) and reexports >= BARREL_SHARE * len(lines)
        return self._barrels[row]

    def _defines(self, names: list[str]) -> set[int]:
        return {row for name in names for row in self._definitions.get(name, [])}

    def _diverse(self, adjusted: dict[int, float], explained: dict[int, Explanation],
                 limit: int) -> Ranking:
        """Best first, each further chunk of a ranked file scaled by ``SAME_FILE_DECAY``
        once per chunk of that file above it."""
        files = self._files[0]
        pending = sorted(adjusted.items(), key=lambda item: (-item[1], item[0]))
        seen: dict[int, int] = defaultdict(int)
        ranked: list[tuple[int, float]] = []
        for row, score in pending:
            file = files[row]
            if seen[file]:
                decay = SAME_FILE_DECAY ** seen[file]
                explained[row].factors["same file"] = decay
                score *= decay
            seen[file] += 1
            ranked.append((row, score))
        ranked.sort(key=lambda item: (-item[1], item[0]))
        ranked = ranked[:limit]
        return Ranking(np.array([r for r, _ in ranked], np.int64),
                       np.array([s for _, s in ranked], np.float64))
