"""Search filters: which rows a search may return, decided before either leg ranks.

A filter is a row mask. The dense leg scans (or shortlists) only the rows it lets
through, the lexical leg zeroes every other row's BM25 score, and the ranking stage
adds no definition it blocks, so the top ``k`` is the top ``k`` of the filtered rows
rather than what is left of an unfiltered top ``k``.

Paths and symbols are matched once per distinct value, with RE2 through pyarrow (a
gitignore glob over 100k distinct paths: ~11 ms; per path in Python with pathspec:
~100 ms), and each filter's mask is kept (the ``MASKS`` most recent), so a scope that an
agent searches again and again costs a few array operations per query.
"""

from __future__ import annotations

import functools
import re
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa

from ssindex.errors import ConfigError
from ssindex.query.conventions import ASKS
from ssindex.stages.symbols import CHUNK_KINDS
from ssindex.text.languages import LANGUAGES, language_named
from ssindex.util.arrays import distinct, flags

TEST_MODES = ("include", "only", "exclude")
MASKS = 32
"""Filters whose row masks a searcher keeps."""


def _values(items: Iterable[str] | None, option: str) -> tuple[str, ...]:
    """Repeated or comma-separated option values, stripped, in order, without repeats.
    An option given only empty values (``--lang ""``, an unset shell variable) is a
    ``ConfigError``: dropping them would silently search without the filter asked for."""
    given = list(items or ())
    found = [part.strip() for item in given for part in item.split(",")]
    values = tuple(dict.fromkeys(part for part in found if part))
    if given and not values:
        raise ConfigError(f"--{option} {' '.join(map(repr, given))} names nothing: give a "
                          f"value, or leave --{option} out")
    return values


