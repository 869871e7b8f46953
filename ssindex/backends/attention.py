"""bf16 attention for small encoders on CPUs with AMX tiles or AVX512-BF16 (``attention.cpp``).

torch's CPU flash kernel runs a small encoder's attention (12 heads of 32 dims, ~170
tokens) at about a tenth of the efficiency of its linear layers: it splits queries
into 32-row blocks, makes two oneDNN calls per block, and packs keys for AMX only in
fp16. That was a third of a compiled bf16 pass on an AMX Xeon, and 38% on an AVX512-BF16
EPYC. The kernel here takes a whole (sequence, head) per task, over its real tokens
only, with the scores and P.V in AMX tiles (1.6-2.7x torch's kernel on the shapes a
build feeds it) or, on a CPU without them, in AVX512-BF16 registers (~6x on a Zen 5
EPYC). It is written by hand because no library ships attention for these shapes on a
CPU; g++ compiles it on first use into the cache directory, as inductor does its kernels.

It serves bidirectional encoders whose padding is on the right (``Encoder`` pads so,
and ``SDPA_MASKED`` lists the architectures), heads of 32 or 64 dims, and sequences of
up to 512 tokens; elsewhere attention stays torch's SDPA.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from importlib.resources import files
from pathlib import Path
from typing import Any

from ssindex.util.dirs import cache_dir

NAME = "ssindex_bf16"
"""The implementation's name among transformers' attention functions."""
SWITCH_ENV = "SSINDEX_CPU_ATTENTION"
"""Set to ``0`` to keep torch's SDPA where the kernel would run."""
HEAD_DIMS = (32, 64)
MAX_TOKENS = 512
FLAGS = ("-O3", "-shared", "-fPIC", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl",
         "-mavx512dq", "-mavx512bf16", "-mfma", "-mamx-tile", "-mamx-bf16")
"""One shared library; OpenMP binds to the ``libgomp`` torch has loaded, so the kernel
runs on torch's threads and honours ``torch.set_num_threads``."""

_lock = threading.Lock()
_installed: str | None = None
"""Why the kernel cannot run here ("" once it is installed); None before the first try."""
_tiles = False
"""Whether the installed kernel runs on AMX tiles (else in AVX512-BF16 registers)."""


def unsupported(config: dict[str, Any], width: int, encoders: frozenset[str]) -> str | None:
    """Why a model of ``config`` (its ``config.json``) and token states ``width`` wide
    keeps SDPA, or None when the kernel fits it; ``encoders`` are the architectures
    whose attention takes a padding mask and nothing else."""
    heads = config.get("num_attention_heads") or config.get("n_heads") or 0
    if config.get("model_type") not in encoders:
        return f"{config.get('model_type')} is not a plain bidirectional encoder"
    if not heads or width // heads not in HEAD_DIMS:
        return f"heads of {width // heads if heads else '?'} dims (the kernel takes 32 or 64)"
    if config.get("max_position_embeddings", MAX_TOKENS) > MAX_TOKENS:
        return f"sequences longer than {MAX_TOKENS} tokens"
    return None


def wanted() -> bool:
    """Whether this machine should run the kernel: Linux on a CPU with AMX tiles or
    AVX512-BF16, and not turned off by ``SSINDEX_CPU_ATTENTION=0``."""
    import torch

    return (os.environ.get(SWITCH_ENV, "1") != "0" and sys.platform.startswith("linux")
            and (torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()))


def kind() -> str:
    """Where the installed kernel multiplies: ``AMX`` tiles, or ``AVX512-BF16`` registers."""
    return "AMX" if _tiles else "AVX512-BF16"


def install() -> str:
    """Compile (once per machine), load and register the kernel; the empty string when
    it runs here, else why not (not ``wanted``, no compiler, a failed build)."""
    global _installed
    with _lock:
        if _installed is None:
            _installed = _install()
        return _installed


