"""Phase and backend names: a leaf module, so config can validate them without loading a runtime."""

from __future__ import annotations

from ssindex.errors import ConfigError

PHASES = ("embed_bulk", "embed_query")


BACKENDS = (
    "torch-cuda", "torch-mps", "torch-cpu", "torch-cpu-fp32", "torch-cpu-bf16",
    "onnx-cuda", "onnx-coreml", "onnx-cpu", "onnx-cpu-int8", "coreml",
)


def parse_overrides(values: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``["embed_bulk=onnx-cpu", ...]`` → ``{"embed_bulk": "onnx-cpu"}``, validated."""
    out: dict[str, str] = {}
    for value in values:
        phase, sep, name = value.partition("=")
        if not sep:
            raise ConfigError(f"--backend takes PHASE=NAME, got {value!r}")
        out[phase.strip()] = name.strip()
    for phase, name in out.items():
        if phase not in PHASES:
            raise ConfigError(f"unknown phase {phase!r} (phases: {', '.join(PHASES)})")
        if name != "auto" and name not in BACKENDS:
            raise ConfigError(f"unknown backend {name!r} (backends: auto, {', '.join(BACKENDS)})")
    return {phase: name for phase, name in out.items() if name != "auto"}
