"""Embedding throughput: the ssindex embed stage against sentence-transformers, one run.

    python benchmarks/embed_throughput.py [--chunks 600] [--compile auto|always|never]
        [--profile] [--json]

Baseline: sentence-transformers ``encode`` (batch 32, fp32) of the same texts with
the same model and threads. Candidate: the embed stage's encoder as a large build
selects it: the eager model, then (``auto``: where a build of at least
``COMPILE_MIN_CHUNKS`` chunks would) the same model through ``torch.compile``. The
headline figures are the large build's path; the eager rate and the compile time
are reported beside them. Also measures this machine's GEMM peak in the precision
used, and the worst cosine of ssindex's vectors against the fp32 reference.
``--profile`` adds where one more pass of the headline path spends its time (torch
backends): the shares of attention, of the linear layers, and of everything else.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import stdlib_chunk_texts
from _machine import cpu_label, gemm_peak, model_flops_per_token

from ssindex.backends.base import Encoder
from ssindex.backends.model import ModelSpec
from ssindex.backends.selector import select
from ssindex.backends.torch_backend import TorchBackend
from ssindex.config import COMPILE_CHOICES, EmbedConfig


def timed(encoders: list[Encoder], texts: list[str], passes: int = 3,
          ) -> list[tuple[np.ndarray, float]]:
    """Each encoder's vectors of the texts and its median seconds over ``passes``
    passes, taken in turns (a busy moment slows them alike), after one untimed pass:
    oneDNN prepares its kernels for each new batch shape once, which a build of
    thousands of chunks amortizes and a benchmark of hundreds would not."""
    seconds: list[list[float]] = [[] for _ in encoders]
    vectors = [encoder.encode(texts) for encoder in encoders]
    for _ in range(passes):
        for encoder, taken in zip(encoders, seconds, strict=True):
            encoder.stats.tokens = encoder.stats.padded_tokens = 0
            started = time.perf_counter()
            encoder.encode(texts)
            taken.append(time.perf_counter() - started)
    return [(v, statistics.median(s)) for v, s in zip(vectors, seconds, strict=True)]


def time_shares(encoder: Encoder, texts: list[str]) -> dict[str, float]:
    """Shares of one pass's operator time (torch's profiler, self time): attention
    kernels, linear layers (GEMMs), and the rest (a compiled graph's fused kernels,
    pooling)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiled:
        encoder.encode(texts)
    seconds = {"attention": 0.0, "linear": 0.0, "other": 0.0}
    for event in profiled.key_averages():
        name = event.key.lower()
        kind = "attention" if "attention" in name else (
            "linear" if "linear" in name or name.endswith("mm") else "other")
        seconds[kind] += event.self_cpu_time_total
    total = sum(seconds.values()) or 1.0
    return {f"{kind}_share": round(value / total, 3) for kind, value in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=600)
    parser.add_argument("--backend", default=None, help="force an embed_bulk backend")
    parser.add_argument("--compile", choices=COMPILE_CHOICES, default="auto")
    parser.add_argument("--profile", action="store_true",
                        help="also report the shares of attention and linear layers")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    model = ModelSpec.resolve(None)
    cfg = EmbedConfig()
    texts = stdlib_chunk_texts(args.chunks)

    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model.path), device="cpu")
    st.max_seq_length = model.window
    st.encode(texts[:32], batch_size=32)
    started = time.perf_counter()
    reference = st.encode(texts, batch_size=32, normalize_embeddings=True)
    baseline_s = time.perf_counter() - started

    selection = select("embed_bulk", model, args.backend)
    backend = selection.backend
    encoders = [Encoder(backend, model, cfg.batch_tokens)]
    compile_s = 0.0
    compiles = isinstance(backend, TorchBackend) and (
        args.compile == "always" or (args.compile == "auto" and backend.compile_repays))
    if compiles:  # a second copy, so that the eager and compiled passes can take turns
        compiled = TorchBackend(model, backend.device, backend.dtype)
        started = time.perf_counter()
        compiled.compile()
        compile_s = time.perf_counter() - started
        encoders.append(Encoder(compiled, model, cfg.batch_tokens))
    measured = timed(encoders, texts)
    eager_s = measured[0][1]
    vectors, ssindex_s = measured[-1]
    encoder = encoders[-1]

    tokens = encoder.stats.tokens
    mean_len = tokens / len(texts)
    flops = tokens * model_flops_per_token(model.config, mean_len)
    precision = torch.bfloat16 if selection.backend.dtype == "bf16" else torch.float32
    peak = gemm_peak(precision)
    result = {
        "cpu": cpu_label(),
        "chunks": len(texts),
        "backend": selection.name,
        "dtype": backend.dtype,
        "batch_tokens": encoder.batch_tokens,
        "compiled": compiles,
        "compile_seconds": round(compile_s, 1),
        "eager_chunks_per_s": round(len(texts) / eager_s, 1),
        "baseline_chunks_per_s": round(len(texts) / baseline_s, 1),
        "chunks_per_s": round(len(texts) / ssindex_s, 1),
        "tokens_per_s": round(tokens / ssindex_s, 1),
        "ratio_vs_baseline": round(baseline_s / ssindex_s, 3),
        "useful_gflop_per_s": round(flops / ssindex_s / 1e9, 1),
        "gemm_peak_gflop_per_s": round(peak / 1e9, 1),
        "fraction_of_gemm_peak": round(flops / ssindex_s / peak, 3),
        "padding_fraction": round(1 - tokens / max(encoder.stats.padded_tokens, 1), 3),
        "min_cosine_vs_fp32": round(float((vectors * reference).sum(axis=1).min()), 5),
    }
    if args.profile and isinstance(encoder.backend, TorchBackend):
        result |= time_shares(encoder, texts)
    elif args.profile:  # said, not silently left out
        result["profile_skipped"] = f"{selection.name}: torch's profiler sees torch backends only"
    if args.json:
        print(json.dumps(result))
        return
    width = max(len(k) for k in result)
    print(f"{'metric':<{width}}  value")
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    ratio = np.round(result["ratio_vs_baseline"], 2)
    print(f"\nssindex embed stage: {ratio}x the sentence-transformers baseline")


if __name__ == "__main__":
    main()
