"""The embedding backend interface, and the encoder that drives any backend.

A backend runs one forward pass over a padded batch of token ids and returns
pooled float32 vectors. Everything else lives once, in ``Encoder``:
tokenization, truncation counting, length-sorted token-budget batching (so
short chunks are not padded to the longest one) and L2 normalization.
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ssindex.backends.model import ModelSpec
from ssindex.errors import BackendExecutionError, map_exceptions
from ssindex.records import Tokens
from ssindex.util import heap

DEFAULT_BATCH_TOKENS = 16384
"""Token budget of one forward pass for a backend that names none."""
WIDTH_STEP = 16
"""Batch widths are rounded up to a multiple of this, and on a CPU a short batch's rows to a
power of two, so a build runs a few dozen batch shapes, not hundreds. Every new shape costs
oneDNN (torch's CPU kernels) a primitive it keeps in a cache of 1,024: on an AMX Xeon
over 12,288 stdlib chunks, unbounded shapes grew RSS by ~28 KB a chunk (920 → 1,259 MB);
a cache of 8 held it to ~8 KB but ran 20% slower, creating primitives each batch."""
TRIM_ROWS = 256
"""Rows a bulk call embeds between heap trims: a 9,587-chunk build peaked at 1,113 MB
trimming once a call of 1,024 chunks, 992 MB trimming after every forward pass, which
took the standard library's build 333 → 400 s on AMX (``util.heap``)."""
BULK_TEXTS = 32
"""An ``encode`` call of at least this many texts is bulk work (a build's batch, not a
query): its freed tensors go back to the OS (``util.heap``)."""


@functools.cache
def runtime_errors() -> tuple[type[Exception], ...]:
    """What the runtimes raise when they cannot run here or fail on a batch: torch's
    ``RuntimeError`` and its kin (and the ``AssertionError`` of a CPU build asked for
    CUDA: "Torch not compiled with CUDA enabled"), ONNX Runtime's own classes (they
    derive from ``Exception`` alone), and missing files, libraries or memory."""
    found: list[type[Exception]] = [RuntimeError, OSError, ImportError, ValueError,
                                    MemoryError, NotImplementedError, AssertionError]
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort
    except ImportError:
        return tuple(found)
    found += [kind for kind in vars(ort).values()
              if isinstance(kind, type) and issubclass(kind, Exception)]
    return tuple(found)


class EmbeddingBackend(Protocol):
    name: str
    device: str
    dtype: str
    batch_tokens: int
    """The token budget of one forward pass this backend runs best at."""

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """Pooled (not yet normalized) float32 vectors, shape (batch, dim)."""
        ...


@dataclass(slots=True)
class EncodeStats:
    texts: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    truncated: int = 0
    """Texts whose tail was cut off (a tokenizer that gave no overflow windows)."""
    windowed: int = 0
    """Texts longer than the window, embedded window by window."""


class Encoder:
    """Texts → float32 unit vectors through one backend.

    ``role`` is ``document`` (chunks) or ``query``: it picks the model's prompt."""

    def __init__(self, backend: EmbeddingBackend, model: ModelSpec, batch_tokens: int = 0,
                 role: str = "document") -> None:
        self.backend = backend
        self.model = model
        self.batch_tokens = batch_tokens or backend.batch_tokens
        """The configured budget, or (0) the backend's own."""
        self.tokenizer = model.tokenizer()
        self.prompt = model.prompt(role)
        self.stats = EncodeStats()
        self._trimmer = heap.Trimmer()
        self._untrimmed = 0
        """Rows of bulk calls embedded since the last heap trim."""
        self.overlap = True
        """Whether the next batch is padded and started before the last one's vectors
        are awaited: a backend with ``submit`` (torch on CUDA) then computes while the
        host pads (``benchmarks/gpu_check.py`` measures both)."""

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.encode_tokens(self.tokenize(texts))

    def tokenize(self, texts: list[str]) -> list[Tokens]:
        return tokenized(self.tokenizer, texts, self.prompt)

    def encode_tokens(self, tokens: list[Tokens]) -> np.ndarray:
        """Unit vectors of texts tokenized by ``tokenize`` (here or in a worker process).
        A text longer than the window is the mean of its windows' unit vectors, weighted
        by their tokens: its tail is read, not cut off."""
        if not tokens:
            return np.zeros((0, self.model.dim), dtype=np.float32)
        self.stats.texts += len(tokens)
        self.stats.truncated += sum(1 for t in tokens if t.truncated and not t.rest)
        self.stats.windowed += sum(1 for t in tokens if t.rest)
        seqs = [t.ids for t in tokens]
        owners = list(range(len(tokens)))
        for row, text in enumerate(tokens):
            seqs += text.rest
            owners += [row] * len(text.rest)
        out = np.empty((len(seqs), self.model.dim), dtype=np.float32)
        bulk = len(tokens) >= BULK_TEXTS
        order = np.argsort([-len(seq) for seq in seqs], kind="stable")
        in_flight: collections.deque[tuple[np.ndarray, Callable[[], np.ndarray]]] = \
            collections.deque()
        for batch, shape in _token_budget_batches([len(seqs[i]) for i in order],
                                                  self.batch_tokens, self.model.window,
                                                  self.backend.device == "cpu"):
            rows = order[batch]
            in_flight.append((rows, self._submit([seqs[i] for i in rows], shape)))
            while len(in_flight) > self.overlap:  # one batch stays in flight, or none
                self._collected(out, in_flight.popleft(), bulk)
        while in_flight:
            self._collected(out, in_flight.popleft(), bulk)
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        if len(seqs) == len(tokens):
            return out
        pooled = np.zeros((len(tokens), self.model.dim), dtype=np.float32)
        np.add.at(pooled, owners, out * np.array([[len(seq)] for seq in seqs], np.float32))
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)

    def _submit(self, seqs: list[np.ndarray], shape: tuple[int, int],
                ) -> Callable[[], np.ndarray]:
        """Start the pass over ``seqs``, run as a batch of ``shape``: rows past
        ``len(seqs)`` repeat the last sequence (a row of padding alone could give NaN)
        and their vectors are dropped by ``_collect``."""
        input_ids = np.full(shape, self.model.pad_id, dtype=np.int64)
        mask = np.zeros(shape, dtype=np.int64)
        for row in range(shape[0]):
            seq = seqs[min(row, len(seqs) - 1)]
            input_ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        self.stats.tokens += sum(len(seq) for seq in seqs)
        self.stats.padded_tokens += mask.size
        with self._failures():
            submit = getattr(self.backend, "submit", None)
            if submit is not None:
                pending: Callable[[], np.ndarray] = submit(input_ids, mask)
                return pending
            vectors = self.backend.forward(input_ids, mask)
        return lambda: vectors

    def _collected(self, out: np.ndarray, batch: tuple[np.ndarray, Callable[[], np.ndarray]],
                   bulk: bool) -> None:
        """``_collect`` a batch; in bulk calls, give the freed tensors back to the OS each
        ``TRIM_ROWS`` rows (``util.heap``)."""
        self._collect(out, *batch)
        if bulk:
            self._untrimmed += len(batch[0])
            if self._untrimmed >= TRIM_ROWS:
                self._untrimmed = 0
                self._trimmer.after_batch()

    def _collect(self, out: np.ndarray, rows: np.ndarray,
                 pending: Callable[[], np.ndarray]) -> None:
        """Wait for a batch's vectors and put them in ``out``'s ``rows``."""
        with self._failures():
            vectors = pending()
        if not np.all(np.isfinite(vectors)):
            raise BackendExecutionError(f"{self.backend.name} produced non-finite vectors")
        out[rows] = vectors[: len(rows), : self.model.dim]  # Matryoshka dims; renormalized later

    def _failures(self) -> contextlib.AbstractContextManager[None]:
        return map_exceptions({runtime_errors(): lambda exc: BackendExecutionError(
            f"{self.backend.name} failed to encode: {exc}")})


