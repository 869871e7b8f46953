"""What this machine has: CPU features, GPUs, Apple accelerators, installed runtimes.

Detection only reads facts; whether a backend really runs is decided by the
selector's probe, which runs it.
"""

from __future__ import annotations

import importlib.util
import os
import platform
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any


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


def _runtimes() -> dict[str, Any]:
    import torch

    found: dict[str, Any] = {"torch": {"version": torch.__version__,
                                       "cuda_build": torch.version.cuda}}
    if importlib.util.find_spec("onnxruntime") is not None:
        import onnxruntime

        found["onnxruntime"] = {"version": onnxruntime.__version__,
                                "listed_providers": onnxruntime.get_available_providers()}
    if importlib.util.find_spec("coremltools") is not None:
        import coremltools

        found["coremltools"] = {"version": coremltools.__version__}
    return found


@cache
def detect() -> Inventory:
    import torch

    model, flags = _cpu_info()
    apple = platform.system() == "Darwin" and platform.machine() == "arm64"
    return Inventory(
        system=platform.system(),
        machine=platform.machine(),
        cpu_model=model,
        cpu_count=os.cpu_count() or 1,
        cpu_flags=flags,
        cuda_devices=_cuda_devices(),
        mps=bool(torch.backends.mps.is_available()),
        neural_engine=apple,
        runtimes=_runtimes(),
    )
