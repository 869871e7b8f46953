"""The bf16 attention kernel: the same attention as torch's SDPA where it runs, SDPA
(said so, where it matters) wherever it cannot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ssindex.backends import attention
from ssindex.backends.model import ModelSpec
from ssindex.backends.torch_backend import SDPA_MASKED

kernel_cpu = pytest.mark.skipif(
    not attention.wanted(),
    reason=f"the CPU has neither AMX tiles nor AVX512-BF16 (or {attention.SWITCH_ENV}=0)")
"""The kernel's own tests need the instructions it is written in; elsewhere nothing runs it."""
each_product = pytest.mark.parametrize(
    "tiles", [False, True] if torch.cpu._is_amx_tile_supported() else [False],
    ids=lambda tiles: "tiles" if tiles else "registers")
"""Both ways of multiplying where the CPU has AMX tiles; AVX512-BF16 registers everywhere."""


@pytest.fixture
def kernel() -> None:
    """The kernel, installed inside the tests' own cache; where it should run, a kernel
    that cannot build fails."""
    assert attention.install() == ""


@kernel_cpu
@pytest.mark.usefixtures("kernel")
@each_product
@pytest.mark.parametrize(("seq", "dim"), [(40, 32), (170, 32), (512, 32), (77, 64)])
def test_the_kernel_gives_sdpa_attention_over_each_sequences_real_tokens(
        seq: int, dim: int, tiles: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random bf16 heads, sequences of 1 token, a block and one past it, and the whole
    width: rows within each length match SDPA under the padding mask; padded rows
    are zeros. Both ways of multiplying: AVX512-BF16 registers on every CPU the kernel
    runs on (AMX CPUs have them too), AMX tiles where the CPU has them (and where Linux
    refuses this process the tile state, the case fails)."""
    assert not tiles or attention.kind() == "AMX"
    monkeypatch.setattr(attention, "_tiles", tiles)

    generator = torch.Generator().manual_seed(seq + dim)
    batch, heads = 6, 384 // dim
    query, key, value = (torch.randn(batch, seq, heads, dim, generator=generator).mul(2)
                         .bfloat16() for _ in range(3))
    lengths = torch.tensor([1, 15, 16, 17, seq - 1, seq])
    out = torch.ops.ssindex.attention(query, key, value, lengths, dim ** -0.5).float()
    real = torch.arange(seq)[None, :] < lengths[:, None]
    expected = torch.nn.functional.scaled_dot_product_attention(
        *(x.float().transpose(1, 2) for x in (query, key, value)),
        attn_mask=real[:, None, None, :]).transpose(1, 2)
    rows, want = out[real].reshape(-1, dim), expected[real].reshape(-1, dim)
    assert torch.nn.functional.cosine_similarity(rows, want, dim=1).min() >= 0.9999
    assert (rows - want).abs().max() < 0.05
    assert not out[~real].any()


@kernel_cpu
@pytest.mark.usefixtures("kernel")
@each_product
def test_the_kernel_refuses_lengths_past_the_sequence_and_zeroes_an_empty_one(
        tiles: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator is public (``torch.ops.ssindex.attention``): a length past the
    sequence, or below zero, is refused before a row is read; a sequence of no tokens
    comes out as zeros."""
    monkeypatch.setattr(attention, "_tiles", tiles)
    heads = torch.randn(2, 40, 12, 32, generator=torch.Generator().manual_seed(0)).bfloat16()
    for lengths in ([41, 3], [-1, 3]):
        with pytest.raises(ValueError, match=r"lengths must lie in 0\.\.40"):
            torch.ops.ssindex.attention(heads, heads, heads, torch.tensor(lengths), 0.17)
    out = torch.ops.ssindex.attention(heads, heads, heads, torch.tensor([0, 40]), 0.17)
    assert not out[0].any() and out[1].isfinite().all() and out[1].any()


def test_a_bf16_cpu_model_runs_the_kernel_exactly_where_it_can() -> None:
    """On a CPU with AMX or AVX512-BF16 the bundled model's bf16 backend runs the kernel,
    close to fp32, and says which; elsewhere it runs SDPA and has nothing to say."""
    from ssindex.backends.base import Encoder
    from ssindex.backends.torch_backend import TorchBackend

    model = ModelSpec.resolve(None)
    backend = TorchBackend(model, "cpu", "bf16")
    runs_here = attention.install() == ""
    assert (backend.attn_implementation == attention.NAME) == runs_here
    assert backend.attention_note == (f"attention: {attention.kind()} kernel" if runs_here
                                      else "")
    texts = [(Path(__file__).parent / "test_walk.py").read_text()[:3000],
             "def parse(text):\n    return json.loads(text)", "x"]
    vectors = Encoder(backend, model).encode(texts)
    reference = Encoder(TorchBackend(model, "cpu", "fp32"), model).encode(texts)
    assert (vectors * reference).sum(axis=1).min() >= 0.999


def test_a_kernel_that_cannot_build_leaves_sdpa_and_a_reason(tmp_path: Path) -> None:
    """No compiler: where the kernel should run the selection falls back to SDPA, with the
    reason in its fallback reason and a warning; on any other CPU the reason is the CPU,
    and nothing is said. Its own process, since the kernel is installed once per process."""
    script = ("import json; from ssindex.backends import attention; "
              "from ssindex.backends.selector import select; "
              "from ssindex.backends.model import ModelSpec; warnings = []; "
              "s = select('embed_bulk', ModelSpec.resolve(None), 'torch-cpu-bf16', "
              "warn=warnings.append); print(json.dumps([attention.install(), "
              "s.backend.attn_implementation, s.fallback_reason, s.reason, warnings]))")
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"),
           "SSINDEX_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, check=True, timeout=300)
    why_not, implementation, fallback, reason, warnings = json.loads(
        done.stdout.splitlines()[-1])
    assert implementation is None and reason == "explicitly requested"
    if attention.wanted():
        assert "did not build" in why_not and "no C++ compiler" in why_not
        assert fallback.startswith("attention kernel unavailable, SDPA runs:")
        assert warnings == [f"embed_bulk: {fallback}"]
    else:
        assert why_not.startswith("not wanted here") and fallback is None and warnings == []


def test_the_selection_says_which_attention_runs() -> None:
    """The bulk selection's reason names the kernel where it runs, as a build's summary,
    ``doctor`` and each Ray actor's report show it; elsewhere it says nothing of it."""
    from ssindex.backends.selector import select

    warnings: list[str] = []
    selection = select("embed_bulk", ModelSpec.resolve(None), "torch-cpu-bf16",
                       warn=warnings.append)
    runs_here = attention.install() == ""
    assert selection.reason == (f"explicitly requested; attention: {attention.kind()} kernel"
                                if runs_here
                                else "explicitly requested")
    assert selection.fallback_reason is None and warnings == []


def test_a_calibrated_winner_picks_the_attention_and_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The attention ``ssindex calibrate`` found faster for this model: SDPA, or the
    kernel, each named with its figure; a winner measured on another model is not
    followed. On any CPU: the machine's answers (fast bf16, a kernel that installs) are set."""
    from ssindex.backends import torch_backend

    model = ModelSpec.resolve(None)
    monkeypatch.setattr(attention, "wanted", lambda: True)
    monkeypatch.setattr(attention, "install", lambda: "")

    def chosen(backend: str, measured_on: str = model.model_id) -> tuple[str | None, str, str]:
        winner = {"backend": backend, "figure": "9 vs 8", "model": measured_on}
        return torch_backend._attention(model, "cpu", "bf16", winner)

    assert chosen("sdpa") == (None, "attention: SDPA, calibrated winner (9 vs 8)", "")
    assert chosen(attention.NAME) == (
        attention.NAME, f"attention: {attention.kind()} kernel, calibrated winner (9 vs 8)", "")
    assert chosen("sdpa", "other-model@0123456789ab") == (
        attention.NAME, f"attention: {attention.kind()} kernel", "")
    monkeypatch.setattr(attention, "install", lambda: "no C++ compiler")
    assert chosen(attention.NAME) == (None, "", "attention kernel unavailable, SDPA runs: "
                                                "no C++ compiler")
    assert chosen("sdpa")[:2] == (None, "attention: SDPA, calibrated winner (9 vs 8)")
    monkeypatch.setattr(attention, "wanted", lambda: False)
    assert chosen("sdpa") == (None, "", "")
    assert torch_backend._attention(model, "cpu", "fp32", {}) == (None, "", "")


def test_the_stored_winner_reaches_the_bf16_backend(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stored SDPA winner for this machine and model is what ``create`` builds, on a
    CPU with AMX or AVX512-BF16; elsewhere there is no choice and nothing to say."""
    from ssindex.backends.calibration import CALIBRATION_FILE, machine_key
    from ssindex.backends.inventory import detect
    from ssindex.backends.registry import create
    from ssindex.backends.torch_backend import TorchBackend

    monkeypatch.setenv("SSINDEX_CONFIG_DIR", str(tmp_path))
    model = ModelSpec.resolve(None)
    record = {"machine": machine_key(detect()), "phases": {"attention": {
        "backend": "sdpa", "figure": "9 vs 8", "model": model.model_id}}}
    (tmp_path / CALIBRATION_FILE).write_text(json.dumps(record))
    backend = create("torch-cpu-bf16", model, detect())
    assert isinstance(backend, TorchBackend) and backend.attn_implementation is None
    assert backend.attention_note == ("attention: SDPA, calibrated winner (9 vs 8)"
                                      if attention.wanted() else "")
    unfollowed = create("torch-cpu-bf16", model, detect(), calibrated={})
    assert isinstance(unfollowed, TorchBackend)
    assert (unfollowed.attn_implementation == attention.NAME) == (attention.install() == "")


def test_the_switch_keeps_sdpa() -> None:
    script = ("from ssindex.backends import attention; "
              "print(attention.wanted(), bool(attention.install()))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, attention.SWITCH_ENV: "0"}, check=True, timeout=300)
    assert done.stdout.split() == ["False", "True"]


@pytest.mark.parametrize(("config", "width", "why"), [
    ({"model_type": "modernbert", "num_attention_heads": 12}, 768,
     "not a plain bidirectional encoder"),
    ({"model_type": "bert", "num_attention_heads": 4}, 64, "16 dims"),
    ({"model_type": "bert", "num_attention_heads": 12, "max_position_embeddings": 8192}, 384,
     "longer than 512"),
])
def test_models_the_kernel_cannot_take_keep_sdpa(config: dict[str, object], width: int,
                                                 why: str) -> None:
    reason = attention.unsupported(config, width, SDPA_MASKED)
    assert reason and why in reason


def test_the_bundled_model_fits_the_kernel() -> None:
    model = ModelSpec.resolve(None)
    assert attention.unsupported(model.config, model.card.hidden_size, SDPA_MASKED) is None
    distilbert = {"model_type": "distilbert", "n_heads": 12, "dim": 768}
    assert attention.unsupported(distilbert, 768, SDPA_MASKED) is None