def _install() -> str:
    global _tiles
    import torch
    import transformers

    if not wanted():
        return f"not wanted here (no AMX tiles nor AVX512-BF16, or {SWITCH_ENV}=0)"
    if int(transformers.__version__.split(".")[0]) < 5:
        return "transformers 4.x passes no padding mask to a custom attention"
    try:
        library = ctypes.CDLL(str(_compiled()))
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the attention kernel did not build: {exc}"
    # without AMX, or refused its tile state by Linux, the kernel runs in registers
    _tiles = torch.cpu._is_amx_tile_supported() and library.ssindex_amx_init() == 0
    _register(torch, library)
    return ""


def _compiled() -> Path:
    """The kernel's shared library, built into the cache directory under a hash of its
    source, flags and compiler; written atomically, so racing builds both succeed."""
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        raise OSError("no C++ compiler (g++, or $CXX)")
    source = files("ssindex.backends").joinpath("attention.cpp").read_bytes()
    version = subprocess.run([compiler, "--version"], capture_output=True, check=True,
                             timeout=30).stdout
    key = hashlib.sha256(b"\0".join([source, " ".join(FLAGS).encode(), version])).hexdigest()
    target = cache_dir() / "kernels" / f"attention-{key[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        code = Path(scratch) / "attention.cpp"
        code.write_bytes(source)
        built = Path(scratch) / target.name
        done = subprocess.run([compiler, *FLAGS, "-o", str(built), str(code)],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise OSError(done.stderr.strip().splitlines()[-1] if done.stderr.strip()
                          else f"{compiler} exited {done.returncode}")
        os.replace(built, target)
    return target


def _register(torch: Any, library: ctypes.CDLL) -> None:
    """The kernel as a torch operator (opaque to ``torch.compile``, which calls it from
    its graph) and as a transformers attention implementation that gets the 0/1 mask."""
    from transformers import AttentionInterface, AttentionMaskInterface

    attend = library.ssindex_attend
    attend.restype = ctypes.c_int
    attend.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4 + [ctypes.c_int64] * 2 \
        + [ctypes.c_float, ctypes.c_int]

    @torch.library.custom_op("ssindex::attention", mutates_args=(), schema=(
        "(Tensor query, Tensor key, Tensor value, Tensor lengths, float scale) -> Tensor"))
    def attention(query: Any, key: Any, value: Any, lengths: Any, scale: float) -> Any:
        """Attention of (batch, seq, heads, dim) bf16 tensors over each sequence's first
        ``lengths`` tokens; padded rows come out as zeros."""
        batch, seq, heads, dim = query.shape
        query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
        lengths = lengths.to(torch.int64).contiguous()
        out = torch.empty_like(query)
        failed = attend(query.data_ptr(), key.data_ptr(), value.data_ptr(), out.data_ptr(),
                        lengths.data_ptr(), batch, seq, heads, dim, seq * heads * dim,
                        heads * dim, scale, int(_tiles))
        if failed == 2:
            raise ValueError(f"attention lengths must lie in 0..{seq}, the sequence's tokens; "
                             f"got {lengths.tolist()}")
        if failed:
            raise RuntimeError(f"the attention kernel cannot take {seq} tokens of {dim}-dim "
                               "heads")
        return out

    @attention.register_fake
    def _(query: Any, key: Any, value: Any, lengths: Any, scale: float) -> Any:
        return torch.empty_like(query)

    def forward(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                scaling: float | None = None, **_: Any) -> tuple[Any, None]:
        batch, _heads, seq, dim = query.shape
        lengths = (attention_mask.sum(-1) if attention_mask is not None
                   else torch.full((batch,), seq, dtype=torch.int64))
        out = torch.ops.ssindex.attention(query.transpose(1, 2), key.transpose(1, 2),
                                          value.transpose(1, 2), lengths,
                                          float(scaling if scaling is not None else dim ** -0.5))
        return out, None

    AttentionInterface.register(NAME, forward)
    # transformers hands a custom attention no mask unless one is registered: the 0/1
    # padding mask (made boolean) is what the kernel reads its lengths from
    AttentionMaskInterface.register(NAME, _padding_mask)


def _padding_mask(*_: Any, attention_mask: Any = None, **__: Any) -> Any:
    return attention_mask
