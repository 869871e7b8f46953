"""The Ray engine on a real local cluster: same rows as the local engine, global dedupe,
incremental builds, and an embedding actor killed mid-batch."""

from __future__ import annotations

import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ssindex.codec import dequantize_matrix
from ssindex.index.layout import IndexDir
from ssindex.index.table import scan
from ssindex.pipeline.build import build
from ssindex.pipeline.engines.tally import Tallied
from ssindex.pipeline.plan import RayOptions
from ssindex.pipeline.progress import SilentProgress
from ssindex.query.searcher import Searcher
from ssindex.util.arrays import binary_matrix

from .conftest import STDLIB, copy_stdlib, run_cli, run_tty

pytestmark = pytest.mark.slow

_COLUMNS = ["id", "path", "start_line", "end_line", "symbol", "kind", "dup_of", "embed_key",
            "lex_body", "lex_name", "vec_codes", "vec_scale"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def _function(name: str) -> str:
    source = (STDLIB / "json" / "decoder.py").read_text()
    start = source.index(f"def {name}(")
    return source[start : source.index("\ndef ", start + 1)] + "\n"


def _tree(root: Path) -> Path:
    """json, plus a near-duplicate pair at the two ends of path order (so on different
    chunking tasks) and an exact copy in between."""
    copy_stdlib(root, "json")
    body = _function("py_scanstring")
    (root / "aaa").mkdir()
    (root / "aaa" / "first.py").write_text(body)
    (root / "mmm").mkdir()
    (root / "mmm" / "copy.py").write_text(body)
    (root / "zzz").mkdir()
    (root / "zzz" / "last.py").write_text(body.replace("chunks", "parts", 1))
    return root


def _rows(index: Path) -> dict[str, dict[str, Any]]:
    table = scan(IndexDir(index).open_table(), _COLUMNS)
    head = IndexDir(index).read_head()
    vectors = dequantize_matrix(binary_matrix(table["vec_codes"].combine_chunks()),
                                table["vec_scale"].to_numpy(), head.quantization, head.dim)
    rows = {}
    for row, vector in zip(table.select(_COLUMNS[:-2]).to_pylist(), vectors, strict=True):
        rows[row["id"]] = {**row, "vector": vector / np.linalg.norm(vector)}
    return rows


def _assert_same_rows(expected: Path, actual: Path) -> None:
    want, got = _rows(expected), _rows(actual)
    assert set(got) == set(want)
    for row_id, row in want.items():
        other = got[row_id]
        assert {k: v for k, v in other.items() if k != "vector"} == {
            k: v for k, v in row.items() if k != "vector"}
        assert float(row["vector"] @ other["vector"]) >= 0.999


@pytest.fixture(scope="module")
def built(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("ray")
    root = _tree(base / "tree")
    local = build(root, base / "local")
    started = time.perf_counter()
    distributed = build(root, base / "ray", ray=RayOptions(files_per_block=1))
    return {"base": base, "root": root, "local": local, "ray": distributed,
            "ray_seconds": time.perf_counter() - started}


def test_ray_build_equals_local_build(built: dict[str, Any]) -> None:
    base = built["base"]
    _assert_same_rows(base / "local", base / "ray")
    local, distributed = built["local"], built["ray"]
    assert distributed["engine"] == "ray"
    for key in ("files_indexed", "chunks_total", "chunks_embedded", "chunks_deduplicated",
                "chunks_near_duplicates", "chunkers"):
        assert distributed[key] == local[key], key
    # the actors run on this machine, so they choose what the local build chose here
    # (torch-cpu-bf16 on a CPU with AMX, torch-cpu elsewhere): never a name fixed here
    ray_backend, local_backend = (stats["backends"]["embed_bulk"] for stats in (distributed,
                                                                                 local))
    for field in ("backend", "device", "dtype"):
        assert ray_backend[field] == local_backend[field], field
    assert ray_backend["reason"].startswith("chosen on each actor: ")
    assert ray_backend["embed_actors"] >= 1


@pytest.mark.parametrize("backend", ["torch-cpu-fp32", "torch-cpu-bf16"])
def test_both_precisions_build_alike_on_both_engines(cluster: Any, tmp_path: Path,
                                                      backend: str) -> None:
    """Whatever this CPU would choose, each precision is checked on a small tree."""
    root = tmp_path / "tree"
    root.mkdir()
    shutil.copy(STDLIB / "json" / "scanner.py", root)
    overrides = {"embed_bulk": backend}
    local = build(root, tmp_path / "local", backend_overrides=overrides)
    distributed = build(root, tmp_path / "ray", backend_overrides=overrides,
                        ray=RayOptions(files_per_block=1))
    _assert_same_rows(tmp_path / "local", tmp_path / "ray")
    reports = [stats["backends"]["embed_bulk"] for stats in (local, distributed)]
    assert [(r["backend"], r["dtype"]) for r in reports] == [
        (backend, backend.removeprefix("torch-cpu-"))] * 2


def test_ray_build_summary_on_a_terminal_and_piped(tmp_path: Path) -> None:
    """The summary table of a Ray build, as a user reads it (not only ``--json``)."""
    root = tmp_path / "tree"
    root.mkdir()
    shutil.copy(STDLIB / "json" / "tool.py", root)
    piped = run_cli("build", str(root), "--engine", "ray", "--no-progress")
    code, screen = run_tty("build", str(root), "--engine", "ray", "--index",
                           str(tmp_path / "tty"))
    assert code == 0, screen
    for text in (piped.stdout, screen):
        flat = " ".join(text.split())
        assert "Traceback" not in text and "WARN" not in text, text
        count = re.search(r"\b(\d+) Ray (actors?)\): chosen on each actor", flat)
        assert "ssindex build" in flat and count is not None, flat
        assert count[2] == ("actor" if count[1] == "1" else "actors"), flat


class _Recorder(SilentProgress):
    """Progress as a front end receives it: each stage's advances, in order."""

    def __init__(self) -> None:
        self.steps: dict[str, list[int]] = {}

    def advance(self, stage: str, amount: int = 1) -> None:
        self.steps.setdefault(stage, []).append(amount)


def test_chunks_and_embeddings_are_reported_as_the_cluster_finishes_them(
        cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray Data hands a stage's output over only when all of it is done; the progress
    a user sees still moves while the tasks and actors work, and sums to the rows."""
    root = copy_stdlib(tmp_path / "tree", "json")
    for copy in range(40):  # chunked one by one, embedded once: a chunk stage of many tasks
        shutil.copy(root / "json" / "decoder.py", root / f"decoder_{copy}.py")
    monkeypatch.setattr(Tallied, "POLL_SECONDS", 0.05)
    recorder = _Recorder()
    stats = build(root, tmp_path / "index", progress=recorder,
                  ray=RayOptions(files_per_block=1, rows_per_embed_batch=8))
    for stage in ("chunk", "embed"):
        steps = [amount for amount in recorder.steps[stage] if amount]
        assert sum(steps) == stats["chunks_total"], (stage, steps)
        assert len(steps) > 1, (stage, steps)


def test_near_duplicates_on_different_tasks_are_found(built: dict[str, Any]) -> None:
    rows = _rows(built["base"] / "ray")

    def chunks(path: str) -> list[dict[str, Any]]:
        return sorted((r for r in rows.values() if r["path"] == path),
                      key=lambda r: r["start_line"])

    first, copy, last = chunks("aaa/first.py"), chunks("mmm/copy.py"), chunks("zzz/last.py")
    assert len(first) == len(copy) == len(last) >= 1
    assert all(row["dup_of"] is None for row in first)
    assert [row["dup_of"] for row in copy] == [row["id"] for row in first]  # exact
    assert [row["dup_of"] for row in last] == [row["id"] for row in first]  # near, 1 file/task
    assert any(a["embed_key"] != b["embed_key"] for a, b in zip(first, last, strict=True))
    assert built["ray"]["chunks_near_duplicates"] >= 1


def test_incremental_ray_build_equals_clean_local_build(built: dict[str, Any],
                                                       tmp_path: Path) -> None:
    root = tmp_path / "tree"
    shutil.copytree(built["root"], root)
    shutil.copytree(built["base"] / "ray", tmp_path / "index")
    (root / "json" / "tool.py").unlink()
    (root / "json" / "scanner.py").rename(root / "json" / "scanner_moved.py")
    decoder = root / "json" / "decoder.py"
    decoder.write_text(decoder.read_text().replace("Decode", "Decipher"))
    (root / "aaa" / "first.py").unlink()  # the exemplar goes: its duplicates get a new one
    stats = build(root, tmp_path / "index", ray=RayOptions(files_per_block=2))
    assert (stats["files_removed"], stats["files_new"], stats["files_changed"]) == (3, 1, 1)
    assert stats["files_unchanged"] == stats["files_indexed"] - 2
    assert stats["chunks_reused"] > 0
    assert stats["chunks_embedded"] < built["ray"]["chunks_embedded"] // 2
    build(root, tmp_path / "clean")
    _assert_same_rows(tmp_path / "clean", tmp_path / "index")
    again = build(root, tmp_path / "index", ray=RayOptions(files_per_block=2))
    assert (again["rows_written"], again["rows_deleted"], again["chunks_embedded"]) == (0, 0, 0)
    _assert_same_rows(tmp_path / "clean", tmp_path / "index")


def test_an_empty_tree_builds_an_empty_index(cluster: Any, tmp_path: Path) -> None:
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "blank.py").write_text("\n\n   \n")
    stats = build(tmp_path / "tree", tmp_path / "index", ray=RayOptions())
    assert stats["chunks_total"] == 0 and stats["engine"] == "ray"
    assert not Searcher(tmp_path / "index").search("anything", abstain=False).results


def _embed_actor_pids() -> dict[int, str]:
    """Ray titles its workers ``ray::<actor>[.<method>]``; the embedding actors' name it."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            title = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        if title.startswith("ray::") and "EmbedActor" in title:
            found[int(proc.name)] = title
    return found


def test_a_killed_embedding_actor_is_restarted_and_the_result_is_identical(
        built: dict[str, Any], tmp_path: Path) -> None:
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["stats"] = build(built["root"], tmp_path / "index",
                                    ray=RayOptions(files_per_block=4, rows_per_embed_batch=8))
        except BaseException as exc:  # handed to the test thread
            result["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    killed: int | None = None
    after_kill: set[int] = set()
    while worker.is_alive():
        for pid, title in _embed_actor_pids().items():
            if killed is None and title.endswith(".submit"):  # inside a batch
                os.kill(pid, signal.SIGKILL)
                killed = pid
            elif killed is not None and pid != killed:
                after_kill.add(pid)
        time.sleep(0.1)
    worker.join()
    assert "error" not in result, result.get("error")
    assert killed is not None, "the embedding actor was never seen at work"
    assert after_kill, "no replacement actor was started"
    _assert_same_rows(built["base"] / "local", tmp_path / "index")
    assert result["stats"]["chunks_embedded"] == built["local"]["chunks_embedded"]


def test_an_explicit_backend_the_actors_lack_fails_closed(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    shutil.copy(STDLIB / "json" / "tool.py", root)
    result = run_cli("build", str(root), "--engine", "ray", "--backend", "embed_bulk=torch-cuda",
                     "--no-progress", check=False)
    assert result.returncode == 6, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: torch-cuda:")
    assert not (root / ".ssindex" / "HEAD.json").exists()
    usage = run_cli("build", str(root), "--embed-actors", "2", check=False)
    assert usage.returncode == 2 and "need --engine ray" in usage.stderr
