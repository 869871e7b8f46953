"""Backend name → factory: the one place a name becomes a runtime.

Each factory imports its runtime only when called, and raises ``BackendUnavailable``
saying what is missing when the runtime cannot run on this machine.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from ssindex.backends.base import EmbeddingBackend
from ssindex.backends.calibration import load_calibration
from ssindex.backends.inventory import Inventory
from ssindex.backends.model import ModelSpec
from ssindex.backends.names import BACKENDS
from ssindex.errors import BackendUnavailable, ConfigError

Factory = Callable[[ModelSpec, Inventory, dict[str, Any]], EmbeddingBackend]
"""A backend's maker: the model, the machine, and the calibration phases to follow."""

_ONNX_HINTS = {
    "onnx-cuda": "install ssindex[cuda] (onnxruntime-gpu in place of onnxruntime) on a "
                 "machine with an NVIDIA GPU and CUDA 12",
    "onnx-coreml": "CoreMLExecutionProvider exists only in onnxruntime on macOS",
}


def _torch_cpu(precision: str | None, model: ModelSpec, inventory: Inventory,
               calibrated: dict[str, Any]) -> EmbeddingBackend:
    from ssindex.backends.torch_backend import TorchBackend

    chosen = precision or ("bf16" if inventory.bf16_fast else "fp32")
    return TorchBackend(model, "cpu", chosen, calibrated.get("attention"))


def _torch_cuda(model: ModelSpec, inventory: Inventory,
                calibrated: dict[str, Any]) -> EmbeddingBackend:
    from ssindex.backends.torch_backend import TorchBackend

    if not inventory.cuda_devices:
        cuda = inventory.runtimes.get("torch", {}).get("cuda_build")
        raise BackendUnavailable(
            f"torch-cuda: no CUDA device visible to torch (torch CUDA build: {cuda or 'none'});"
            " run on an NVIDIA GPU machine with a CUDA build of torch")
    return TorchBackend(model, "cuda", "bf16")


def _torch_mps(model: ModelSpec, inventory: Inventory,
               calibrated: dict[str, Any]) -> EmbeddingBackend:
    from ssindex.backends.torch_backend import TorchBackend

    if not inventory.mps:
        raise BackendUnavailable("torch-mps: needs Apple silicon with macOS ≥ 12.3")
    return TorchBackend(model, "mps", "fp16")


def _onnx(name: str, model: ModelSpec, inventory: Inventory,
          calibrated: dict[str, Any]) -> EmbeddingBackend:
    try:
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailable(f"{name}: onnxruntime is not installed") from exc
    from ssindex.backends.onnx_backend import OnnxBackend

    try:
        if name == "onnx-cpu-int8":
            return OnnxBackend(model, "cpu", int8_weights=True)
        return OnnxBackend(model, name.removeprefix("onnx-"))
    except BackendUnavailable as exc:
        hint = _ONNX_HINTS.get(name)
        raise BackendUnavailable(f"{name}: {exc}" + (f"; {hint}" if hint else "")) from exc


def _coreml(model: ModelSpec, inventory: Inventory,
            calibrated: dict[str, Any]) -> EmbeddingBackend:
    from ssindex.backends.coreml_backend import CoreMLBackend

    return CoreMLBackend(model)


FACTORIES: dict[str, Factory] = {
    "torch-cuda": _torch_cuda,
    "torch-mps": _torch_mps,
    "torch-cpu": partial(_torch_cpu, None),
    "torch-cpu-fp32": partial(_torch_cpu, "fp32"),
    "torch-cpu-bf16": partial(_torch_cpu, "bf16"),
    **{name: partial(_onnx, name) for name in BACKENDS if name.startswith("onnx-")},
    "coreml": _coreml,
}


def create(name: str, model: ModelSpec, inventory: Inventory,
           calibrated: dict[str, Any] | None = None) -> EmbeddingBackend:
    """Instantiate backend ``name`` or raise ``BackendUnavailable`` saying what is missing.
    ``calibrated``: the calibration phases it follows (the bf16 CPU backend's attention);
    None reads those stored for this machine, ``{}`` follows none (``calibrate``)."""
    factory = FACTORIES.get(name)
    if factory is None:
        raise ConfigError(f"unknown backend {name!r} (backends: {', '.join(BACKENDS)})")
    return factory(model, inventory,
                   load_calibration(inventory) if calibrated is None else calibrated)
