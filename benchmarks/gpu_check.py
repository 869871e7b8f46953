"""CUDA check: torch CUDA (bf16) and ONNX Runtime's CUDA provider on real chunks.

    python benchmarks/gpu_check.py [--chunks 20000] [--json]

For each CUDA backend that runs: parity against the CPU fp32 reference on a
sample (worst cosine), chunks/s over the whole set, and the fraction of the
GPU's measured bf16 GEMM peak. Exits 0 with a note when no GPU is present.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import model_flops_per_token, stdlib_chunk_texts

from ssindex.backends.base import Encoder
from ssindex.backends.inventory import detect
from ssindex.backends.model import ModelSpec
from ssindex.backends.registry import create


def cuda_gemm_peak(size: int = 8192, repeats: int = 10) -> float:
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    torch.matmul(a, b)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        torch.matmul(a, b)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return 2 * size**3 / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device visible to torch"}))
        return
    model = ModelSpec.resolve(None)
    inventory = detect()
    texts = stdlib_chunk_texts(args.chunks)
    sample = texts[:256]
    reference = Encoder(create("torch-cpu-fp32", model, inventory), model).encode(sample)
    peak = cuda_gemm_peak()
    report: dict[str, object] = {"gpu": inventory.cuda_devices[0]["name"],
                                 "bf16_gemm_peak_tflops": round(peak / 1e12, 1)}
    for name in ("torch-cuda", "onnx-cuda"):
        try:
            encoder = Encoder(create(name, model, inventory), model, batch_tokens=262_144)
        except Exception as exc:  # report what could not run, then go on
            report[name] = {"error": str(exc)}
            continue
        worst = float((encoder.encode(sample) * reference).sum(axis=1).min())
        encoder.stats.tokens = 0
        torch.cuda.synchronize()
        started = time.perf_counter()
        encoder.encode(texts)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        tokens = encoder.stats.tokens
        flops = tokens * model_flops_per_token(model.config, tokens / len(texts))
        report[name] = {"chunks_per_s": round(len(texts) / seconds, 1),
                        "min_cosine_vs_cpu_fp32": round(worst, 5),
                        "fraction_of_bf16_gemm_peak": round(flops / seconds / peak, 4)}
    print(json.dumps(report) if args.json else json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
