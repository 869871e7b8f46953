"""Embed: float32 unit vectors for chunks, each distinct content embedded once.

What the model sees for a chunk is ``embedding_text``: the chunk's code,
under a one-line header ``"<kind> <symbol>"`` (e.g. ``method Parser.feed``)
when the chunk is a piece of a symbol whose name it does not itself show, such
as the middle of a long method. Chunks that show their own definition, and
module-level chunks, are embedded as they are: on CoSQA a redundant header
cost 0.006 MRR@10. The header holds no path on purpose: a
chunk's vector then depends on its content alone, so copied and renamed
files cost no embedding and incremental builds equal clean ones. Paths are
matched by the lexical leg instead.

Vectors are reused, in this order, from: the exemplar of a duplicate
(``dup_of``), then the previous index (``reuse``, keyed by ``embed_key``),
and only then computed. A build without an encoder (``--no-embed``) only
reuses: the chunks it finds no vector for stay without one (``vector`` is
``None``), searchable by the lexical leg until a later build embeds them.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import xxhash

from ssindex.backends.base import tokenized
from ssindex.backends.counter import RowIds, TokenCounter
from ssindex.backends.model import ModelSpec
from ssindex.codec import dequantize_matrix, quantize_matrix
from ssindex.config import Quantization
from ssindex.records import Chunk, IndexedChunk, Tokens


class TextEncoder(Protocol):
    """What the embed stage needs: unit vectors for texts (``pipeline.encoder``)."""

    def encode(self, texts: list[str]) -> np.ndarray: ...

    def encode_tokens(self, tokens: list[Tokens]) -> np.ndarray:
        """Vectors of texts already tokenized with the model's tokenizer."""
        ...


Reuse = Callable[[list[str]], dict[str, np.ndarray]]
"""Looks up embed keys in a previous index; returns the vectors it has."""


class Exemplars:
    """The vectors a later duplicate may take: every fresh chunk's, kept as the index will
    store them, ``method``'s codes and scale, in one array a batch (a float32 vector each
    held the standard library's build ~90 MB, 1.3 KB a chunk; codes and a scale in a dict
    of bytes, ~600 B; in arrays, ~0.5 KB with the id's slot). A duplicate gets its
    exemplar's vector decoded, which quantizes back to the same codes."""

    def __init__(self, method: Quantization) -> None:
        self._method = method
        self._dim = 0
        self._slot: dict[str, int] = {}
        """Each kept id's row in the blocks, counted across them; -1 for no vector."""
        self._starts: list[int] = []
        self._blocks: list[tuple[np.ndarray, np.ndarray]] = []
        self._rows = 0

    def keep(self, ids: list[str], vectors: list[np.ndarray | None]) -> None:
        present = [i for i, vector in enumerate(vectors) if vector is not None]
        self._slot.update((ids[i], -1) for i, vector in enumerate(vectors) if vector is None)
        if not present:
            return
        matrix = np.stack([vector for vector in vectors if vector is not None])
        self._dim = matrix.shape[1]
        self._starts.append(self._rows)
        self._blocks.append(quantize_matrix(matrix, self._method))
        self._slot.update((ids[i], self._rows + row) for row, i in enumerate(present))
        self._rows += len(present)

    def vector(self, chunk_id: str) -> np.ndarray | None:
        slot = self._slot[chunk_id]
        if slot < 0:
            return None
        block = bisect.bisect_right(self._starts, slot) - 1
        codes, scales = self._blocks[block]
        row = slot - self._starts[block]
        return dequantize_matrix(codes[row:row + 1], scales[row:row + 1], self._method,
                                 self._dim)[0]


@dataclass(slots=True)
class EmbedStats:
    embedded: int = 0
    reused: int = 0
    copied_from_exemplar: int = 0


def embedding_text(chunk: Chunk) -> str:
    header = _header(chunk)
    return chunk.text if header is None else f"{header}\n{chunk.text}"


def _header(chunk: Chunk) -> str | None:
    """The line above a chunk's code in its embedding text, if it has one."""
    if chunk.kind == "module" or chunk.symbol.rsplit(".", 1)[-1] in chunk.text:
        return None
    return f"{chunk.kind} {chunk.symbol}"