def tokenized(tokenizer: Any, texts: list[str], prompt: str = "") -> list[Tokens]:
    """``texts`` through a ``tokenizers.Tokenizer`` (``ModelSpec.tokenizer``), each after
    ``prompt`` (``ModelSpec.prompt``), as sentence-transformers joins them."""
    if prompt:
        texts = [prompt + text for text in texts]
    # a lone query skips the batch path's thread-pool hand-off (~0.1 ms of a search)
    encodings = [tokenizer.encode(texts[0])] if len(texts) == 1 else tokenizer.encode_batch(texts)
    return [Tokens(np.asarray(e.ids, dtype=np.int32), bool(e.overflowing),
                   tuple(np.asarray(o.ids, dtype=np.int32) for o in e.overflowing))
            for e in encodings]


def _token_budget_batches(lengths: list[int], budget: int, window: int,
                          round_rows: bool = True) -> list[tuple[slice, tuple[int, int]]]:
    """Consecutive slices of length-sorted (descending) sequences within a token budget,
    each with the (rows, width) shape it runs as (``WIDTH_STEP``). ``round_rows=False``
    keeps a short batch's rows as they are: on a GPU, where shapes cost no cache and a
    large budget would pad a batch of 4,100 rows to 8,192."""
    batches = []
    start = 0
    while start < len(lengths):
        longest = lengths[start]
        width = max(longest, min(-(-longest // WIDTH_STEP) * WIDTH_STEP, window))
        size = max(1, budget // max(width, 1))
        count = min(size, len(lengths) - start)
        rows = min(size, 1 << (count - 1).bit_length()) if round_rows else count
        batches.append((slice(start, start + count), (rows, width)))
        start += count
    return batches
