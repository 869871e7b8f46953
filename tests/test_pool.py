"""The CPU side in worker processes (``--workers``): the same index, and clean exits."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ssindex.backends.model import ModelSpec
from ssindex.config import BuildConfig, WalkConfig
from ssindex.index.layout import CHUNK_SCHEMA, IndexDir, row_digest
from ssindex.index.table import scan
from ssindex.pipeline.engines import pool
from ssindex.pipeline.engines.pool import Preparation, prepared
from ssindex.stages.walk import WalkStats, discover
from tests.conftest import CLI, cli_json, copy_stdlib

_SAME = ("chunks_total", "chunks_embedded", "chunks_deduplicated", "files_indexed",
         "files_skipped", "secrets_redacted", "chunkers")


def _tree(root: Path) -> Path:
    """json twice over (exact duplicates), a redacted secret, and files the walk skips."""
    copy_stdlib(root, "json")
    shutil.copytree(root / "json", root / "json_copy")
    (root / "settings.py").write_text(
        'API_TOKEN = "ghp_' + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8" + '"\n'
        "def configure(name):\n    return {'name': name, 'debug': False}\n")
    (root / "blob.py").write_bytes(b"\0\1\2binary")
    (root / "empty.py").write_text("   \n")
    return root


def _rows(index: Path) -> list[dict[str, Any]]:
    return sorted(scan(IndexDir(index).open_table(), CHUNK_SCHEMA.names).to_pylist(),
                  key=lambda row: row["id"])


def test_workers_build_the_one_worker_index_row_for_row(tmp_path: Path) -> None:
    root = _tree(tmp_path / "tree")
    one = cli_json("build", str(root), "--no-progress", "--workers", "1",
                   "--index", str(tmp_path / "one"))
    three = cli_json("build", str(root), "--no-progress", "--workers", "3",
                     "--index", str(tmp_path / "three"))
    assert one["chunks_deduplicated"] > 0 and one["secrets_redacted"] == 1
    assert set(one["files_skipped"]) == {"binary", "empty"}
    assert {k: one.get(k) for k in _SAME} == {k: three.get(k) for k in _SAME}
    rows = _rows(tmp_path / "three")
    assert _rows(tmp_path / "one") == rows  # ids, dup_of, vectors: all
    # a digest hashed in a worker is the one the row's stored fields give the driver that
    # writes it again (an incremental build): an unchanged row is not rewritten
    assert all(row_digest(row) == row["row_digest"] for row in rows)


def _descendants(pid: int) -> set[int]:
    return set(_below(pid))


def _below(pid: int) -> dict[int, int]:
    """Every living process below ``pid``, with its parent (from /proc: no psutil here)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    found: dict[int, int] = {}
    frontier = {pid}
    while frontier:
        level = {child: parent for child, parent in parents.items() if parent in frontier}
        found |= level
        frontier = set(level)
    return found


def _alive(pids: set[int]) -> set[int]:
    living = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            living.add(pid)
    return living


def _start(root: Path, tmp_path: Path) -> tuple[subprocess.Popen[str], set[int]]:
    """A 2-worker build, once its worker processes run."""
    process = subprocess.Popen(
        [CLI, "build", str(root), "--no-progress", "--workers", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    workers: set[int] = set()
    while len(workers) < 3 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
        workers = _descendants(process.pid)  # the fork server and its two workers
    assert process.poll() is None and len(workers) >= 3, "the pool never started"
    return process, workers


def _gone(pids: set[int], seconds: float = 30) -> set[int]:
    deadline = time.monotonic() + seconds
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _alive(pids)


def test_a_killed_or_interrupted_driver_leaves_no_worker_behind(tmp_path: Path) -> None:
    root = copy_stdlib(tmp_path / "tree", "email", "json")
    process, workers = _start(root, tmp_path)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert not _gone(workers)

    process, workers = _start(root, tmp_path)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not _gone(workers)  # their pipes closed: they exit on their own
    assert not (root / ".ssindex" / "HEAD.json").exists()
    assert cli_json("build", str(root), "--no-progress", "--workers", "2")["chunks_total"] > 0


def test_a_worker_that_dies_ends_the_build_with_a_clear_error(tmp_path: Path) -> None:
    # blocks for seconds of work: the kill lands while the workers have some (with
    # email and json alone, a slow start could see it land as the pool shut down)
    root = copy_stdlib(tmp_path / "tree", "email", "json", "asyncio", "unittest", "xml",
                       "multiprocessing", "importlib")
    process, workers = _start(root, tmp_path)
    # the workers are the fork server's children: the driver's grandchildren
    worker = next(pid for pid, parent in _below(process.pid).items() if parent != process.pid)
    os.kill(worker, signal.SIGKILL)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 7, stderr
    assert "a worker process died" in stderr and "--workers 1" in stderr
    assert "Traceback" not in stderr
    assert not (root / ".ssindex" / "HEAD.json").exists()
    assert not _gone(workers)


def test_a_worker_that_cannot_exit_does_not_hold_the_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker killed as the pool shuts down can die holding the task queue's lock; its
    partner then waits for that lock, and never for its stop sentinel. Stopped workers
    stand in for both (neither takes its sentinel): every file is back, so the build
    goes on once the grace period ends, and no worker is left behind."""
    monkeypatch.setattr(pool, "EXIT_GRACE_SECONDS", 1.0)
    root = copy_stdlib(tmp_path / "tree", "email")  # blocks enough for two workers
    stats = WalkStats()
    candidates = list(discover(root, WalkConfig(), stats))
    model = ModelSpec.resolve(None)
    before = set(multiprocessing.active_children())
    files = prepared(candidates, Preparation(BuildConfig(), model, model.key), 2, stats)
    got = [next(files) for _ in candidates]  # every file back; the pool still runs
    workers = set(multiprocessing.active_children()) - before
    assert len(workers) == 2
    for worker in workers:
        os.kill(worker.pid, signal.SIGSTOP)
    rest: list[object] = []
    finishing = threading.Thread(target=lambda: rest.extend(files), daemon=True)
    finishing.start()
    finishing.join(30)
    ended = not finishing.is_alive()
    for worker in workers:  # released, whatever happened: pytest must not hang on them
        worker.kill()
    assert ended, "the pool's shutdown waited on a worker that could not exit"
    assert rest == [] and len(got) == len(candidates)
    assert not _gone({worker.pid for worker in workers}, 5)
