"""ONNX Runtime backends (CPU, CUDA and CoreML execution providers).

The model is exported once per (model content, export settings), verified
against torch (cosine ≥ 0.999 on sample inputs) and only then moved into the
cache under its final name, so a half-written or wrong export is never used.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ssindex.backends.cache import cache_dir
from ssindex.backends.model import ModelSpec
from ssindex.errors import BackendUnavailable

OPSET = 17
EXPORT_VERSION = 1
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


def exported_model_path(model: ModelSpec) -> Path:
    key = f"{model.fingerprint[:16]}-opset{OPSET}-v{EXPORT_VERSION}-{model.pooling}"
    return cache_dir() / "onnx" / f"{key}.onnx"


class _Pooled:
    """Wraps a HF model so the exported graph ends in pooled float32 vectors."""

    def __new__(cls, module: Any, pooling: str) -> Any:
        import torch

        from ssindex.backends.torch_backend import pool

        class Pooled(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = module

            def forward(self, input_ids: Any, attention_mask: Any) -> Any:
                hidden = self.inner(input_ids=input_ids, attention_mask=attention_mask)
                return pool(hidden.last_hidden_state, attention_mask, pooling)

        return Pooled()


def _sample_batch(model: ModelSpec) -> tuple[np.ndarray, np.ndarray]:
    tokenizer = model.tokenizer(64)
    encodings = tokenizer.encode_batch(_SAMPLES)
    width = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(encodings), width), np.int64)
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
    wrapper = _Pooled(load_torch_model(model, "cpu"), model.pooling).eval()
    ids, mask = _sample_batch(model)
    handle, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=".export-", suffix=".onnx")
    os.close(handle)
    tmp = Path(tmp_name)
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                wrapper, (torch.from_numpy(ids), torch.from_numpy(mask)), str(tmp),
                input_names=["input_ids", "attention_mask"], output_names=["pooled"],
                dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                              "attention_mask": {0: "batch", 1: "seq"}, "pooled": {0: "batch"}},
                opset_version=OPSET, dynamo=False,
            )
            reference = wrapper(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        session = _session(tmp, "cpu")
        exported = session.run(["pooled"], {"input_ids": ids, "attention_mask": mask})[0]
        worst = float(_cosines(reference, exported).min())
        if worst < MIN_EXPORT_COSINE:
            raise BackendUnavailable(
                f"ONNX export of {model.name} disagrees with torch (cosine {worst:.4f})"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _session(path: Path, provider: str) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = os.cpu_count() or 1
    options.log_severity_level = 3
    # idle threads sleep instead of spinning after a run: a search computes scores right
    # after embedding its query, and spinning threads would take the cores it needs
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
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

    dtype = "fp32"

    def __init__(self, model: ModelSpec, provider: str = "cpu") -> None:
        if provider not in PROVIDERS:
            raise BackendUnavailable(f"unknown ONNX Runtime provider {provider!r}")
        self.name = f"onnx-{provider}"
        self.device = provider
        self._session = _session(export_onnx(model), provider)

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
        return np.asarray(self._session.run(["pooled"], feeds)[0], dtype=np.float32)
