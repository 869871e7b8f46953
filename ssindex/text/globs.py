"""Gitignore-style globs as pathspec reads them, and the lines it refuses.

``ignore_spec`` compiles a repository's ignore rules, which are untrusted input: as
pathspec writes them, a segment's stars are ``[^/]*`` runs, and Python's regex engine
tries every way of sharing a name among them. ``*a*a*a*a*a*a*b`` took a second against
one name of 60 ``a``s, and eight stars over a minute: one ignore line and one file name
could hang a build (git's own matcher hangs on them too). So each star but a segment's
last matches up to the first place the glob after it does, in an atomic group, as
``fnmatch`` does: a later place could only leave the next star less to match, so no
match is lost. Where pathspec lets a ``[!x]`` match a ``/``, this matches as git does.
``**`` between segments is left as pathspec writes it: it backtracks over a path's
depth, not a name's length.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

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
    """pathspec's gitignore pattern, its segments' stars matched without backtracking."""

    @staticmethod
    def _translate_segment_glob(pattern: str,
                                range_error: Literal["literal", "raise"]) -> str:
        translate = GitIgnoreSpecPattern._translate_segment_glob
        parts = _between_stars(pattern)
        if len(parts) < 3:  # one star at most: nothing to share
            return translate(pattern, range_error)
        head, *middle, tail = parts
        atomic = "".join(f"(?>[^/]*?{translate(piece, range_error)})" for piece in middle)
        return f"{translate(head, range_error)}{atomic}[^/]*{translate(tail, range_error)}"


def _between_stars(segment: str) -> list[str]:
    """The parts of a segment glob between its runs of unescaped stars outside bracket
    expressions (found as pathspec finds them); one part where it has no star."""
    parts: list[str] = []
    start = at = 0
    while at < len(segment):
        char = segment[at]
        if char == "\\":
            at += 2
        elif char == "[":
            close = at + 1
            close += close < len(segment) and segment[close] in "!^"
            close += close < len(segment) and segment[close] == "]"
            close = segment.find("]", close)
            at = at + 1 if close < 0 else close + 1
        elif char == "*":
            parts.append(segment[start:at])
            while at < len(segment) and segment[at] == "*":
                at += 1
            start = at
        else:
            at += 1
    return [*parts, segment[start:]]
