"""``ssindex calibrate``: time every backend that runs here, per phase; keep the winners.

Bulk is measured in chunks per second on real standard-library chunks, single
queries in milliseconds: the median of repeated calls, taken round-robin over the
backends (a busy moment on the machine slows them all alike), each call after a
pass over a buffer the size of a search's scan, so that it finds the caches cold
as a query does in a search. Timed back to back with warm caches, the fp32 graph
wins, and loses ~1 ms inside real searches. Winners are stored in the user's
config dir for this machine; auto selection then tries them first. Where the bf16
attention kernel runs (``backends.attention``), bf16 bulk is also timed with it and
with SDPA, and the bf16 backend then runs the winner.
"""

from __future__ import annotations

import json
import statistics
import sysconfig
import time
from pathlib import Path
from typing import Any

import numpy as np

from ssindex.backends import attention
from ssindex.backends.base import Encoder
from ssindex.backends.calibration import CALIBRATION_FILE, machine_key
from ssindex.backends.inventory import Inventory, detect
from ssindex.backends.model import ModelSpec
from ssindex.backends.registry import create
from ssindex.backends.selector import probe
from ssindex.config import ChunkConfig
from ssindex.util.dirs import config_dir
from ssindex.util.fsio import atomic_write_bytes

BULK_CHUNKS = 48
ATTENTION_ROUNDS = 5
SDPA_MARGIN = 1.05
"""How much faster SDPA must be to displace the kernel: the eager passes timed here
understate the kernel's gain in a large build's compiled pass (1.21x eager against
1.31x compiled on an AMX Xeon), and a shared machine's noise is a few percent."""
QUERY_REPEATS = 25
SCAN_BYTES = 32 << 20  # more than a 100k-chunk search reads (sign bits, shortlist, postings)


def _sample_chunks() -> list[str]:
    from ssindex.records import SourceFile
    from ssindex.stages.chunk import chunk_file
    from ssindex.stages.embed import embedding_text

    path = Path(sysconfig.get_paths()["stdlib"]) / "json" / "decoder.py"
    text = path.read_text(encoding="utf-8")
    chunks, _ = chunk_file(SourceFile("json/decoder.py", "python", text, len(text), 0, ""),
                           ChunkConfig())
    texts = [embedding_text(c) for c in chunks]
    return (texts * (BULK_CHUNKS // max(len(texts), 1) + 1))[:BULK_CHUNKS]


def runnable_backends(inventory: Inventory) -> list[str]:
    """The backends this machine's hardware could run, each to be probed and timed."""
    names = ["torch-cpu-fp32", "torch-cpu-bf16", "onnx-cpu", "onnx-cpu-int8"]
    if inventory.cuda_devices:
        names += ["torch-cuda", "onnx-cuda"]
    if inventory.mps:
        names.append("torch-mps")
    if inventory.neural_engine:
        names += ["onnx-coreml", "coreml"]
    return names


def _query_timings(encoders: dict[str, Encoder]) -> dict[str, list[float]]:
    """Milliseconds per single query for each encoder, round-robin, caches cold."""
    scan = np.ones(SCAN_BYTES // 8, np.uint64)
    timings: dict[str, list[float]] = {name: [] for name in encoders}
    for _ in range(QUERY_REPEATS):
        for name, encoder in encoders.items():
            scan.sum()
            started = time.perf_counter()
            encoder.encode(["read a json document from a file"])
            timings[name].append((time.perf_counter() - started) * 1000)
    return timings


def _attention_winner(spec: ModelSpec, texts: list[str],
                      bf16: Encoder | None) -> dict[str, str] | None:
    """Where the attention kernel runs, bf16 bulk with it (``bf16``: the encoder
    timed as ``torch-cpu-bf16``, which runs it where it can) against SDPA: passes taken
    in turn, medians of ``ATTENTION_ROUNDS``, for ``spec`` (the winner names it); the
    kernel stays unless SDPA wins by ``SDPA_MARGIN``. None where there is no choice."""
    from ssindex.backends.torch_backend import TorchBackend

    if bf16 is None or getattr(bf16.backend, "attn_implementation", None) != attention.NAME:
        return None  # no fast bf16, a model it cannot take, or a kernel that cannot build
    sdpa_backend = TorchBackend(spec, "cpu", "bf16", {"backend": "sdpa", "model": spec.model_id})
    encoders = {attention.NAME: bf16, "sdpa": Encoder(sdpa_backend, spec)}
    encoders["sdpa"].encode(texts[:4])
    rates: dict[str, list[float]] = {name: [] for name in encoders}
    for _ in range(ATTENTION_ROUNDS):
        for name, encoder in encoders.items():
            started = time.perf_counter()
            encoder.encode(texts)
            rates[name].append(len(texts) / (time.perf_counter() - started))
    kernel, sdpa = (round(statistics.median(rates[name]), 1) for name in (attention.NAME, "sdpa"))
    if sdpa > kernel * SDPA_MARGIN:
        return {"backend": "sdpa", "figure": f"{sdpa} vs the kernel's {kernel} chunks/s "
                f"in bf16", "model": spec.model_id}
    return {"backend": attention.NAME, "figure": f"{kernel} vs SDPA's {sdpa} chunks/s in bf16",
            "model": spec.model_id}


def calibrate(model: str | None = None) -> dict[str, Any]:
    """Measure, store and return the per-phase figures and winners."""
    inventory = detect()
    spec = ModelSpec.resolve(model)
    texts = _sample_chunks()
    figures: dict[str, dict[str, Any]] = {}
    encoders: dict[str, Encoder] = {}
    for name in runnable_backends(inventory):
        try:
            backend = create(name, spec, inventory, calibrated={})  # as it is, not as stored
            probe(backend)
        except Exception as exc:  # a backend that cannot run here is reported, not timed
            figures[name] = {"error": str(exc)}
            continue
        encoder = encoders[name] = Encoder(backend, spec)
        encoder.encode(texts[:4])
        started = time.perf_counter()
        encoder.encode(texts)
        figures[name] = {"bulk_chunks_per_s": round(
            len(texts) / (time.perf_counter() - started), 1)}
    for name, milliseconds in _query_timings(encoders).items():
        figures[name]["query_ms_p50"] = round(statistics.median(milliseconds), 2)
    timed = {n: f for n, f in figures.items() if "error" not in f}
    bulk_winner = max(timed, key=lambda n: timed[n]["bulk_chunks_per_s"])
    query_winner = min(timed, key=lambda n: timed[n]["query_ms_p50"])
    phases = {
        "embed_bulk": {"backend": bulk_winner,
                       "figure": f"{timed[bulk_winner]['bulk_chunks_per_s']} chunks/s"},
        "embed_query": {"backend": query_winner,
                        "figure": f"{timed[query_winner]['query_ms_p50']} ms/query"},
    }
    record = {"machine": machine_key(inventory), "model": spec.model_id,
              "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "phases": phases, "figures": figures}
    try:
        winner = _attention_winner(spec, texts, encoders.get("torch-cpu-bf16"))
    except Exception as exc:  # reported, as a backend that cannot run is
        record["attention_error"] = str(exc)
    else:
        if winner:
            phases["attention"] = winner
    path = config_dir() / CALIBRATION_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(record, indent=2).encode())
    return record | {"stored_at": str(path)}
