"""A file's lines as the chunker measures them, and the model window it cuts to.

A span's size is its non-whitespace characters (indentation does not eat the budget)
and, where a window is given, the tokens of its lines scaled so the window is worth the
budget (``stages.chunk``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ssindex.records import Chunk


class Window(Protocol):
    """The model's window: chunks are cut to fit in it (``stages.embed.ModelWindow``)."""

    limit: int
    """The tokens a chunk's own text may take (the prompt and special tokens aside)."""

    def fits(self, chunks: list[Chunk], rows: list[str] | None = None) -> list[bool]:
        """Whether each chunk's embedding text fits in the window (``rows``: the lines of
        the chunks' file)."""
        ...

    def line_tokens(self, rows: list[str]) -> list[int]: ...


_SPACES = np.array([code for code in range(0x3001) if chr(code).isspace()], np.uint32)
"""What ``str.split`` splits at: no character above U+3000 is whitespace."""
_ASCII_SPACE = np.isin(np.arange(256), _SPACES[_SPACES < 128])

WINDOW_HEADROOM = 8
"""Tokens of a window the AST split leaves free: for the embed stage's symbol line, and
tokens that straddle line ends."""


@dataclass(frozen=True, slots=True)
class Lines:
    """A file's rows, with the running sums that size any run of them."""

    rows: list[str]
    prefix: list[int]
    """prefix[i] = non-whitespace characters in rows[:i]."""
    token_prefix: list[int] | None = None
    """token_prefix[i] = tokens of rows[:i], each line's counted alone (with a window)."""
    token_weight: float = 0.0
    """Characters a token is worth: the character budget over the window."""

    @classmethod
    def of(cls, text: str, window: Window | None = None, budget: int = 0,
           counted: list[int] | None = None) -> Lines:
        """The lines of ``text``; with a ``window``, the tokens of the ``counted`` rows
        too (the others count none), each worth ``budget`` over the window's limit."""
        rows = text_rows(text)
        prefix = _solid_prefix(text, len(rows))
        if window is None or not counted:
            return cls(rows, prefix)
        tokens = [0] * len(rows)
        for row, count in zip(counted, window.line_tokens([rows[r] for r in counted]),
                              strict=True):
            tokens[row] = count
        target = max(1, window.limit - WINDOW_HEADROOM)
        return cls(rows, prefix, [0, *itertools.accumulate(tokens)], budget / target)

    def size(self, start: int, end: int) -> int:
        chars = self.prefix[end + 1] - self.prefix[start]
        if self.token_prefix is None:
            return chars
        tokens = self.token_prefix[end + 1] - self.token_prefix[start]
        return max(chars, math.ceil(tokens * self.token_weight))


def _solid_prefix(text: str, rows: int) -> list[int]:
    """The non-whitespace characters (``str.split``'s whitespace) in the first ``i`` rows
    of ``text``, for each ``i`` up to ``rows``: counted over the whole text in numpy, as
    summing each row's words in Python took a fifth of chunking."""
    if text.isascii():
        codes = np.frombuffer(text.encode("ascii"), np.uint8)
        solid = np.cumsum(~_ASCII_SPACE[codes])
    else:
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32)
        solid = np.cumsum(~np.isin(codes, _SPACES))
    # a row's count is the running count at its newline (itself whitespace)
    prefix = [0, *solid[np.flatnonzero(codes == 10)[:rows]].tolist()]
    if len(prefix) <= rows:  # a last row without a newline
        prefix.append(int(solid[-1]))
    return prefix


def text_rows(text: str) -> list[str]:
    """The lines of a text, as chunks number them (no empty line after a final newline)."""
    rows = text.split("\n")
    if rows and rows[-1] == "":
        rows.pop()
    return rows
