"""ONNX Runtime backends (CPU, CUDA and CoreML execution providers).

The model is exported once per (model content, export settings), verified
against torch (cosine ≥ 0.999 on sample inputs) and only then moved into the
cache under its final name, so a half-written or wrong export is never used.

The export takes attention in its eager form, which ONNX Runtime's transformer
optimizer fuses into one ``Attention`` op per layer (with fused embedding and
skip layer norms and GELUs): a single query runs in ~4.7 ms instead of ~6.4 ms
on 2 cores. Where fusion does not apply or disagrees with torch, the plain
graph is kept.

For single queries on CPU (``onnx-cpu-int8``) the fused graph's matrix weights
are further stored as int8 in blocks of 32 and multiplied in int8
(``MatMulNBits``): a search's query embedding then reads a quarter of the bytes
and takes ~0.6–1 ms less inside searches at 100k chunks, whose scans push the
weights out of the CPU caches (back to back, with the caches warm, fp32 is as
fast), at cosine ≥ 0.9998 to fp32 (checked on export against the fp32 graph;
CoSQA MRR@10 moved by -0.004 to +0.002 over the three index quantizations).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ssindex.backends.base import DEFAULT_BATCH_TOKENS
from ssindex.backends.inventory import thread_cap
from ssindex.backends.model import ModelSpec
from ssindex.errors import BackendUnavailable, first_line
from ssindex.util.dirs import cache_dir

OPSET = 17
EXPORT_VERSION = 2  # 2: attention exported eagerly and fused
MIN_EXPORT_COSINE = 0.999
PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
}
_SAMPLES = [
    "def parse(text):\n    return json.loads(text)",
    "class Server:\n    def serve_forever(self): ...",
    "read a file line by line",
    "x",
]


def exported_model_path(model: ModelSpec, weights: str = "fp32") -> Path:
    key = f"{model.card_key[:16]}-opset{OPSET}-v{EXPORT_VERSION}"
    suffix = "" if weights == "fp32" else f"-{weights}"
    return cache_dir() / "onnx" / f"{key}{suffix}.onnx"


class _Pooled:
    """Wraps a HF model so the exported graph ends in the head's float32 vectors."""

    def __new__(cls, module: Any, model: ModelSpec) -> Any:
        import torch

        from ssindex.backends.head import build_head

        class Pooled(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = module
                self.head = build_head(model.card)

            def forward(self, input_ids: Any, attention_mask: Any) -> Any:
                hidden = self.inner(input_ids=input_ids, attention_mask=attention_mask)
                return self.head(hidden.last_hidden_state, attention_mask)

        return Pooled()


def _sample_batch(model: ModelSpec) -> tuple[np.ndarray, np.ndarray]:
    tokenizer = model.tokenizer()
    encodings = tokenizer.encode_batch(_SAMPLES)
    width = max(len(e.ids) for e in encodings)
    ids = np.full((len(encodings), width), model.pad_id, np.int64)
    mask = np.zeros_like(ids)
    for row, enc in enumerate(encodings):
        ids[row, : len(enc.ids)] = enc.ids
        mask[row, : len(enc.ids)] = 1
    return ids, mask


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return np.asarray((a * b).sum(axis=1))


def export_onnx(model: ModelSpec) -> Path:
    """The verified ONNX export of ``model``, exporting it first if not cached."""
    target = exported_model_path(model)
    if target.is_file():
        return target
    import torch

    from ssindex.backends.torch_backend import load_torch_model

    target.parent.mkdir(parents=True, exist_ok=True)
    wrapper = _Pooled(load_torch_model(model, "cpu", attention="eager"), model).eval()
    ids, mask = _sample_batch(model)
    with _scratch(target) as plain, _scratch(target) as fused:
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                torch.onnx.export(
                    wrapper, (torch.from_numpy(ids), torch.from_numpy(mask)), str(plain),
                    input_names=["input_ids", "attention_mask"], output_names=["pooled"],
                    dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "pooled": {0: "batch"},
                                  "attention_mask": {0: "batch", 1: "seq"}},
                    opset_version=OPSET, dynamo=False,
                )
            except Exception as exc:  # the exporter raises many kinds for graphs it cannot trace
                raise BackendUnavailable(
                    f"onnx cannot export {model.name} ({model.card.architecture}): "
                    f"{first_line(exc)}") from exc
            reference = wrapper(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        worst = _agreement(plain, ids, mask, reference)
        if worst < MIN_EXPORT_COSINE:
            raise BackendUnavailable(f"ONNX export of {model.name} ({model.card.architecture}) "
                                     f"disagrees with torch (cosine {worst:.4f})")
        verified = plain
        if _fuse(plain, fused, model) and (
                _agreement(fused, ids, mask, reference) >= MIN_EXPORT_COSINE):
            verified = fused
        os.replace(verified, target)
    return target


def export_int8_weights(model: ModelSpec) -> Path:
    """The verified export of ``model`` with int8 matrix weights, made from the fp32 one."""
    target = exported_model_path(model, "int8")
    if target.is_file():
        return target
    source = export_onnx(model)
    ids, mask = _sample_batch(model)
    reference = _session(source, "cpu").run(["pooled"], {"input_ids": ids,
                                                         "attention_mask": mask})[0]
    with _scratch(target) as quantized:
        try:
            import onnx

            nbits = _weight_quantizer()
            config = nbits.DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=True,
                                                        accuracy_level=4, bits=8)
            quantizer = nbits.MatMulNBitsQuantizer(onnx.load(str(source)), algo_config=config)
            with _quiet(nbits.__name__):
                quantizer.process()
            quantizer.model.save_model_to_file(str(quantized), use_external_data_format=False)
        except Exception as exc:  # an onnxruntime without 8-bit MatMulNBits, or no onnx_ir
            raise BackendUnavailable(f"cannot store int8 weights: {exc}") from exc
        worst = _agreement(quantized, ids, mask, reference)
        if worst < MIN_EXPORT_COSINE:
            raise BackendUnavailable(f"int8 weights of {model.name} disagree with fp32 "
                                     f"(cosine {worst:.4f})")
        os.replace(quantized, target)
    return target


