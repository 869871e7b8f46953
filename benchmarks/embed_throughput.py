"""Embedding throughput: the ssindex embed stage against sentence-transformers, one run.

    python benchmarks/embed_throughput.py [--chunks 600] [--json]

Baseline: sentence-transformers ``encode`` (batch 32, fp32) of the same texts with
the same model and threads. Candidate: the embed stage's encoder as ``build``
selects it. Also measures this machine's GEMM peak in the precision used, and
the worst cosine of ssindex's vectors against the fp32 reference.
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
from _corpus import model_flops_per_token, stdlib_chunk_texts

from ssindex.backends.base import Encoder
from ssindex.backends.model import ModelSpec
from ssindex.backends.selector import select
from ssindex.config import EmbedConfig


def gemm_peak(dtype: torch.dtype, size: int = 2048, repeats: int = 5) -> float:
    """Median FLOP/s of a size³ matmul in ``dtype`` on the CPU."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    torch.matmul(a, b)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        torch.matmul(a, b)
        times.append(time.perf_counter() - started)
    return 2 * size**3 / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=600)
    parser.add_argument("--backend", default=None, help="force an embed_bulk backend")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    model = ModelSpec.resolve(None)
    cfg = EmbedConfig()
    texts = stdlib_chunk_texts(args.chunks)

    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model.path), device="cpu")
    st.max_seq_length = cfg.max_tokens
    st.encode(texts[:32], batch_size=32)
    started = time.perf_counter()
    reference = st.encode(texts, batch_size=32, normalize_embeddings=True)
    baseline_s = time.perf_counter() - started

    selection = select("embed_bulk", model, args.backend)
    encoder = Encoder(selection.backend, model, cfg.max_tokens, cfg.batch_tokens)
    encoder.encode(texts[:32])
    encoder.stats.tokens = encoder.stats.padded_tokens = 0
    started = time.perf_counter()
    vectors = encoder.encode(texts)
    ssindex_s = time.perf_counter() - started

    tokens = encoder.stats.tokens
    mean_len = tokens / len(texts)
    flops = tokens * model_flops_per_token(model.config, mean_len)
    precision = torch.bfloat16 if selection.backend.dtype == "bf16" else torch.float32
    peak = gemm_peak(precision)
    result = {
        "chunks": len(texts),
        "backend": selection.name,
        "dtype": selection.backend.dtype,
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
