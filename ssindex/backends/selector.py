"""Per-phase backend choice: bulk indexing and single queries want different runtimes.

Auto mode walks an ordered candidate list for the phase (a calibrated winner
first, when ``ssindex calibrate`` stored one for this machine) and *probes*
each: the backend is really created and really encodes a tiny batch. A
candidate that fails is reported as the selection's ``fallback_reason`` and
warned about; an explicit choice that fails raises ``BackendUnavailable``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ssindex.backends.base import EmbeddingBackend, runtime_errors
from ssindex.backends.calibration import load_calibration
from ssindex.backends.inventory import Inventory, detect
from ssindex.backends.model import ModelSpec
from ssindex.backends.names import PHASES
from ssindex.backends.registry import create
from ssindex.errors import BackendUnavailable, ConfigError, SsindexError, map_exceptions


@dataclass(frozen=True)
class BackendReport:
    """What ran a phase, as the build summary, ``doctor`` and ``--json`` show it. Every
    engine reports through this one type, so the fields cannot drift apart."""

    backend: str | None  # None: no model was loaded (every vector was reused)
    device: str | None
    dtype: str | None
    reason: str
    fallback_reason: str | None = None
    actors: dict[str, Any] | None = None  # Ray: embed_actors, cpus_per_actor, gpus_per_actor

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"backend": self.backend, "device": self.device,
                                "dtype": self.dtype, "reason": self.reason}
        if self.fallback_reason:
            data["fallback_reason"] = self.fallback_reason
        return data | (self.actors or {})

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BackendReport:
        return cls(data["backend"], data["device"], data["dtype"], data["reason"],
                   data.get("fallback_reason"))

    @classmethod
    def unloaded(cls, reason: str) -> BackendReport:
        return cls(None, None, None, reason)

    @classmethod
    def merged(cls, reports: list[BackendReport], actors: dict[str, Any]) -> BackendReport:
        """One report for several workers (Ray actors): each field joins the distinct
        values the workers gave, in sorted order."""
        def join(values: list[str | None]) -> str | None:
            present = sorted({value for value in values if value is not None})
            return ", ".join(present) if present else None

        fallbacks = join([r.fallback_reason for r in reports])
        return cls(join([r.backend for r in reports]), join([r.device for r in reports]),
                   join([r.dtype for r in reports]),
                   f"chosen on each actor: {join([r.reason for r in reports])}",
                   fallbacks, actors)


@dataclass
class Selection:
    phase: str
    name: str
    reason: str
    backend: EmbeddingBackend
    fallback_reason: str | None = None

    def report(self) -> BackendReport:
        return BackendReport(self.name, self.backend.device, self.backend.dtype, self.reason,
                             self.fallback_reason)

    def as_json(self) -> dict[str, Any]:
        return self.report().as_json()


def candidates(phase: str, inventory: Inventory,
               calibrated: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """Ordered (backend, reason) choices for ``phase`` on ``inventory``; no probing."""
    cpu = ("torch-cpu", "bf16 weights: CPU has AMX/AVX512-BF16" if inventory.bf16_fast
           else "fp32: CPU lacks AMX/AVX512-BF16, where bf16 would be slower")
    if phase == "embed_bulk":
        order = []
        if inventory.cuda_devices:
            order.append(("torch-cuda", f"bulk on CUDA GPU {inventory.cuda_devices[0]['name']}"))
        if inventory.mps:
            order.append(("torch-mps", "bulk on Apple GPU (MPS, fp16)"))
        order.append((cpu[0], f"bulk on CPU, {cpu[1]}"))
    elif phase == "embed_query":
        order = []
        if inventory.cuda_devices:
            order.append(("onnx-cuda", "single queries: ONNX Runtime CUDA provider"))
        if inventory.neural_engine:
            order.append(("onnx-coreml", "single queries: ONNX Runtime CoreML provider"))
        order.append(("onnx-cpu-int8", "single queries: ONNX Runtime has the lowest per-call "
                                       "overhead on CPU; int8 weights read a quarter of the bytes"))
        order.append(("onnx-cpu", "single queries: ONNX Runtime, fp32 weights"))
        order.append((cpu[0], f"single queries on torch CPU, {cpu[1]}"))
    else:
        raise ConfigError(f"unknown phase {phase!r} (phases: {', '.join(PHASES)})")
    calibration = (calibrated or {}).get(phase, {})
    winner = calibration.get("backend")
    if winner:
        order = [(winner, f"calibrated winner on this machine ({calibration.get('figure')})"),
                 *[c for c in order if c[0] != winner]]
    return order


def probe(backend: EmbeddingBackend) -> None:
    """Run one tiny batch; raises when the backend cannot really compute."""
    import numpy as np

    ids = np.array([[1, 2, 3, 4]], dtype=np.int64)  # ids any vocabulary has
    out = backend.forward(ids, np.ones_like(ids))
    if out.ndim != 2 or not np.all(np.isfinite(out)):
        raise BackendUnavailable(f"{backend.name}: probe produced invalid output")


def select(
    phase: str,
    model: ModelSpec,
    explicit: str | None = None,
    inventory: Inventory | None = None,
    warn: Callable[[str], None] | None = None,
) -> Selection:
    """Choose, create and probe the backend for ``phase``."""
    inventory = inventory or detect()
    calibrated = load_calibration(inventory)
    if explicit:
        with map_exceptions({runtime_errors(): lambda exc: BackendUnavailable(
                f"{explicit}: {exc}")}):
            backend = create(explicit, model, inventory, calibrated)
            probe(backend)
        return _noted(Selection(phase, explicit, "explicitly requested", backend), warn)
    failures: list[str] = []
    expected: tuple[type[Exception], ...] = (SsindexError, *runtime_errors())
    for name, reason in candidates(phase, inventory, calibrated):
        try:
            backend = create(name, model, inventory, calibrated)
            probe(backend)
        except expected as exc:  # auto mode: a backend that cannot run yields to the next
            failures.append(f"{name} unavailable: {exc}")
            if warn is not None:
                warn(f"{phase}: {name} could not run ({exc}); falling back")
            continue
        return _noted(Selection(phase, backend.name, reason, backend,
                                "; ".join(failures) or None), warn)
    raise BackendUnavailable(f"no backend can run {phase}: " + "; ".join(failures))


def _noted(selection: Selection, warn: Callable[[str], None] | None) -> Selection:
    """Which attention a bf16 torch model runs on a CPU joins the reason; a kernel
    that could not be built (SDPA runs instead) joins the fallback reason and is warned
    about. Only ``TorchBackend`` has these notes; read by name, so that choosing a query
    backend does not import the torch backend's module."""
    note = getattr(selection.backend, "attention_note", "")
    fallback = getattr(selection.backend, "attention_fallback", "")
    if note:
        selection.reason = f"{selection.reason}; {note}"
    if fallback:
        if warn is not None:
            warn(f"{selection.phase}: {fallback}")
        selection.fallback_reason = "; ".join(filter(None, [selection.fallback_reason, fallback]))
    return selection
