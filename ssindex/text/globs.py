"""Gitignore-style globs as pathspec reads them, and the lines it refuses."""

from __future__ import annotations

import re

import pathspec

GLOB_ERRORS = (ValueError, re.error)
"""What pathspec raises for a line it refuses: ``!`` is a ValueError, ``[z-a]`` a bad
regex. Git takes both as matching nothing."""


def glob_fault(line: str) -> str | None:
    """Why pathspec refuses ``line``, one gitignore-style glob (``None``: it takes it)."""
    try:
        pathspec.GitIgnoreSpec.from_lines([line])
    except GLOB_ERRORS as exc:
        return str(exc)
    return None
