"""PyTorch backends: CPU (fp32 or bf16), CUDA (bf16/fp16) and Apple MPS (fp16).

Reduced precisions cast the weights, not autocast: on an AMX Xeon, bf16 weights ran
1.2x faster than bf16 autocast at the same cosine to fp32 (≥ 0.9999). ``compile``
swaps in a ``torch.compile`` graph of the transformer and its pooling head (inductor,
weights frozen into it) for builds large enough to repay its ~12-20 s of compiling.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ssindex.backends import attention
from ssindex.backends.head import build_head
from ssindex.backends.inventory import THREADS_ENV, thread_cap
from ssindex.backends.model import ModelSpec
from ssindex.errors import BackendUnavailable, first_line

MPS_MASK_FILL = -1e4
"""Additive mask value on MPS: fp16 turns ``finfo.min`` sums into -inf, then NaN."""

CPU_BATCH_TOKENS = {"bf16": 4096, "fp32": 16384}
"""Token budget of one CPU forward pass. In bf16 on an AMX Xeon, 4,096 tokens ran
1.3x faster than 16,384: the feed-forward layer's activations (tokens x 1,536) then
stay in the cache. fp32 keeps the budget it was measured at on AVX2 (0.84 of the
fp32 GEMM peak)."""
GPU_BATCH_TOKENS = 262_144
"""The most tokens of one GPU forward pass, less on a GPU with little memory."""
GPU_BYTES_PER_TOKEN = 64 << 10
"""Device memory a token of a forward pass may take (activations, with headroom)."""
SDPA_MASKED = frozenset({"albert", "bert", "distilbert", "electra", "roberta", "xlm-roberta"})
"""Bidirectional encoders whose attention takes a padding mask and nothing else: on CUDA
they get it ready for SDPA (``host_masks``), each giving the vectors of transformers' own
mask (``tests/test_models.py``), and on a CPU with AMX or AVX512-BF16 they may run
``backends.attention``.
Not ModernBERT, whose local attention lives in the mask transformers builds."""


def load_torch_model(model: ModelSpec, device: str, dtype: Any | None = None,
                     attention: str | None = None) -> Any:
    """The transformer weights from safetensors only (never a pickle), in ``dtype``
    (float32 when ``None``, whatever the file stores: a model saved in bf16 would
    otherwise run in bf16 on the fp32 backends and the ONNX export); ``attention``
    picks the attention implementation (transformers' default when ``None``). A model
    transformers cannot build is one ``BackendUnavailable`` line naming its architecture."""
    import torch
    from transformers import AutoModel
    from transformers.utils import logging

    logging.disable_progress_bar()
    try:
        module = AutoModel.from_pretrained(
            model.path, local_files_only=True, use_safetensors=True,
            attn_implementation=attention, trust_remote_code=model.trust_remote_code)
    except (ValueError, KeyError, ImportError, OSError) as exc:
        raise BackendUnavailable(f"torch cannot load {model.name} ({model.card.architecture}):"
                                 f" {first_line(exc)}") from exc
    module.eval()
    return module.to(device=device, dtype=dtype or torch.float32)


class TorchBackend:
    """One transformer on one torch device.

    ``precision`` is ``fp32``, ``bf16`` or ``fp16`` (weights cast; bf16 for AMX CPUs
    and CUDA, fp16 for MPS). ``batch_tokens`` is the token budget this device runs
    best at (``Encoder`` batches by it unless configured otherwise). ``attention_winner``
    is what ``ssindex calibrate`` measured for attention on this machine (its
    ``backend``, ``attention.NAME`` or ``"sdpa"``, its ``figure`` and the ``model`` it
    was measured on), if anything.
    """

    def __init__(self, model: ModelSpec, device: str = "cpu", precision: str = "fp32",
                 attention_winner: dict[str, str] | None = None) -> None:
        import torch

        self.device = device
        self._threads = thread_cap() if device == "cpu" and os.environ.get(THREADS_ENV) else 0
        """Threads a pass runs on (0: torch's default, every core). torch keeps the count
        per calling thread, so it is set where the passes run: a backend loaded on a
        background thread (``LazyEncoder.prepare``) ran on every core, whatever
        ``ssindex watch`` left to the editor."""
        self.dtype = precision
        suffix = "" if precision == "fp32" else f"-{precision}"
        self.name = f"torch-{device.split(':')[0]}{suffix}"
        weights_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.attn_implementation, self.attention_note, self.attention_fallback = _attention(
            model, device, precision, attention_winner or {})
        """The attention kernel's name where it runs (None: SDPA); for the report,
        which attention runs where the kernel could, and why it could not where it failed."""
        self._module = load_torch_model(model, device, weights_dtype, self.attn_implementation)
        self._pooled = _pooled(self._module, build_head(model.card).to(device))
        self._compiled: Any = None
        self._torch = torch
        self.batch_tokens = _batch_tokens(torch, device, precision)
        self.pinned = True
        """On CUDA, whether batches travel through pinned (page-locked) host memory,
        which lets their copies run asynchronously (``benchmarks/gpu_check.py``
        measures both)."""
        self.host_masks = device.startswith("cuda") and _takes_sdpa_masks(self._module)
        """Whether the model gets its mask ready for SDPA: boolean per key, or none where
        nothing is padded, which is known here. Given the 0/1 mask, transformers asks
        the device whether it hides anything: a host sync per batch, which holds back
        the next batch's launch. On CUDA, for ``SDPA_MASKED`` models (transformers 5)."""

    @property
    def compiled(self) -> bool:
        return self._compiled is not None

    @property
    def compile_repays(self) -> bool:
        """Whether a large build gains from ``compile`` here: measured for bf16 on a CPU
        (1.26x on an AMX Xeon), not yet elsewhere."""
        return (self.device, self.dtype) == ("cpu", "bf16")

    def compile(self) -> None:
        """Replace the eager graph with a compiled one (raises when inductor cannot run
        here, e.g. without a C++ compiler). Shapes stay dynamic, so batches of any
        size and width reuse one graph; its kernels are cached across runs in the
        cache directory (``backends.model``). Torch's caches of whole graphs are turned
        off: they are pickles, and nothing ssindex writes to disk is."""
        import torch._dynamo.config as dynamo_config
        import torch._functorch.config as functorch_config
        import torch._inductor.config as inductor_config

        torch = self._torch
        inductor_config.fx_graph_cache = False
        functorch_config.enable_autograd_cache = False
        inductor_config.freezing = True  # weights become constants: prepacked for oneDNN
        # the modules' float settings (dropout, eps, attention scale) are constants; traced
        # as symbols, they made dynamo trace the model twice (21.3 -> 18.0 s on AMX)
        dynamo_config.specialize_float = True
        if self.device == "cpu":
            threading.Thread(target=_probe_vector_isas, daemon=True,
                             name="ssindex-isa-probe").start()
        compiled = torch.compile(self._pooled, dynamic=True)
        ids = np.full((2, 16), 1000, dtype=np.int64)
        full, padded = np.ones_like(ids), np.ones_like(ids)
        padded[1, 8:] = 0
        # compiles now, not on a real batch; with ``host_masks`` a batch without padding
        # passes no mask and a padded one a boolean mask: two graphs, both compiled here
        for mask in (full, padded) if self.host_masks else (full,):
            self._run(compiled, ids, mask)
        self._compiled = compiled

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        if self.device.startswith("cuda"):
            return self.submit(input_ids, attention_mask)()
        return self._run(self._module_for(input_ids), input_ids, attention_mask).cpu().numpy()

    def submit(self, input_ids: np.ndarray, attention_mask: np.ndarray,
               ) -> Callable[[], np.ndarray]:
        """Start a forward pass; the returned call waits for its pooled vectors. On CUDA
        the pass runs on while the caller pads the next batch (``Encoder`` keeps one in
        flight): the inputs go up from pinned host memory, the vectors come back into
        pinned memory, and only the returned call waits, on one event. Elsewhere the
        pass runs before this returns."""
        if not self.device.startswith("cuda"):
            computed = self.forward(input_ids, attention_mask)
            return lambda: computed
        torch = self._torch
        pooled = self._run(self._module_for(input_ids), input_ids, attention_mask)
        if not self.pinned:  # a copy to pageable memory waits for the pass: when asked
            return lambda: pooled.cpu().numpy()
        host = torch.empty(pooled.shape, dtype=torch.float32, pin_memory=True)
        host.copy_(pooled, non_blocking=True)
        done = torch.cuda.Event()
        done.record()

        def vectors() -> np.ndarray:
            done.synchronize()
            return host.numpy()

        return vectors

    def _module_for(self, input_ids: np.ndarray) -> Any:
        # a one-row batch would make dynamo specialize on the size 1 and compile again
        return self._compiled if self._compiled is not None and len(input_ids) > 1 \
            else self._pooled

    def _run(self, module: Any, input_ids: np.ndarray, attention_mask: np.ndarray) -> Any:
        """The pooled float32 vectors of one batch, on the device."""
        torch = self._torch
        if self._threads and torch.get_num_threads() != self._threads:
            torch.set_num_threads(self._threads)
        ids = torch.from_numpy(input_ids)
        mask = torch.from_numpy(attention_mask)
        if self.device.startswith("cuda") and self.pinned:
            ids = ids.pin_memory().to(self.device, non_blocking=True)
            mask = mask.pin_memory().to(self.device, non_blocking=True)
        elif self.device != "cpu":
            ids, mask = ids.to(self.device), mask.to(self.device)
        model_mask: Any = mask
        if self.device == "mps":
            model_mask = ((1 - mask[:, None, None, :].half()) * MPS_MASK_FILL).half()
        elif self.host_masks:
            model_mask = None if attention_mask.all() else mask[:, None, None, :].bool()
        with torch.inference_mode():
            return module(ids, model_mask, mask)


def _pooled(module: Any, head: Any) -> Any:
    """The transformer and its head as one module, of (ids, the mask the transformer
    takes, the 0/1 mask) to float32 vectors. One module, so ``compile`` fuses the
    pooling into the graph: run eagerly after it, pooling read the token states three
    times (cast, masked product, sum), 1-2% of a compiled bf16 pass on an AMX Xeon."""
    import torch

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.transformer, self.head = module, head

        def forward(self, input_ids: Any, model_mask: Any, mask: Any) -> Any:
            hidden = self.transformer(input_ids=input_ids,
                                      attention_mask=model_mask).last_hidden_state
            return self.head(hidden, mask).float()

    return Pooled().eval()


def _attention(model: ModelSpec, device: str, precision: str,
               winner: dict[str, str]) -> tuple[str | None, str, str]:
    """The attention implementation for bf16 on a CPU (None: transformers' default,
    SDPA where supported), which one the report names, and why the kernel could not
    run. The bf16 kernel (``backends.attention``) runs where it can, unless calibration
    found SDPA faster on this machine for this model (``winner``, measured on the model
    it names); elsewhere nothing is said."""
    if ((device, precision) != ("cpu", "bf16") or not attention.wanted()
            or attention.unsupported(model.config, model.card.hidden_size, SDPA_MASKED)):
        return None, "", ""
    if winner and winner.get("model") != model.model_id:
        winner = {}
    calibrated = f", calibrated winner ({winner['figure']})" if winner.get("figure") else ""
    if winner.get("backend") == "sdpa":
        return None, f"attention: SDPA{calibrated}", ""
    why_not = attention.install()
    if not why_not:
        return attention.NAME, f"attention: {attention.kind()} kernel{calibrated}", ""
    return None, "", f"attention kernel unavailable, SDPA runs: {why_not}"


def _takes_sdpa_masks(module: Any) -> bool:
    """Whether ``module`` runs SDPA attention under transformers' mask functions, which
    pass a 4-d mask through as it is (transformers 5; 4.x rejects it)."""
    import transformers

    config = module.config
    return (int(transformers.__version__.split(".")[0]) >= 5 and config.model_type in SDPA_MASKED
            and config._attn_implementation == "sdpa")


def _batch_tokens(torch: Any, device: str, precision: str) -> int:
    """The token budget of one forward pass on ``device``."""
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(max(4096, min(GPU_BATCH_TOKENS, free // GPU_BYTES_PER_TOKEN)))
    return CPU_BATCH_TOKENS.get(precision, CPU_BATCH_TOKENS["fp32"])


def _probe_vector_isas() -> None:
    """Let inductor find the CPU's vector ISAs now. It compiles a probe program per ISA
    and feature, one after another, the first time it generates a kernel: ten g++ runs,
    7.3 s cold on an AMX Xeon. Begun as the compile starts, they run on another core
    while the graph is traced (8.4 s there), and the kernels' code generation finds
    them cached (functools caches them in the process, the probes' libraries in
    inductor's cache directory). A failure here is inductor's own: an ISA it would drop
    anyway, or an error its own call meets again."""
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    with contextlib.suppress(Exception):
        valid_vec_isa_list()
