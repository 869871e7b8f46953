"""Identifier-aware analysis for the lexical (BM25) leg.

General full-text tokenizers stem English and drop stop words, and none splits
``camelCase``: poor for code. So ssindex analyzes text itself, and its own BM25
postings (``ssindex.index.postings``) index the result as whitespace-separated
terms (no stemming, no stop words). An identifier yields itself, lower-cased, plus
its parts: ``parseEmailAddress`` → ``parseemailaddress parse email address``
and ``parse_email`` → ``parse_email parse email``. Queries go through the same
analysis, so ``parseaddr``, ``parse addr`` and ``parse_addr`` all match.
"""

from __future__ import annotations

import re
from functools import lru_cache

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")
_IDENTIFIER_HINT = re.compile(r"[a-z][A-Z]|_|\.\w|\(|::|->")
_PARTS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
MAX_TOKEN_CHARS = 40
ANALYZER_VERSION = 2
"""Bumped whenever indexed terms change: part of the settings fingerprint."""


@lru_cache(maxsize=262_144)
def _expand(word: str) -> str:
    """One identifier's terms, space-joined (cached: code repeats its identifiers)."""
    whole = word.strip("_").lower()
    if not whole or len(whole) > MAX_TOKEN_CHARS:
        return ""
    parts = _PARTS.findall(word)
    if len(parts) > 1:
        return " ".join([whole, *(part.lower() for part in parts)])
    return whole


def analyze(text: str) -> str:
    """Index terms of ``text``: identifiers and their camel/snake parts, lower-cased."""
    return " ".join(filter(None, map(_expand, _IDENTIFIER.findall(text))))


def terms(text: str) -> list[str]:
    return analyze(text).split()


def exact_symbol_term(name: str) -> str:
    """One token for a symbol's own name, exactly (``Parser.__init__`` → ``sym:__init__``),
    so that a query naming a symbol finds its definition above its mere uses."""
    return "sym:" + name.rsplit(".", 1)[-1].lower()[:MAX_TOKEN_CHARS]


def query_terms(query: str) -> str:
    """A query's index terms; a lone identifier also asks for the exact symbol token."""
    words = analyze(query)
    stripped = query.strip().rstrip("()")
    if stripped and " " not in stripped and _IDENTIFIER.fullmatch(stripped.rsplit(".", 1)[-1]):
        words = f"{words} {exact_symbol_term(stripped)}"
    return words


def names_identifier(query: str) -> bool:
    """Whether ``query`` looks like it names code (``parse_addr``, ``HTTPServer.serve``,
    one bare word) rather than asking a question in natural language."""
    return len(query.split()) <= 1 or _IDENTIFIER_HINT.search(query) is not None
