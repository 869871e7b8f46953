"""Core ML through coremltools: mlprogram, fp16, bucketed sequence lengths.

Conversion runs anywhere coremltools installs; prediction needs macOS, so
``CoreMLBackend`` refuses to start elsewhere.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import numpy as np

from ssindex.backends.base import DEFAULT_BATCH_TOKENS
from ssindex.backends.model import ModelSpec
from ssindex.errors import BackendUnavailable, first_line
from ssindex.util.dirs import cache_dir

SEQ_BUCKETS = (32, 64, 128, 256)
"""Enumerated input lengths: Core ML compiles one specialization per bucket (and one
for the model's window, when it is longer or between two)."""


def seq_buckets(model: ModelSpec) -> tuple[int, ...]:
    """The input lengths ``model`` is converted for: every text fits the last one."""
    return (*(n for n in SEQ_BUCKETS if n < model.window), model.window)


def convert_coreml(model: ModelSpec, target: Path | None = None) -> Path:
    """Convert ``model`` to an fp16 mlprogram package (cached by model content)."""
    try:
        import coremltools as ct
    except ImportError as exc:
        raise BackendUnavailable(
            "coreml needs coremltools: pip install 'ssindex[coreml]'"
        ) from exc
    import torch

    from ssindex.backends.head import build_head
    from ssindex.backends.torch_backend import MPS_MASK_FILL, load_torch_model

    target = target or cache_dir() / "coreml" / f"{model.key[:16]}-fp16.mlpackage"
    if target.exists():
        return target
    inner = load_torch_model(model, "cpu")

    class AdditiveMask(torch.nn.Module):
        """The mask as a precomputed additive 4-D tensor: coremltools cannot convert the
        mask-building ops of recent transformers, and -1e4 keeps fp16 free of NaN."""

        def __init__(self) -> None:
            super().__init__()
            self.inner = inner
            self.head = build_head(model.card)

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            additive = (1.0 - attention_mask[:, None, None, :].float()) * MPS_MASK_FILL
            hidden = self.inner(input_ids=input_ids, attention_mask=additive).last_hidden_state
            return self.head(hidden, attention_mask)

    wrapper = AdditiveMask().eval()
    buckets = seq_buckets(model)
    example = torch.ones((1, buckets[0]), dtype=torch.int64)
    shapes = [(1, n) for n in buckets]
    inputs = [
        ct.TensorType(name=name, shape=ct.EnumeratedShapes(shapes=shapes), dtype=np.int32)
        for name in ("input_ids", "attention_mask")
    ]
    try:  # coremltools raises many kinds for ops it cannot convert
        traced = torch.jit.trace(wrapper, (example, example), strict=False)
        converted = ct.convert(
            traced, inputs=inputs, outputs=[ct.TensorType(name="pooled")],
            convert_to="mlprogram", compute_precision=ct.precision.FLOAT16,
            minimum_deployment_target=ct.target.macOS15,
        )
    except Exception as exc:
        raise BackendUnavailable(f"coreml cannot convert {model.name} "
                                 f"({model.card.architecture}): {first_line(exc)}") from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".tmp-{target.name}")
    converted.save(str(tmp))
    tmp.rename(target)
    return target


class CoreMLBackend:
    """A converted model on the Apple Neural Engine / GPU (macOS only)."""

    name = "coreml"
    device = "ane"
    dtype = "fp16"
    batch_tokens = DEFAULT_BATCH_TOKENS

    def __init__(self, model: ModelSpec) -> None:
        if platform.system() != "Darwin":
            raise BackendUnavailable("coreml predicts on macOS only (conversion works anywhere)")
        import coremltools as ct

        self._model: Any = ct.models.MLModel(str(convert_coreml(model)))
        self._buckets = seq_buckets(model)

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        out = []
        for ids, mask in zip(input_ids, attention_mask, strict=True):
            length = int(mask.sum())
            bucket = next((b for b in self._buckets if b >= length), self._buckets[-1])
            feed = {
                "input_ids": np.zeros((1, bucket), np.int32),
                "attention_mask": np.zeros((1, bucket), np.int32),
            }
            feed["input_ids"][0, : min(length, bucket)] = ids[: min(length, bucket)]
            feed["attention_mask"][0, : min(length, bucket)] = 1
            out.append(np.asarray(self._model.predict(feed)["pooled"], np.float32).reshape(-1))
        return np.stack(out)
