"""The build's lazy encoder: no model is loaded until a chunk needs a vector.

Four notions meet here, from the runtime up: an ``EmbeddingBackend`` runs one forward
pass; an ``Encoder`` tokenizes, batches and normalizes over a backend; a
``TextEncoder`` is what the embed stage asks for (texts in, vectors out); and
``LazyEncoder`` is the build's ``TextEncoder``, which picks and loads a backend on
first use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading

import numpy as np

from ssindex.backends.base import Encoder, EncodeStats, runtime_errors
from ssindex.backends.inventory import detect
from ssindex.backends.model import ModelSpec
from ssindex.backends.selector import BackendReport, Selection, select
from ssindex.backends.torch_backend import TorchBackend
from ssindex.config import BuildConfig, Quantization
from ssindex.pipeline.progress import Progress
from ssindex.records import Tokens

SMALL_EMBED_LIMIT = 256
"""An incremental build embedding at most this many chunks, of at most this many changed
files, uses the query backend."""
SMALL_EMBED_LIMIT_BF16 = 32
"""The same, on CPUs with fast bf16 (AMX, AVX512-BF16). Measured on an AMX Xeon on one
thread (``ssindex watch``'s default there): the query backend embedded stdlib chunks in
~85 ms each, the bulk backend's bf16 model in ~12 ms after ~3 s to load torch, so the
bulk backend pays from ~40 chunks on. A 200-file branch switch's build took 20.0 s
with the move at 256 chunks, 12.6 s at 64 and 10.2 s at 32; 8.5 s once torch loaded while
the files were chunked (``prepare``)."""
COMPILE_MIN_CHUNKS = 20_000
"""In auto mode, a build compiles its bf16 CPU model when it has at least this many
chunks to embed. On an AMX Xeon, compiling took 13-20 s (cached kernels, or none) and
then saved 1.2 ms a chunk (220 against 174 chunks/s), so it repays itself past ~15,000."""
LARGE_CALL_CHUNKS = 2048
"""Chunks a build of at least ``COMPILE_MIN_CHUNKS`` hands the encoder in one call. The
encoder sorts a call's texts by length into batches of one width, so a wider call pads
less and runs fewer short batches: on an AMX Xeon, compiled bf16, 4,096 stdlib chunks ran
at 277 chunks/s in calls of 256 (10.6% padding), 290 in 512, 296 in 1,024 and 303 in
2,048 (5.4%). A text's vector depends on its batch's shape in the last bits, so this
follows the compile, which changes them too; a smaller build keeps calls of one batch,
and its partial versions come as often as ``commit.every_chunks`` asks."""


class EncoderPool:
    """Encoders kept loaded across the builds of one long-lived process (``ssindex
    watch``), so a one-file rebuild does not load a backend again."""

    def __init__(self) -> None:
        self._loaded: dict[tuple[str, str, str | None], tuple[Selection, Encoder]] = {}

    def get(self, key: tuple[str, str, str | None]) -> tuple[Selection, Encoder] | None:
        return self._loaded.get(key)

    def keep(self, key: tuple[str, str, str | None], selection: Selection,
             encoder: Encoder) -> None:
        self._loaded[key] = (selection, encoder)


class LazyEncoder:
    """Selects and loads a backend only when a chunk really needs embedding, so a
    rebuild that reuses every vector never loads a model.

    An incremental build starts on the ``embed_query`` backend (ONNX Runtime on a
    CPU: ready in a fraction of a second, where loading torch takes seconds) and
    moves to the ``embed_bulk`` backend once it has more than ``SMALL_EMBED_LIMIT``
    chunks to embed (``SMALL_EMBED_LIMIT_BF16`` where bf16 is fast). Both agree to
    cosine ≥ 0.999 (see the backend tests)."""

    def __init__(self, model: ModelSpec, cfg: BuildConfig, explicit: str | None,
                 progress: Progress, incremental: bool = False, embeds: bool = True,
                 expected: int = 0, pool: EncoderPool | None = None) -> None:
        self.model = model
        self.embeds = embeds
        """``False`` for a ``--no-embed`` build: loading a backend is then a bug."""
        self.expected = expected
        """How many chunks the build will embed, when known beforehand (else 0)."""
        self.quantization: Quantization = cfg.quantization
        self._cfg = cfg
        self._explicit = explicit
        self._progress = progress
        self._phase = "embed_query" if incremental and not explicit else "embed_bulk"
        self._embedded = 0
        self.stats = EncodeStats()
        self.selection: Selection | None = None
        self.encoder: Encoder | None = None
        self._loading: list[threading.Thread] = []
        self._pool = pool if pool is not None else EncoderPool()
        self._changed = 0
        """Changed files met so far (``prepare``)."""
        self._loads = threading.Lock()
        """Held while an encoder loads: a load waits for one in flight, never repeats it."""
        self._ahead = False
        """Whether ``load_ahead`` was asked: the build needs the backend whatever it embeds."""

    @property
    def large(self) -> bool:
        """Whether the build has ``COMPILE_MIN_CHUNKS`` to embed: it then compiles (where
        that repays) and embeds in wide calls."""
        return self.expected >= COMPILE_MIN_CHUNKS

    @property
    def call_chunks(self) -> int:
        """Chunks the embed stage hands over in one call (``LARGE_CALL_CHUNKS``; 0: a
        batch at a time)."""
        return LARGE_CALL_CHUNKS if self.large else 0

    def encode(self, texts: list[str]) -> np.ndarray:
        return self._ready(len(texts)).encode(texts) if texts else self._none()

    def encode_tokens(self, tokens: list[Tokens]) -> np.ndarray:
        return self._ready(len(tokens)).encode_tokens(tokens) if tokens else self._none()

    def _none(self) -> np.ndarray:
        return np.zeros((0, self.model.dim), dtype=np.float32)

    def _ready(self, count: int) -> Encoder:
        """The encoder for ``count`` more texts: the bulk one once there are many."""
        self._settle()
        self._embedded += count
        if self._phase == "embed_query" and max(self._embedded, self._changed) \
                > self._small_limit:
            self._phase, self.encoder = "embed_bulk", None
        return self.load()

    @functools.cached_property
    def _small_limit(self) -> int:
        """Chunks past which an incremental build moves to the bulk backend."""
        return SMALL_EMBED_LIMIT_BF16 if detect(with_torch=False).bf16_fast \
            else SMALL_EMBED_LIMIT

    def prepare(self) -> None:
        """Note a changed file, and start loading the backend its chunks will need in a
        background thread. An incremental build calls this on meeting each changed file:
        the first starts loading its backend (~0.4 s for ONNX Runtime), so that the load
        overlaps the walk and dedupe instead of following them; the one past
        ``_small_limit`` starts loading the bulk backend (~3 s for torch), which that many
        files' new chunks move the build to. A failure there is left for ``load`` to
        meet again, in the caller's thread."""
        self._changed += 1
        if self._changed == 1 and self.encoder is None:
            self._in_background(self._phase)
        elif self._changed == self._small_limit + 1 and self._phase == "embed_query":
            self._in_background("embed_bulk")

    def load_ahead(self) -> None:
        """Start loading the backend now, in a background thread, for a build that will
        need it (an explicit one): importing torch took the driver ~1 s before its
        worker processes started, where it can overlap their start. A failure there is
        left for ``settle_ahead`` (or ``load``) to meet again, in the caller's thread."""
        self._ahead = True
        if self.encoder is None:
            self._in_background(self._phase)

    def settle_ahead(self) -> None:
        """Finish the load ``load_ahead`` started, raising its failure; nothing when
        none was started."""
        if self._ahead:
            self.load()

    def _in_background(self, phase: str) -> None:
        """Load ``phase``'s encoder into the pool on a thread."""
        def load_quietly() -> None:
            with contextlib.suppress(Exception):
                self._pooled(phase)

        loading = threading.Thread(target=load_quietly, daemon=True,
                                   name="ssindex-encoder-load")
        self._loading.append(loading)
        loading.start()

    def _settle(self) -> None:
        while self._loading:
            self._loading.pop().join()

    def load(self) -> Encoder:
        self._settle()
        return self._load()

    def _load(self) -> Encoder:
        if self.encoder is None:
            self.selection, self.encoder = self._pooled(self._phase)
            self.encoder.stats = self.stats
        return self.encoder

    def _pooled(self, phase: str) -> tuple[Selection, Encoder]:
        """``phase``'s encoder: the pool's, or loaded now and kept there."""
        if not self.embeds:
            raise RuntimeError("a --no-embed build asked for the model")
        with self._loads:
            return self._pool.get((phase, self.model.key, self._explicit)) or \
                self._loaded(phase)

    def _loaded(self, phase: str) -> tuple[Selection, Encoder]:
        query = phase == "embed_query"
        # the query backends are probed anyway: importing torch (seconds) to take the
        # machine's inventory would cost a one-file rebuild most of its time
        selection = select(phase, self.model, None if query else self._explicit,
                           inventory=detect(with_torch=not query), warn=self._progress.message)
        if not query:
            self._compile(selection)
        encoder = Encoder(selection.backend, self.model, self._cfg.embed.batch_tokens)
        self._pool.keep((phase, self.model.key, self._explicit), selection, encoder)
        return selection, encoder

    def _compile(self, selection: Selection) -> None:
        """Compile the bulk model when the build is large enough to repay it; a compile
        that fails keeps the eager model, visibly (warned, and in the report)."""
        backend = selection.backend
        choice = self._cfg.embed.compile
        if not isinstance(backend, TorchBackend) or choice == "never":
            return
        if choice == "always":
            why = "torch.compile: [embed] compile = always"
        elif backend.compile_repays and self.large:
            why = f"torch.compile: {self.expected} chunks to embed repay its compile"
        else:
            return
        try:
            backend.compile()
        except runtime_errors() as exc:
            failure = f"torch.compile failed, so the eager model runs: {exc}"
            self._progress.message(f"embed_bulk: {failure}")
            selection.fallback_reason = "; ".join(
                filter(None, [selection.fallback_reason, failure]))
            return
        selection.reason = f"{selection.reason}; {why}"

    def report(self) -> BackendReport:
        self._settle()
        if self.selection is None:
            return BackendReport.unloaded("not loaded: every vector was reused" if self.embeds
                                          else "not loaded: --no-embed")
        report = self.selection.report()
        if self._phase == "embed_query" and not self._embedded:
            reason = f"loaded for changed files, but every vector was reused ({report.reason})"
        elif self._phase == "embed_query":
            reason = (f"incremental build with {self._embedded} chunks to embed: "
                      f"the query backend starts faster ({report.reason})")
        else:
            return report
        return dataclasses.replace(report, reason=reason)
