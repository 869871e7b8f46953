"""Gitignore-style globs as pathspec reads them, and the lines it refuses.

``ignore_spec`` compiles a repository's ignore rules, which are untrusted input: as
pathspec writes them, a segment's stars are ``[^/]*`` runs and a ``**`` between segments
is ``(?:/.+)?``, and Python's regex engine tries every way of sharing a path among them.
``*a*a*a*a*a*a*b`` took a second against one name of 60 ``a``s, and eight stars over a
minute: one ignore line and one file name could hang a build (git's own matcher hangs on
them too). So each star but a segment's last takes the first place the glob after it
matches, in an atomic group, as ``fnmatch`` does, and each ``**`` but the last the first
place its segments match: a later place could only leave the next star less to match, so
no match is lost. That holds where no segment's glob matches a ``/`` and no path holds an
empty segment (a walk's do not). pathspec lets a ``[!x]`` match a ``/``, and git does
not: in a pattern with atomic groups, it does not here either.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import AnyStr, Literal

import pathspec
from pathspec.patterns.gitignore.spec import GitIgnoreSpecPattern

GLOB_ERRORS = (ValueError, re.error)
"""What pathspec raises for a line it refuses: ``!`` is a ValueError, ``[z-a]`` a bad
regex. Git takes both as matching nothing."""


def ignore_spec(lines: Iterable[str]) -> pathspec.GitIgnoreSpec:
    """Git's rules of ``lines``, matched without runaway backtracking (raises one of
    ``GLOB_ERRORS`` for a line pathspec refuses). Python's own regex engine, whatever
    else is installed: pathspec would take ``google-re2`` where it finds it, which
    refuses atomic groups, reads ``[[:alpha:]]`` otherwise, and cannot take the
    surrogates of a name that is not UTF-8."""
    return pathspec.GitIgnoreSpec.from_lines(lines, pattern_factory=_AtomicPattern,
                                             backend="simple")


def glob_fault(line: str) -> str | None:
    """Why pathspec refuses ``line``, one gitignore-style glob (``None``: it takes it)."""
    try:
        ignore_spec([line])
    except GLOB_ERRORS as exc:
        return str(exc)
    return None


class _AtomicPattern(GitIgnoreSpecPattern):
    """pathspec's gitignore pattern, matched without runaway backtracking."""

    @classmethod
    def pattern_to_regex(cls, pattern: AnyStr) -> tuple[AnyStr | None, bool | None]:
        """Each ``**`` but the last (a leading one too) takes the first place the
        segments after it match, in an atomic group: ``a/**/a/**/a/**/a/**/a/**/a/**/b``
        took 6.6 s against one path 80 directories deep, and ``**/a/**/`` followed by
        200 segments 0.79 s against one 2,047 deep. A pattern without atomic groups is
        pathspec's own, its ``[!x]`` free to match a ``/`` as there: which match the
        regex finds decides a rule's priority."""
        regex, include = super().pattern_to_regex(pattern)
        if not isinstance(regex, str):
            return regex, include
        first, *inner = regex.split(_INNER_STARS)
        if inner and first.startswith(_LEADING_STARS):  # a leading ** is one too
            first = f"^(?>(?:.+?/)??{first.removeprefix(_LEADING_STARS)}(?=/))"
        elif len(inner) < 2:
            if _SHARED_STAR not in regex:
                regex = regex.replace(_NOT_SLASH, "")
            return regex, include  # type: ignore[return-value]
        *inner, last = inner
        atomic = "".join(f"(?>(?:/.+?)??{segments}(?=/))" for segments in inner)
        return f"{first}{atomic}{_INNER_STARS}{last}", include  # type: ignore[return-value]

    @staticmethod
    def _translate_segment_glob(pattern: str,
                                range_error: Literal["literal", "raise"]) -> str:
        translate = GitIgnoreSpecPattern._translate_segment_glob
        pieces = [""]  # the regexes of the segment's parts between its stars
        for kind, token in _tokens(pattern):
            if kind == "star":
                pieces.append("")
            elif kind == "negated":  # git's brackets never match a "/"; pathspec's can
                pieces[-1] += _NOT_SLASH + translate(token, range_error)
            else:
                pieces[-1] += translate(token, range_error)
        if len(pieces) < 3:  # one star at most: nothing to share
            return "[^/]*".join(pieces)
        head, *middle, tail = pieces
        return "".join([head, *(f"{_SHARED_STAR}{piece})" for piece in middle), "[^/]*", tail])


_NOT_SLASH = "(?!/)"
"""Put before a negated bracket expression."""
_SHARED_STAR = "(?>[^/]*?"
"""Opens the atomic group of a star that shares a segment with a later one."""
_LEADING_STARS = "^(?:.+/)?"
"""pathspec's regex of a leading ``**``."""
_INNER_STARS = "(?:/.+)?"
"""pathspec's regex of a ``**`` between segments. Each of these four holds a ``/``, which
no segment's glob does: none is found in a regex but where it was put."""


def _tokens(segment: str) -> Iterator[tuple[str, str]]:
    """A segment glob's run of stars, bracket expressions (``negated`` or not) and other
    characters (an escape with the one it escapes), found as pathspec finds them."""
    at = 0
    while at < len(segment):
        char = segment[at]
        if char == "*":
            stop = at + len(segment[at:]) - len(segment[at:].lstrip("*"))
            yield "star", segment[at:stop]
        elif char == "[" and (close := _bracket_end(segment, at)) > 0:
            stop = close + 1
            yield ("negated" if segment[at + 1] in "!^" else "bracket"), segment[at:stop]
        else:
            stop = at + (2 if char == "\\" else 1)
            yield "char", segment[at:stop]
        at = stop


def _bracket_end(segment: str, start: int) -> int:
    """Where the bracket expression opened at ``start`` closes (-1: it does not); a
    first ``]``, after any ``!`` or ``^``, is a member."""
    at = start + 1
    at += at < len(segment) and segment[at] in "!^"
    at += at < len(segment) and segment[at] == "]"
    return segment.find("]", at)
