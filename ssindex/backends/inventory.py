"""What this machine has: CPU features, GPUs, Apple accelerators, installed runtimes.

Detection only reads facts; whether a backend really runs is decided by the
selector's probe, which runs it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

THREADS_ENV = "SSINDEX_THREADS"


def thread_cap() -> int:
    """The threads a backend may run on: ``SSINDEX_THREADS`` when set to a positive
    number (``ssindex watch`` sets it, leaving cores to the editor beside it), else
    every core."""
    value = os.environ.get(THREADS_ENV, "")
    return int(value) if value.isdigit() and int(value) > 0 else os.cpu_count() or 1


@dataclass(frozen=True)
class Inventory:
    system: str
    machine: str
    cpu_model: str
    cpu_count: int
    cpu_flags: frozenset[str] = frozenset()
    cuda_devices: tuple[dict[str, Any], ...] = ()
    mps: bool = False
    neural_engine: bool = False
    runtimes: dict[str, Any] = field(default_factory=dict)

    @property
    def bf16_fast(self) -> bool:
        """CPU bf16 matmuls are hardware-accelerated (AMX or AVX512-BF16)."""
        return bool({"amx_bf16", "avx512_bf16"} & self.cpu_flags)

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["cpu_flags"] = sorted(f for f in self.cpu_flags if f.startswith(("avx", "amx")))
        data["bf16_fast"] = self.bf16_fast
        return data


def _cpu_info() -> tuple[str, frozenset[str]]:
    model, flags = platform.processor() or platform.machine(), frozenset[str]()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = frozenset(value.split())
    except OSError:
        pass
    return model, flags


def _cuda_devices() -> tuple[dict[str, Any], ...]:
    import torch

    if not torch.cuda.is_available():
        return ()
    devices = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        devices.append({"index": index, "name": props.name,
                        "memory_gib": round(props.total_memory / 2**30, 1),
                        "capability": f"{props.major}.{props.minor}"})
    return tuple(devices)


def _nvidia_gpus() -> tuple[dict[str, Any], ...]:
    """GPUs the NVIDIA driver lists, read without importing torch (Linux)."""
    devices = []
    for index, info in enumerate(sorted(Path("/proc/driver/nvidia/gpus").glob("*/information"))):
        fields = dict(line.split(":", 1) for line in info.read_text().splitlines() if ":" in line)
        devices.append({"index": index, "name": fields.get("Model", "NVIDIA GPU").strip()})
    return tuple(devices)


def _runtimes(with_torch: bool) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if with_torch:
        import torch

        found["torch"] = {"version": torch.__version__, "cuda_build": torch.version.cuda}
    elif importlib.util.find_spec("torch") is not None:
        found["torch"] = {"version": importlib.metadata.version("torch")}
    if importlib.util.find_spec("onnxruntime") is not None:
        import onnxruntime

        found["onnxruntime"] = {"version": onnxruntime.__version__,
                                "listed_providers": onnxruntime.get_available_providers()}
    if importlib.util.find_spec("coremltools") is not None:
        # the version only: importing coremltools costs seconds and prints warnings
        found["coremltools"] = {"version": importlib.metadata.version("coremltools"),
                                "predicts": platform.system() == "Darwin"}
    return found


@cache
def detect(with_torch: bool = True) -> Inventory:
    """This machine's inventory. ``with_torch=False`` skips importing torch (seconds),
    reading GPUs from the driver instead: enough to order query backends, which are
    probed anyway."""
    model, flags = _cpu_info()
    apple = platform.system() == "Darwin" and platform.machine() == "arm64"
    if with_torch:
        import torch

        cuda, mps = _cuda_devices(), bool(torch.backends.mps.is_available())
    else:
        cuda, mps = _nvidia_gpus(), apple
    return Inventory(
        system=platform.system(),
        machine=platform.machine(),
        cpu_model=model,
        cpu_count=os.cpu_count() or 1,
        cpu_flags=flags,
        cuda_devices=cuda,
        mps=mps,
        neural_engine=apple,
        runtimes=_runtimes(with_torch),
    )
