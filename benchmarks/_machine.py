"""What a benchmark reports about the machine and the model it measured, without
ssindex's build dependencies (``gpu_check.py`` runs where they are not installed)."""

from __future__ import annotations

import platform
from pathlib import Path


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