class ModelWindow:
    """The window chunks are cut to: what the model reads of a document's embedding
    text. The chunker asks it whether texts fit (their tokens counted, not encoded:
    ``TokenCounter``); the tokens of the chunks it keeps are measured once, for the
    embed stage.

    ``fitting`` (``VectorCache.fitting``) names the embed keys whose text an earlier
    build measured to fit: those are not tokenized again. A second worktree spent most
    of its build tokenizing chunks only to learn that they fit, for vectors the shared
    cache already held."""

    def __init__(self, model: ModelSpec,
                 fitting: Callable[[list[str]], set[str]] | None = None) -> None:
        self._tokenizer = model.tokenizer()
        self._prompt = model.prompt("document")
        prompt = self._tokenizer.encode(self._prompt, add_special_tokens=False).ids \
            if self._prompt else []
        special = self._tokenizer.num_special_tokens_to_add(False)
        self._capacity = model.window - special
        """Tokens of a document's prompt and text that the window holds."""
        self.limit = max(1, self._capacity - len(prompt))
        self._count = TokenCounter(self._tokenizer)
        self._specials = None if self._prompt else _specials(self._tokenizer)
        self._model_key = model.key
        self._fitting = fitting
        self._counted: tuple[list[str], RowIds | None] = ([], None)
        """The rows last counted, and their ids: a file's are asked for by the chunker
        and again for its chunks' tokens."""

    def measure(self, chunks: list[Chunk]) -> list[Tokens]:
        """Each chunk's embedding text as the model's tokenizer cuts it."""
        return tokenized(self._tokenizer, [embedding_text(c) for c in chunks], self._prompt)

    def fits(self, chunks: list[Chunk], rows: list[str] | None = None) -> list[bool]:
        """Whether each chunk's embedding text fits the window; ``rows``, the lines of
        the chunks' file, lets their tokens be counted from the rows'."""
        counted = None if rows is None else self._rows(rows)
        if rows is None or counted is None:
            counts = self._count([self._prompt + embedding_text(c) for c in chunks])
            return [count <= self._capacity for count in counts]
        runs = [self._head(c, rows) for c in chunks]
        heads = iter(self._count([head for head, _ in runs if head]))
        return [(next(heads) if head else 0) + counted.count(first, c.end_line)
                <= self._capacity for (head, first), c in zip(runs, chunks, strict=True)]

    def _head(self, chunk: Chunk, rows: list[str]) -> tuple[str, int]:
        """The line the prompt runs into (the header, or the chunk's first row; none
        without a prompt or header), and the first row counted after it."""
        first = chunk.start_line - 1
        header = _header(chunk)
        if header is not None:
            return self._prompt + header, first
        if self._prompt:
            return self._prompt + rows[first], first + 1
        return "", first

    def tokens(self, chunks: list[Chunk], rows: list[str] | None = None,
               ) -> list[Tokens | None]:
        """Each chunk's tokens; ``None`` for a text the cache knows to fit (its vector
        is cached, so no tokens are needed). ``rows`` as in ``fits``."""
        texts = [embedding_text(c) for c in chunks]
        fit = self._known_to_fit(texts)
        counted = None if rows is None or self._specials is None else self._rows(rows)
        if counted is None:  # each distinct text measured once
            missing = [text for text in dict.fromkeys(texts) if text not in fit]
            joined: list[np.ndarray | None] = self._count.ids(missing) \
                if self._specials is not None else [None] * len(missing)
            measured = dict(zip(missing, self._cut(missing, joined), strict=True))
            return [measured.get(text) for text in texts]
        measuring = [at for at, text in enumerate(texts) if text not in fit]
        cut = iter(self._cut([texts[at] for at in measuring],
                             self._joined([chunks[at] for at in measuring], counted)))
        return [None if text in fit else next(cut) for text in texts]

    def _rows(self, rows: list[str]) -> RowIds | None:
        if self._counted[0] != rows:
            self._counted = (rows, self._count.rows(rows))
        return self._counted[1]

    def _joined(self, chunks: list[Chunk], counted: RowIds) -> list[np.ndarray | None]:
        """Each chunk's embedding text's ids (no prompt: ``_cut`` needs none), its
        header's followed by its rows' (``None``: a header only a whole tokenization
        cuts)."""
        headers = [_header(c) for c in chunks]
        heads = iter(self._count.ids([header for header in headers if header]))
        joined: list[np.ndarray | None] = []
        for header, c in zip(headers, chunks, strict=True):
            body = counted.ids(c.start_line - 1, c.end_line)
            head = next(heads) if header else _NONE
            joined.append(None if head is None else np.concatenate([head, body]))
        return joined

    def _cut(self, texts: list[str], joined: list[np.ndarray | None]) -> list[Tokens]:
        """``measure`` of texts: a text that fits the window takes its ``joined`` ids
        (the token counter's, joined from its lines': the same ids, cut ~4x faster), the
        rest are tokenized whole."""
        whole = [text for text, ids in zip(texts, joined, strict=True)
                 if ids is None or len(ids) > self._capacity]
        cut = iter(tokenized(self._tokenizer, whole, self._prompt) if whole else [])
        opening, closing = self._specials or (_NONE, _NONE)
        return [Tokens(np.concatenate([opening, ids, closing]), False)
                if ids is not None and len(ids) <= self._capacity else next(cut)
                for ids in joined]

    def line_tokens(self, rows: list[str]) -> list[int]:
        return self._count(rows)

    def _known_to_fit(self, texts: list[str]) -> set[str]:
        if self._fitting is None:
            return set()
        keys = {_text_key(self._model_key, text): text for text in dict.fromkeys(texts)}
        return {keys[key] for key in self._fitting(list(keys))}