@contextlib.contextmanager
def _scratch(target: Path) -> Iterator[Path]:
    """A temporary file beside ``target`` (same file system, so it can be renamed there),
    removed on the way out unless it was renamed."""
    handle, name = tempfile.mkstemp(dir=target.parent, prefix=".export-", suffix=".onnx")
    os.close(handle)
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def _agreement(path: Path, ids: np.ndarray, mask: np.ndarray, reference: np.ndarray) -> float:
    """The worst cosine between the graph at ``path`` and torch's ``reference`` vectors."""
    exported = _session(path, "cpu").run(["pooled"], {"input_ids": ids, "attention_mask": mask})
    return float(_cosines(reference, exported[0]).min())


def _fuse(source: Path, target: Path, model: ModelSpec) -> bool:
    """Write ``source`` with ONNX Runtime's transformer fusions to ``target``; False
    where no attention fused (an architecture the optimizer's patterns do not match)."""
    heads, hidden = model.config.get("num_attention_heads"), model.config.get("hidden_size")
    if not heads or not hidden:
        return False
    try:  # fusion is only an optimization: any failure keeps the verified plain graph
        from onnxruntime.transformers.optimizer import optimize_model

        with _quiet("onnxruntime.transformers"):
            optimized = optimize_model(str(source), model_type="bert", num_heads=int(heads),
                                       hidden_size=int(hidden), opt_level=1)
        if not optimized.get_fused_operator_statistics().get("Attention"):
            return False
        optimized.save_model_to_file(str(target))
    except Exception:
        return False
    return True


def _weight_quantizer() -> Any:
    """onnxruntime's ``matmul_nbits_quantizer`` module, imported without the
    ``logging.basicConfig(level=INFO)`` it runs at import (which would make every
    library in the process log to stderr): ``basicConfig`` skips a root logger that
    already has a handler."""
    root = logging.getLogger()
    guard = logging.NullHandler()
    root.addHandler(guard)
    try:
        from onnxruntime.quantization import matmul_nbits_quantizer
    finally:
        root.removeHandler(guard)
    return matmul_nbits_quantizer


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    """ONNX Runtime's Python tools log each step at INFO: only errors while they run."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _session(path: Path, provider: str) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = thread_cap()
    options.log_severity_level = 3
    # threads spin between the ops of a run (waking a sleeping one per op cost ~0.7 ms of
    # a 5 ms query) and stop when it returns: a search scores right after embedding its
    # query, and threads spinning on would take the cores it needs
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    options.add_session_config_entry("session.force_spinning_stop", "1")
    wanted = PROVIDERS[provider]
    providers = [wanted] if provider == "cpu" else [wanted, "CPUExecutionProvider"]
    session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
    if wanted not in session.get_providers():
        raise BackendUnavailable(
            f"onnxruntime could not start {wanted} (it fell back to "
            f"{', '.join(session.get_providers())})"
        )
    return session


class OnnxBackend:
    """One exported model in one ONNX Runtime session."""

    def __init__(self, model: ModelSpec, provider: str = "cpu", int8_weights: bool = False,
                 ) -> None:
        if provider not in PROVIDERS:
            raise BackendUnavailable(f"unknown ONNX Runtime provider {provider!r}")
        self.name = f"onnx-{provider}" + ("-int8" if int8_weights else "")
        self.device = provider
        self.dtype = "int8 weights" if int8_weights else "fp32"
        self.batch_tokens = DEFAULT_BATCH_TOKENS
        import onnxruntime as ort

        if PROVIDERS[provider] not in ort.get_available_providers():  # before exporting
            raise BackendUnavailable(f"this onnxruntime build has no {PROVIDERS[provider]}")
        graph = export_int8_weights(model) if int8_weights else export_onnx(model)
        self._session = _session(graph, provider)

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
        return np.asarray(self._session.run(["pooled"], feeds)[0], dtype=np.float32)
