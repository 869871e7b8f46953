"""The benchmarks that replace the model's forward pass still run against today's pipeline:
they build through ssindex's internals (the backend registry, ``build``), so a change
there can break them while every other test passes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(script: str, *args: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args, "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def test_pipeline_throughput_measures_both_worker_counts() -> None:
    result = _run("pipeline_throughput.py", "--packages", "json", "--workers", "1,2")
    assert result["chunks"] > 0  # type: ignore[operator]
    rates = result["cpu_side_chunks_per_s"]
    assert set(rates) == {"1", "2"} and all(rate > 0 for rate in rates.values())  # type: ignore[union-attr]
    for workers in rates:  # type: ignore[union-attr]
        stages = result[f"stage_seconds_{workers}"]
        assert set(stages) >= {"walk", "chunk", "dedupe", "embed", "write"}  # type: ignore[arg-type]
    assert result["projected_16_core_chunks_per_s"] > 0  # type: ignore[operator]


def test_memory_measures_two_slices_without_the_forward_pass() -> None:
    result = _run("memory.py", "--no-forward", "--small", "json", "--large", "json,email")
    assert 0 < result["small_chunks"] < result["large_chunks"]  # type: ignore[operator]
    assert result["baseline_large_chunks"] == result["large_chunks"]  # the same build twice
    assert all(result[f"{prefix}{size}_peak_rss_mb"] > 0  # type: ignore[operator]
               for prefix in ("", "baseline_") for size in ("small", "large"))