@dataclass(frozen=True)
class Filters:
    """What a search may return; the defaults let every row through."""

    paths: tuple[str, ...] = ()
    """gitignore-style globs: only files that one selects (``src/``, ``*.go``, ``!src/gen/``)."""
    excludes: tuple[str, ...] = ()
    """gitignore-style globs: no file that one selects."""
    languages: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    symbol: str | None = None
    """A chunk's symbol, whole or its last part (``serve`` of ``HTTPServer.serve``);
    a trailing ``*`` makes it a prefix."""
    tests: str = "include"
    """``include`` test code, search ``only`` it, or ``exclude`` it (``ssindex.text.roles``)."""

    @classmethod
    def of(cls, paths: Iterable[str] | None = None, excludes: Iterable[str] | None = None,
           languages: Iterable[str] | None = None, kinds: Iterable[str] | None = None,
           symbol: str | None = None, tests: str | None = None) -> Filters:
        """Filters from option values (lists, each value possibly comma-separated),
        checked: an unknown language, kind or test mode is a ``ConfigError`` that lists
        the known ones."""
        named = []
        for language in _values(languages, "lang"):
            if (known := language_named(language)) is None:
                raise ConfigError(f"unknown language {language!r} (known: "
                                  f"{', '.join(sorted(LANGUAGES))})")
            named.append(known)
        wanted = tuple(kind.lower() for kind in _values(kinds, "kind"))
        if unknown := [kind for kind in wanted if kind not in CHUNK_KINDS]:
            raise ConfigError(f"unknown kind {unknown[0]!r} (known: "
                              f"{', '.join(sorted(CHUNK_KINDS))})")
        if tests is not None and tests not in TEST_MODES:
            raise ConfigError(f"--tests must be one of {', '.join(TEST_MODES)}")
        if symbol is not None and ("*" in symbol.rstrip("*") or not symbol.strip("*").strip()):
            raise ConfigError(f"--symbol {symbol!r}: a name, or a name's start and one "
                              "trailing * (parse*)")
        built = cls(_values(paths, "path"), _values(excludes, "exclude"),
                    tuple(dict.fromkeys(named)), wanted, symbol.strip() if symbol else None,
                    tests or "include")
        for globs in (built.paths, built.excludes):
            compiled(globs)  # a bad glob is the user's error now, not mid-search
        return built

    @property
    def active(self) -> bool:
        return self != Filters()

    def asked(self) -> set[str]:
        """The kinds of file (``ssindex.query.conventions.ASKS``) these filters select,
        whose ranking priors then do not apply: ``--tests only``, ``--path docs/``."""
        said = " ".join([*self.paths, *self.languages])
        kinds = {kind for kind, pattern in ASKS.items() if pattern.search(said)}
        return kinds | {"test"} if self.tests == "only" else kinds

    def as_json(self) -> dict[str, object]:
        """The filters that are set, by field."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) not in (f.default, ())}


@functools.lru_cache(maxsize=MASKS)
def compiled(globs: tuple[str, ...]) -> tuple[tuple[bool, str], ...]:
    """Each gitignore-style glob as (selects, RE2-compatible regex), in order: a later
    ``!glob`` takes back what an earlier one selected, as in a ``.gitignore``."""
    import pathspec

    from ssindex.text.globs import GLOB_ERRORS

    try:
        # Python's engine, as ignore_spec: re2 (where installed) refuses some globs
        spec = pathspec.GitIgnoreSpec.from_lines(globs, backend="simple")
    except GLOB_ERRORS as exc:
        raise ConfigError(f"bad path glob: {exc}") from exc
    return tuple((bool(p.include), p.regex.pattern) for p in spec.patterns
                 if p.include is not None and p.regex is not None)


class RowFilter:
    """Row masks of one pinned version's rows (path, language, kind, symbol, is_test)."""

    def __init__(self, rows: pa.Table) -> None:
        self.rows = rows
        self._masks: OrderedDict[Filters, np.ndarray] = OrderedDict()
        self._encoded: dict[str, tuple[pa.Array, np.ndarray]] = {}

    def mask(self, filters: Filters) -> np.ndarray | None:
        """The rows ``filters`` let through (``None``: every row)."""
        if not filters.active:
            return None
        if filters in self._masks:
            self._masks.move_to_end(filters)
            return self._masks[filters]
        mask = np.ones(len(self.rows), bool)
        if filters.paths:
            mask &= self._matching("path", compiled(filters.paths))
        if filters.excludes:
            mask &= ~self._matching("path", compiled(filters.excludes))
        if filters.languages:
            mask &= self._among("language", filters.languages)
        if filters.kinds:
            mask &= self._among("kind", filters.kinds)
        if filters.symbol:
            name = re.escape(filters.symbol.rstrip("*"))
            pattern = (rf"^{name}|(?:^|[.:]){name}[^.:]*$" if filters.symbol.endswith("*")
                       else rf"(?:^|[.:]){name}$")
            mask &= self._matching("symbol", [(True, pattern)])
        if filters.tests != "include":
            tests = flags(self.rows.column("is_test"))
            mask &= tests if filters.tests == "only" else ~tests
        self._masks[filters] = mask
        if len(self._masks) > MASKS:
            self._masks.popitem(last=False)
        return mask

    def _matching(self, column: str, patterns: Iterable[tuple[bool, str]]) -> np.ndarray:
        """Rows whose ``column`` value the patterns select (the last that matches decides)."""
        import pyarrow.compute as pc  # here: a search without filters never needs it (~0.1 s)

        values, indices = self.encoding(column)
        selected = np.zeros(len(values), bool)
        for selects, pattern in patterns:
            matched = flags(pc.match_substring_regex(values, pattern))
            selected = selected | matched if selects else selected & ~matched
        return selected[indices]

    def _among(self, column: str, wanted: tuple[str, ...]) -> np.ndarray:
        values, indices = self.encoding(column)
        return np.array([value in wanted for value in values.to_pylist()], bool)[indices]

    def encoding(self, column: str) -> tuple[pa.Array, np.ndarray]:
        """``column``'s distinct values and each row's index into them, kept: context
        lines (``ssindex.query.excerpt``) number files by the same encoding of ``path``."""
        if column not in self._encoded:
            self._encoded[column] = distinct(self.rows.column(column))
        return self._encoded[column]
