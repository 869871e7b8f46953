"""The tokens a model's tokenizer makes of texts, counted and cut without full encodings.

The chunker asks how many tokens each chunk and each line of a long chunk make, and the
embed stage needs the token ids of every chunk it keeps. Asked of ``tokenizers`` (which
builds a whole ``Encoding`` per text: ids, offsets, masks), counting was half the CPU
time of a lexical build of the standard library (25 of 50 s), and cutting the chunks
for the model took half of an embedding pass's CPU side outside the model (15 of 30
s), time taken from the model's threads. Written by hand because the shortcut depends
on how a BERT WordPiece tokenizer works (the bundled model's: ``BertNormalizer``,
``BertPreTokenizer``, ``WordPiece``):

- it always splits at ASCII whitespace;
- it makes one token of each ASCII punctuation character;
- its normalizer works character by character.

So a text's ids are its lines' ids joined, and a line's its pieces' (words between ASCII
whitespace and punctuation, and each punctuation character). Lines and pieces are cut
once and remembered: a chunker counts the same lines several times over, and code
repeats lines. An ASCII word of letters and digits is only lowercased before WordPiece,
so the WordPiece model alone cuts it. The ids are exact, not an estimate: tests compare
them with the tokenizer's on real and hostile text. A text holding one of the
tokenizer's added tokens (``[SEP]``, matched before normalization) is tokenized whole;
so is every text for a tokenizer of another kind, or with added tokens matched after
normalization (``add_tokens`` makes those).
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import numpy as np

_PIECE = re.compile(r"[^ \t\n\r!-/:-@\[-`{-~]+|[!-/:-@\[-`{-~]")
"""A word between ASCII whitespace and punctuation, or one ASCII punctuation character."""
_BERT = {"normalizer": "BertNormalizer", "pre_tokenizer": "BertPreTokenizer",
         "model": "WordPiece"}


class TokenCounter:
    """Exact token counts of texts, and their token ids, special tokens not included."""

    REMEMBERED = 1 << 16
    """Distinct lines, and words, whose ids are kept (about 15 MB in all); then they
    are forgotten."""

    def __init__(self, tokenizer: Any) -> None:
        from tokenizers import Tokenizer

        described = json.loads(tokenizer.to_str())
        self._tokenizer = Tokenizer.from_str(tokenizer.to_str())
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self._lines: dict[str, bytes] | None = None
        """Each remembered line's ids, as int32 bytes: a text's are its lines' joined."""
        self._words: dict[str, bytes] = {}
        self._lowercase = bool((described.get("normalizer") or {}).get("lowercase"))
        added_tokens = described.get("added_tokens", [])
        # a normalized added token matches after normalization: only a whole text shows it
        if all((described.get(part) or {}).get("type") == kind for part, kind in _BERT.items()) \
                and not any(token.get("normalized") for token in added_tokens):
            self._lines = {}
            added = [token["content"] for token in added_tokens]
            self._added = re.compile("|".join(map(re.escape, added)) or r"(?!)", re.IGNORECASE)

    def __call__(self, texts: list[str]) -> list[int]:
        joined = self._joined(texts)
        whole = [text for text, ids in zip(texts, joined, strict=True) if ids is None]
        counts = iter([len(e.ids) for e in self._encoded(whole)])
        return [len(ids) // 4 if ids is not None else next(counts) for ids in joined]

    def ids(self, texts: list[str]) -> list[np.ndarray | None]:
        """Each text's token ids (int32), as the tokenizer makes them of it untruncated;
        ``None`` for a text that only a whole tokenization can cut (a tokenizer of
        another kind, an added token): the tokenizer's own batch path, which builds
        whole encodings, took ~4x as long on standard-library chunks."""
        return [None if ids is None else np.frombuffer(ids, np.int32) for ids in
                self._joined(texts)]

    def rows(self, rows: list[str]) -> RowIds | None:
        """The ids of a file's rows, from which those of any run of its rows are sliced;
        ``None`` when only a whole tokenization can cut them (as in ``ids``). A chunker
        asks for the ids of many runs of one file's rows: split and looked up row by row
        for each, they took a fifth of preparing the standard library."""
        if self._lines is None:
            return None
        missing = _missing(self._lines, rows, self.REMEMBERED)
        if any(map(self._added.search, missing)):  # remembered rows hold no added token
            return None
        known = self._learn(missing)
        return RowIds([known[row] for row in rows])

    def _joined(self, texts: list[str]) -> list[bytes | None]:
        """Each text's ids as int32 bytes, joined from its lines'; ``None`` as in ``ids``."""
        if self._lines is None:
            return [None] * len(texts)
        split = [None if self._added.search(text) else text.split("\n") for text in texts]
        rows = [line for lines in split if lines is not None for line in lines]
        known = self._learn(_missing(self._lines, rows, self.REMEMBERED))
        return [None if lines is None else b"".join(map(known.__getitem__, lines))
                for lines in split]

    def _learn(self, missing: list[str]) -> dict[str, bytes]:
        """The remembered lines' ids, ``missing`` (lines not remembered) cut and added."""
        assert self._lines is not None
        found = [_PIECE.findall(row) for row in missing]
        words = self._known_words([word for row in found for word in row])
        self._lines.update((row, b"".join(map(words.__getitem__, pieces)))
                           for row, pieces in zip(missing, found, strict=True))
        return self._lines

    def _known_words(self, words: list[str]) -> dict[str, bytes]:
        """The remembered words' ids, holding every word of ``words``."""
        missing = _missing(self._words, words, self.REMEMBERED)
        # 10x faster than a whole encoding (0.5 against 5 us a word)
        plain = [word for word in missing if word.isascii() and word.isalnum()]
        cut = self._tokenizer.model.tokenize
        self._words.update((word, _packed([t.id for t in cut(
            word.lower() if self._lowercase else word)])) for word in plain)
        other = [word for word in missing if not (word.isascii() and word.isalnum())]
        self._words.update((word, _packed(e.ids))
                           for word, e in zip(other, self._encoded(other), strict=True))
        return self._words

    def _encoded(self, texts: list[str]) -> list[Any]:
        return self._tokenizer.encode_batch(texts, add_special_tokens=False) if texts else []


class RowIds:
    """A file's rows' token ids, joined: the ids of a run of rows are a slice of them."""

    def __init__(self, rows: list[bytes]) -> None:
        self._joined = b"".join(rows)
        self._offsets = [0, *itertools.accumulate(map(len, rows))]
        """Where each row's ids start in ``_joined``, in bytes."""

    def count(self, first: int, stop: int) -> int:
        """The tokens of rows ``first`` up to ``stop`` (excluded)."""
        return (self._offsets[stop] - self._offsets[first]) // 4

    def ids(self, first: int, stop: int) -> np.ndarray:
        """The ids of rows ``first`` up to ``stop`` (excluded), int32."""
        start = self._offsets[first]
        return np.frombuffer(self._joined, np.int32, self.count(first, stop), start)


def _packed(ids: list[int]) -> bytes:
    return np.asarray(ids, np.int32).tobytes()


def _missing(known: dict[str, bytes], keys: list[str], room: int) -> list[str]:
    """The distinct ``keys`` not in ``known``; ``known`` is emptied first when they would
    not fit in ``room``."""
    missing = set(keys).difference(known)
    if len(known) + len(missing) > room:
        known.clear()
        missing = set(keys)
    return list(missing)