_NONE = np.zeros(0, np.int32)


def _specials(tokenizer: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """The special tokens the tokenizer puts before and after a text's own (BERT's
    ``[CLS]`` and ``[SEP]``); ``None`` when its template does not keep a text's tokens
    whole between them."""
    marked = tokenizer.encode("a").ids
    bare = tokenizer.encode("a", add_special_tokens=False).ids
    for at in range(len(marked) - len(bare) + 1):
        if marked[at:at + len(bare)] == bare:
            return (np.asarray(marked[:at], np.int32),
                    np.asarray(marked[at + len(bare):], np.int32))
    return None


def embed_key(chunk: Chunk, model_key: str) -> str:
    """Identity of a vector: model, its settings, and the exact text embedded."""
    return _text_key(model_key, embedding_text(chunk))


def _text_key(model_key: str, text: str) -> str:
    return xxhash.xxh3_128_hexdigest(f"{model_key}\0{text}".encode())


def embed(
    batches: Iterable[list[IndexedChunk]],
    encoder: TextEncoder | None,
    model_key: str,
    stats: EmbedStats,
    reuse: Reuse | None = None,
    checkpoint: Callable[[list[str], np.ndarray], None] | None = None,
    fitted: Callable[[list[str]], None] | None = None,
    quantization: Quantization = "none",
    call_chunks: int = 0,
) -> Iterator[list[IndexedChunk]]:
    """Give every chunk a vector; duplicates get their exemplar's, as ``quantization``
    stores it (``Exemplars``). Batches go to the encoder together until they hold
    ``call_chunks`` chunks (0: one at a time): it sorts a call's texts by length, so a
    wider call pads less. ``checkpoint`` receives each call's freshly computed vectors
    (for resuming a killed build), ``fitted`` the keys of the chunks whose tokens show
    that they fit the window. Without an ``encoder``, only reused vectors are given."""
    exemplars = Exemplars(quantization)
    for call in _calls(batches, call_chunks):
        fresh = [row for batch in call for row in batch if row.dup_of is None]
        keys = [row.stored["embed_key"] if row.stored is not None else
                row.key or embed_key(row.chunk, model_key) for row in fresh]
        found = reuse(keys) if reuse is not None else {}
        missing = [(row, key) for row, key in zip(fresh, keys, strict=True)
                   if key not in found] if encoder is not None else []
        if fitted is not None:  # before the vectors go to the cache, whose eviction of
            # them (a call can pass a small cache's bound) then takes their fits too
            fitted([key for row, key in zip(fresh, keys, strict=True)
                    if row.tokens is not None and not row.tokens.truncated])
        computed: dict[str, np.ndarray] = {}
        if encoder is not None and missing:
            vectors = _vectors(encoder, [row for row, _ in missing])
            if checkpoint is not None:
                checkpoint([key for _, key in missing], vectors)
            computed = {key: vector for (_, key), vector in zip(missing, vectors, strict=True)}
        for row, key in zip(fresh, keys, strict=True):
            row.vector = found[key] if key in found else computed.get(key)
        exemplars.keep([row.chunk.id for row in fresh], [row.vector for row in fresh])
        stats.embedded += len(missing)
        stats.reused += sum(key in found for key in keys)
        for batch in call:
            for row in batch:
                row.tokens = None
                if row.dup_of is not None:
                    row.vector = exemplars.vector(row.dup_of)
                    stats.copied_from_exemplar += row.vector is not None
            yield batch


def _calls(batches: Iterable[list[IndexedChunk]], call_chunks: int,
           ) -> Iterator[list[list[IndexedChunk]]]:
    """Consecutive batches, grouped until a group holds ``call_chunks`` chunks. The groups
    follow from the batches alone, so a resumed build of the same call width meets the
    calls a killed one checkpointed whole, and the others' vectors are those of a build
    never killed."""
    call: list[list[IndexedChunk]] = []
    held = 0
    for batch in batches:
        call.append(batch)
        held += len(batch)
        if held >= call_chunks:
            yield call
            call, held = [], 0
    if call:
        yield call


def _vectors(encoder: TextEncoder, rows: list[IndexedChunk]) -> np.ndarray:
    """The rows' vectors, from their tokens when a worker tokenized them all."""
    tokens = [row.tokens for row in rows if row.tokens is not None]
    if len(tokens) == len(rows):
        return encoder.encode_tokens(tokens)
    return encoder.encode([embedding_text(row.chunk) for row in rows])
