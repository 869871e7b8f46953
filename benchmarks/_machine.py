"""What a benchmark reports about the machine and the model it measured, without
ssindex's build dependencies (``gpu_check.py`` runs where they are not installed)."""

from __future__ import annotations

import platform
import statistics
import time
from pathlib import Path
from typing import Any


def cpu_label() -> str:
    """This machine's CPU model, marked when it has AMX (the figures differ by kind)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    for line in info.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip() + (" (AMX)" if "amx_bf16" in info else "")
    return platform.processor() or "unknown"


def model_flops_per_token(config: dict, seq_len: float) -> float:
    """Forward FLOPs per token: 2 x non-embedding weights, plus attention scores."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    inner = config.get("intermediate_size", 4 * hidden)
    weights = layers * (4 * hidden * hidden + 2 * hidden * inner)
    return 2 * weights + layers * 4 * seq_len * hidden


def gemm_peak(dtype: Any, device: str = "cpu", size: int = 2048, repeats: int = 5) -> float:
    """Median FLOP/s of a size³ matmul in ``dtype`` (a torch dtype) on ``device``."""
    import torch

    gpu = device == "cuda"
    a, b = (torch.randn(size, size, dtype=dtype, device=device) for _ in range(2))
    # warm-up: kernel selection; a GPU's clocks rise only after a while of work
    warm_until = time.perf_counter() + (0.5 if gpu else 0.0)
    for _ in range(3):
        torch.matmul(a, b)
    while time.perf_counter() < warm_until:
        torch.matmul(a, b)
        torch.cuda.synchronize()
    per_sample = 20 if gpu else 1  # one GPU matmul takes ~1 ms: too short to time alone
    times = []
    for _ in range(repeats):
        if gpu:
            torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(per_sample):
            torch.matmul(a, b)
        if gpu:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - started) / per_sample)
    return 2 * size**3 / statistics.median(times)
