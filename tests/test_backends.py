"""Backends: parity of everything that runs here, selection over simulated machines."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ssindex.backends import attention
from ssindex.backends.base import (
    BULK_TEXTS,
    TRIM_ROWS,
    WIDTH_STEP,
    Encoder,
    _token_budget_batches,
)
from ssindex.backends.inventory import THREADS_ENV, Inventory, detect
from ssindex.backends.model import ModelSpec
from ssindex.backends.names import BACKENDS, PHASES, parse_overrides
from ssindex.backends.registry import FACTORIES, create
from ssindex.backends.selector import candidates, select
from ssindex.backends.torch_backend import TorchBackend
from ssindex.config import BuildConfig, ChunkConfig, EmbedConfig
from ssindex.errors import BackendUnavailable, ConfigError
from ssindex.pipeline.encoder import LazyEncoder
from ssindex.pipeline.progress import SilentProgress
from ssindex.records import SourceFile
from ssindex.stages.chunk import chunk_file
from ssindex.stages.embed import ModelWindow, embedding_text
from ssindex.stages.walk import content_hash
from ssindex.tools.calibrate import runnable_backends
from ssindex.util import heap

from .conftest import STDLIB, cli_json, run_cli, run_tty


@pytest.fixture(scope="module")
def model() -> ModelSpec:
    return ModelSpec.resolve(None)


@pytest.fixture(scope="module")
def texts(model: ModelSpec) -> list[str]:
    """Chunks as a build makes them: cut to the model's window, so that sentence-transformers
    (which truncates) and ssindex (which reads a longer text window by window) agree."""
    text = (STDLIB / "json" / "decoder.py").read_text()
    source = SourceFile("json/decoder.py", "python", text, len(text), 0,
                        content_hash(text.encode()))
    chunks, _ = chunk_file(source, ChunkConfig(), ModelWindow(model))
    return [embedding_text(c) for c in chunks[:12]] + ["decode json from a string"]


@pytest.fixture(scope="module")
def reference(model: ModelSpec, texts: list[str]) -> np.ndarray:
    return Encoder(create("torch-cpu-fp32", model, detect()), model).encode(texts)


@pytest.mark.parametrize("name", ["torch-cpu-bf16", "onnx-cpu", "onnx-cpu-int8"])
def test_backend_parity_with_fp32(name: str, model: ModelSpec, texts: list[str],
                                  reference: np.ndarray) -> None:
    vectors = Encoder(create(name, model, detect()), model).encode(texts)
    cosines = (vectors * reference).sum(axis=1)
    assert cosines.min() >= 0.999, cosines.min()
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_batches_run_in_few_shapes_that_change_no_vector(
        model: ModelSpec, texts: list[str], reference: np.ndarray) -> None:
    """Widths round up to ``WIDTH_STEP`` and a short batch's rows to a power of two, so
    a build runs a bounded set of shapes (oneDNN keeps a primitive per shape); the
    padding columns and repeated rows leave every text's vector as it was."""
    rng = np.random.default_rng(0)
    shapes = set()
    for _ in range(50):
        lengths = sorted(rng.integers(1, model.window + 1, 300).tolist(), reverse=True)
        for batch, (rows, width) in _token_budget_batches(lengths, 4096, model.window):
            assert rows >= batch.stop - batch.start and width >= lengths[batch.start]
            assert width % WIDTH_STEP == 0 or width == model.window
            shapes.add((rows, width))
    assert len(shapes) <= model.window // WIDTH_STEP * 10, len(shapes)
    unrounded = _token_budget_batches(lengths, 4096, model.window, round_rows=False)
    assert all(rows == batch.stop - batch.start for batch, (rows, _) in unrounded)
    backend = create("torch-cpu-fp32", model, detect())
    seen: list[tuple[int, ...]] = []
    forward = backend.forward

    def recording(input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        seen.append(input_ids.shape)
        return forward(input_ids, attention_mask)

    backend.forward = recording
    vectors = Encoder(backend, model, batch_tokens=700).encode(texts)
    assert any(shape[0] > 1 for shape in seen)
    assert all(shape[1] % WIDTH_STEP == 0 for shape in seen)
    assert (vectors * reference).sum(axis=1).min() >= 0.99999


def test_the_next_batch_starts_before_the_last_one_is_awaited(
        model: ModelSpec, texts: list[str], reference: np.ndarray) -> None:
    """A backend with ``submit`` (torch on CUDA) computes while the host pads the next
    batch: ``Encoder`` starts batch n+1 before it waits for batch n, and the vectors
    land in their texts' rows. Here the real fp32 backend's pass is deferred until
    awaited, as a GPU's would finish later."""
    backend = create("torch-cpu-fp32", model, detect())
    events: list[str] = []

    def deferred(input_ids: np.ndarray, attention_mask: np.ndarray) -> Callable[[], np.ndarray]:
        events.append("start")

        def wait() -> np.ndarray:
            events.append("wait")
            return backend.forward(input_ids, attention_mask)
        return wait

    backend.submit = deferred
    encoder = Encoder(backend, model, batch_tokens=700)
    vectors = encoder.encode(texts)
    assert events[:3] == ["start", "start", "wait"] and events.count("start") > 2
    assert (vectors * reference).sum(axis=1).min() >= 0.99999
    events.clear()
    encoder.overlap = False
    assert np.array_equal(encoder.encode(texts), vectors)
    assert events[:4] == ["start", "wait", "start", "wait"]


def test_bulk_calls_give_freed_memory_back_every_trim_rows(
        model: ModelSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bulk calls trim the heap each ``TRIM_ROWS`` rows embedded, counted across calls (a
    call of 1,024 chunks would otherwise hold ~50 batches' freed tensors); a query-sized
    call never trims."""
    trims: list[int] = []
    monkeypatch.setattr(heap, "trim", lambda: trims.append(1))
    # a one-token budget runs a row a batch, so that trims fall exactly on the count
    encoder = Encoder(create("torch-cpu-fp32", model, detect()), model, batch_tokens=1)
    texts = [f"def handler_{i}(event): return {i}" for i in range(2 * TRIM_ROWS)]
    encoder.encode(texts[:BULK_TEXTS - 1])
    assert trims == []
    encoder.encode(texts[: TRIM_ROWS // 2])
    assert trims == []
    encoder.encode(texts[: TRIM_ROWS // 2])
    assert len(trims) == 1
    encoder.encode(texts[: 2 * TRIM_ROWS])
    assert len(trims) == 3


def test_compiled_model_matches_fp32_and_caches_no_pickle(
        model: ModelSpec, texts: list[str], reference: np.ndarray) -> None:
    """``torch.compile``: the same vectors, in batches of any shape (a one-row batch runs
    the eager graph), and on disk only generated sources and shared objects."""
    backend = TorchBackend(model, "cpu", "bf16")
    backend.compile()
    assert backend.compiled
    vectors = Encoder(backend, model, batch_tokens=700).encode(texts)
    assert (vectors * reference).sum(axis=1).min() >= 0.999
    single = Encoder(backend, model).encode(texts[-1:])
    assert float(single[0] @ reference[-1]) >= 0.999
    from torch._inductor.runtime.cache_dir_utils import cache_dir as kernel_dir

    cached = [path for path in Path(kernel_dir()).rglob("*") if path.is_file()]
    assert any(path.suffix == ".so" for path in cached)
    pickles = [path for path in cached if path.suffix in {".pkl", ".pickle"}
               or path.read_bytes()[:2] in {b"\x80\x04", b"\x80\x05"}]
    assert not pickles


def test_failed_compile_keeps_the_eager_model_visibly(
        model: ModelSpec, texts: list[str], reference: np.ndarray) -> None:
    """A machine without a working C++ compiler: the build warns, reports why, and
    embeds on the eager model. (Torch's own ``patch``: pytest's ``monkeypatch`` left
    inductor's ``cpp.cxx`` deleted, failing every later compile in the process.)"""
    import torch._inductor.config as inductor_config

    warnings: list[str] = []

    class Warned(SilentProgress):
        def message(self, text: str) -> None:
            warnings.append(text)

    cfg = BuildConfig(embed=EmbedConfig(compile="always"))
    encoder = LazyEncoder(model, cfg, "torch-cpu-fp32", Warned())
    with inductor_config.patch({"cpp.cxx": (None, "/nonexistent/c++")}):
        vectors = encoder.encode(texts)
    assert (vectors * reference).sum(axis=1).min() >= 0.9999
    report = encoder.report()
    assert report.fallback_reason and "torch.compile failed" in report.fallback_reason
    assert "torch.compile" not in report.reason
    assert any("torch.compile failed" in warning for warning in warnings)


def test_the_thread_cap_holds_where_the_passes_run(
        model: ModelSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """``SSINDEX_THREADS`` (``ssindex watch``) caps torch's threads on the thread that runs
    the passes: torch keeps the count per thread, and a backend loaded in the background
    ran on every core."""
    import torch

    monkeypatch.setenv(THREADS_ENV, "1")
    loaded: list[TorchBackend] = []
    loader = threading.Thread(target=lambda: loaded.append(TorchBackend(model, "cpu")))
    loader.start()
    loader.join()
    before = torch.get_num_threads()
    try:
        Encoder(loaded[0], model).encode(["def handler(event): return event"])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_reference_matches_sentence_transformers(model: ModelSpec, texts: list[str],
                                                 reference: np.ndarray) -> None:
    sentence_transformers = pytest.importorskip("sentence_transformers")
    st = sentence_transformers.SentenceTransformer(str(model.path), device="cpu")
    expected = st.encode(texts, normalize_embeddings=True)
    assert (expected * reference).sum(axis=1).min() >= 0.9999


def _machine(**kw: object) -> Inventory:
    base: dict[str, object] = {"system": "Linux", "machine": "x86_64", "cpu_model": "test",
                               "cpu_count": 8}
    return Inventory(**(base | kw))  # type: ignore[arg-type]


def test_selection_over_simulated_inventories() -> None:
    gpu = _machine(cuda_devices=({"name": "NVIDIA H200", "memory_gib": 139.8},))
    assert candidates("embed_bulk", gpu)[0][0] == "torch-cuda"
    assert candidates("embed_query", gpu)[0][0] == "onnx-cuda"
    mac = _machine(system="Darwin", machine="arm64", mps=True, neural_engine=True)
    assert candidates("embed_bulk", mac)[0][0] == "torch-mps"
    assert candidates("embed_query", mac)[0][0] == "onnx-coreml"
    amx = _machine(cpu_flags=frozenset({"amx_bf16", "avx512f"}))
    assert "bf16" in candidates("embed_bulk", amx)[0][1]
    plain = _machine(cpu_flags=frozenset({"avx2"}))
    assert [c[0] for c in candidates("embed_bulk", plain)] == ["torch-cpu"]
    assert "fp32" in candidates("embed_bulk", plain)[0][1]
    assert [c[0] for c in candidates("embed_query", plain)] == ["onnx-cpu-int8", "onnx-cpu",
                                                                "torch-cpu"]
    calibrated = {"embed_query": {"backend": "torch-cpu", "figure": "2.0 ms"}}
    assert candidates("embed_query", plain, calibrated)[0][0] == "torch-cpu"


def test_auto_falls_back_visibly_when_first_choice_fails(model: ModelSpec) -> None:
    """A machine that claims a GPU it does not have: the probe fails, CPU takes over."""
    liar = _machine(cuda_devices=({"name": "phantom", "memory_gib": 1.0},),
                    runtimes=detect().runtimes)
    warnings: list[str] = []
    selection = select("embed_bulk", model, inventory=liar, warn=warnings.append)
    assert selection.name.startswith("torch-cpu")
    assert selection.fallback_reason and "torch-cuda" in selection.fallback_reason
    assert warnings and "falling back" in warnings[0]


def test_explicit_unavailable_backend_raises(model: ModelSpec) -> None:
    with pytest.raises(BackendUnavailable, match="torch-cuda"):
        select("embed_bulk", model, "torch-cuda", inventory=_machine())
    with pytest.raises(ConfigError):
        parse_overrides(["embed_bulk=warp-drive"])
    with pytest.raises(ConfigError):
        parse_overrides(["index=torch-cpu"])


def test_every_backend_auto_mode_or_calibration_can_pick_is_a_valid_choice() -> None:
    """What auto mode picks, a user can ask for by name (``--backend PHASE=NAME``)."""
    machine = _machine(cuda_devices=({"name": "NVIDIA H200", "memory_gib": 139.8},),
                       mps=True, neural_engine=True)
    named = {name for phase in PHASES for name, _ in candidates(phase, machine)}
    named |= set(runnable_backends(machine))
    for name in sorted(named):
        assert parse_overrides([f"embed_query={name}"]) == {"embed_query": name}
    assert set(FACTORIES) == set(BACKENDS)  # every valid name has a factory, and no more


def test_cli_explicit_cuda_fails_cleanly(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("def f():\n    return 1\n")
    result = run_cli("build", str(tmp_path), "--backend", "embed_bulk=torch-cuda", check=False)
    assert result.returncode != 0
    assert "torch-cuda" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_an_explicit_backend_that_cannot_run_fails_even_with_nothing_to_embed(
        tmp_path: Path) -> None:
    """The explicit backend loads while the first files are prepared; one that cannot
    run must still fail the build before it commits, even where every vector is
    reused and no chunk would have asked for it."""
    from ssindex import build
    from ssindex.index.layout import IndexDir

    (tmp_path / "a.py").write_text("def f():\n    return 1\n")
    build(tmp_path, backend_overrides={"embed_bulk": "onnx-cpu"})
    index = IndexDir(tmp_path / ".ssindex")
    head = index.read_head().data
    with pytest.raises(BackendUnavailable, match="torch-cuda"):
        build(tmp_path, backend_overrides={"embed_bulk": "torch-cuda"})
    assert index.read_head().data["table_version"] == head["table_version"]
    assert build(tmp_path, backend_overrides={"embed_bulk": "onnx-cpu"})["chunks_embedded"] == 0


def test_doctor_names_backend_and_reason_per_phase() -> None:
    report = cli_json("doctor")
    for phase in ("embed_bulk", "embed_query"):
        assert report["phases"][phase]["backend"] and report["phases"][phase]["reason"]
    assert report["phases"]["embed_query"]["backend"] == "onnx-cpu-int8"
    assert report["hardware"]["cpu_count"] >= 1


def test_coreml_conversion_runs_on_any_platform(model: ModelSpec, tmp_path: Path) -> None:
    pytest.importorskip("coremltools", reason="the coreml extra is not installed")
    from ssindex.backends.coreml_backend import convert_coreml

    assert convert_coreml(model, tmp_path / "m.mlpackage").exists()


def test_onnx_and_torch_bulk_builds_rank_alike(tmp_path: Path) -> None:
    """Both torch precisions, whichever this CPU would choose, against ONNX Runtime."""
    import shutil

    queries = ["decode json from a string", "encode a python object as json",
               "scan a json string literal", "JSONDecodeError", "make_scanner"]
    tops = []
    for backend in ("onnx-cpu", "torch-cpu-fp32", "torch-cpu-bf16"):
        root = tmp_path / backend
        shutil.copytree(STDLIB / "json", root / "json", ignore=shutil.ignore_patterns("__py*"))
        stats = cli_json("build", str(root), "--no-progress", "--backend",
                         f"embed_bulk={backend}")
        assert stats["backends"]["embed_bulk"]["backend"] == backend
        tops.append([[(h["path"], h["start_line"]) for h in cli_json(
            "search", q, "--index", str(root / ".ssindex"), "-k", "5")["results"]]
            for q in queries])
        response = cli_json("search", queries[0], "--index", str(root / ".ssindex"))
        assert response["backend"]["backend"] == "onnx-cpu-int8"
    assert tops[1] == tops[0]
    # bf16 moves scores by ~1e-4: the best hit is the same, the rest may swap places
    for bf16, fp32 in zip(tops[2], tops[0], strict=True):
        assert bf16[0] == fp32[0] and len(set(bf16) & set(fp32)) >= 4, (bf16, fp32)


def test_calibrate_stores_winners_that_doctor_and_auto_use(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSINDEX_CONFIG_DIR", str(tmp_path))
    code, screen = run_tty("calibrate")  # as a user sees it; the record is read back below
    assert code == 0 and "Traceback" not in screen, screen
    stored = tmp_path / "calibration.json"
    assert f"stored in {stored}" in screen and "{" not in screen, screen
    record = json.loads(stored.read_text())
    for phase in ("embed_bulk", "embed_query"):
        assert f"{phase} → {record['phases'][phase]['backend']} (" in screen, screen
    for phase in ("embed_bulk", "embed_query"):
        assert record["phases"][phase]["backend"] in record["figures"]
    timed = {n: f for n, f in record["figures"].items() if "error" not in f}
    assert {"torch-cpu-fp32", "onnx-cpu", "onnx-cpu-int8"} <= timed.keys()
    assert all(f["bulk_chunks_per_s"] > 0 and f["query_ms_p50"] > 0 for f in timed.values())
    for name, figure in timed.items():
        assert f"{figure['bulk_chunks_per_s']} chunks/s in bulk" in screen, (name, screen)
    if attention.install() == "":  # a fast-bf16 CPU: bf16 timed with the kernel and with SDPA
        assert record["phases"]["attention"]["backend"] in (attention.NAME, "sdpa")
        assert record["phases"]["attention"]["model"] == record["model"]
        assert f"attention → {record['phases']['attention']['backend']} (" in screen
    else:
        assert "attention" not in record["phases"]
    assert "attention_error" not in record
    report = cli_json("doctor")
    assert report["calibrated"]["embed_query"]["backend"] == record["phases"]["embed_query"][
        "backend"]
    assert report["phases"]["embed_query"]["reason"].startswith("calibrated winner")


def test_a_calibration_of_another_shape_is_left_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A calibration file edited by hand or by another version never breaks a backend's
    creation nor ``doctor``: entries of another shape are left out, figures optional."""
    from ssindex.backends.calibration import CALIBRATION_FILE, load_calibration, machine_key

    monkeypatch.setenv("SSINDEX_CONFIG_DIR", str(tmp_path))
    machine = machine_key(detect())
    for phases in (None, "x", [1], {"attention": "sdpa", "embed_query": {"figure": "1 ms"}}):
        (tmp_path / CALIBRATION_FILE).write_text(json.dumps({"machine": machine,
                                                              "phases": phases}))
        assert load_calibration(detect()) == {}
        assert create("torch-cpu-fp32", ModelSpec.resolve(None), detect()) is not None
    (tmp_path / CALIBRATION_FILE).write_text(json.dumps({"machine": machine, "phases": {
        "embed_query": {"backend": "onnx-cpu"}, "attention": ["sdpa"]}}))
    assert load_calibration(detect()) == {"embed_query": {"backend": "onnx-cpu"}}
    done = run_cli("doctor")
    assert "embed_query: onnx-cpu (?)" in " ".join(done.stdout.replace("│", " ").split())


def test_model_fingerprint_is_remembered_until_a_file_is_rewritten(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fingerprint is the model's content hash; the remembered one stands only while
    no file was rewritten, even one rewritten in place with its size and mtime kept."""
    monkeypatch.setenv("SSINDEX_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 4}')
    weights = model / "model.safetensors"
    weights.write_bytes(b"A" * 64)
    first = ModelSpec(model, "m").fingerprint
    assert list((tmp_path / "cache" / "fingerprints").iterdir())
    assert ModelSpec(model, "m").fingerprint == first
    stat = weights.stat()
    weights.write_bytes(b"B" * 64)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    second = ModelSpec(model, "m").fingerprint
    assert second != first
    weights.write_bytes(b"A" * 64)
    assert ModelSpec(model, "m").fingerprint == first
