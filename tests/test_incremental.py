"""Incremental, resumable, crash-safe builds: real processes, real files, the real model."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ssindex.index.layout import IndexDir
from ssindex.index.table import scan
from ssindex.pipeline.staging import Staging

from .conftest import CLI, STDLIB, cli_json, run_cli

ROW_FIELDS = ["id", "path", "start_line", "end_line", "symbol", "kind", "dup_of", "text"]


def _tree(root: Path) -> Path:
    shutil.copytree(STDLIB / "json", root / "json", ignore=shutil.ignore_patterns("__py*"))
    return root


def _rows(index: Path) -> dict[str, dict[str, Any]]:
    table = IndexDir(index).open_table()
    data = scan(table, [*ROW_FIELDS, "vec_codes", "vec_scale"]).to_pylist()
    return {row["id"]: row for row in data}


def _assert_same_rows(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> None:
    assert a.keys() == b.keys()
    for row_id, row in a.items():
        other = b[row_id]
        assert {k: row[k] for k in ROW_FIELDS} == {k: other[k] for k in ROW_FIELDS}
        va = np.frombuffer(row["vec_codes"], np.int8) * row["vec_scale"]
        vb = np.frombuffer(other["vec_codes"], np.int8) * other["vec_scale"]
        assert float(va @ vb / np.linalg.norm(va) / np.linalg.norm(vb)) >= 0.999


def _build(root: Path, *args: str) -> dict[str, Any]:
    return cli_json("build", str(root), "--no-progress", *args)


def _edit(root: Path) -> None:
    """Change, remove, copy and rename files: every kind of incremental event."""
    decoder = root / "json" / "decoder.py"
    decoder.write_text(decoder.read_text().replace("def py_scanstring(", "def py_scan_string("))
    (root / "json" / "tool.py").unlink()
    shutil.copy(root / "json" / "encoder.py", root / "encoder_copy.py")
    (root / "json" / "scanner.py").rename(root / "json" / "scanner_renamed.py")


def test_incremental_equals_clean_build(tmp_path: Path) -> None:
    root = _tree(tmp_path / "a")
    first = _build(root)
    again = _build(root)
    assert again["chunks_embedded"] == 0 and again["rows_written"] == 0
    assert again["files_unchanged"] == first["files_indexed"]
    assert again["backends"]["embed_bulk"]["backend"] is None  # the model was never loaded
    _edit(root)
    incremental = _build(root)
    assert incremental["files_removed"] == 2 and incremental["files_new"] == 2
    assert incremental["files_changed"] == 1
    # the copy and the renamed file cost nothing; only the renamed function's chunks (cut to
    # the model's window, each one embedded under the function's name) are embedded again,
    # and at most one neighbour, whose boundary can move with the new name's token count
    renamed = [row for row in _rows(root / ".ssindex").values()
               if row["symbol"] == "py_scan_string"]
    assert 0 < incremental["chunks_embedded"] <= len(renamed) + 1
    clean = _tree(tmp_path / "b")
    shutil.rmtree(clean / "json")
    shutil.copytree(root / "json", clean / "json")
    shutil.copy(root / "encoder_copy.py", clean / "encoder_copy.py")
    _build(clean)
    _assert_same_rows(_rows(root / ".ssindex"), _rows(clean / ".ssindex"))


def test_changed_settings_invalidate_what_depends_on_them(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _build(root)
    (tmp_path / "small.toml").write_text("[chunk]\nmax_chars = 300\n")
    rechunked = _build(root, "--config", str(tmp_path / "small.toml"))
    assert rechunked["files_unchanged"] == 0  # new chunker settings: every file re-chunked
    assert rechunked["chunks_reused"] > 0  # ... but identical chunk texts keep their vectors
    requantized = _build(root, "--config", str(tmp_path / "small.toml"), "--quantize", "int4")
    assert requantized["chunks_reused"] == 0 and requantized["quantization"] == "int4"
    assert run_cli("build", str(root), "--check", "--config", str(tmp_path / "small.toml"),
                   "--quantize", "int4", check=False).returncode == 0


def test_check_gates_ci(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    assert run_cli("build", str(root), "--check", check=False).returncode == 1  # no index
    _build(root)
    assert run_cli("build", str(root), "--check", check=False).returncode == 0
    summary = run_cli("build", str(root), "--no-progress").stdout  # the table, not JSON
    assert "0 embedded" in summary and "every vector was reused" in summary
    (root / "json" / "new.py").write_text("def added():\n    return 1\n")
    result = run_cli("build", str(root), "--check", "--json", check=False)
    assert result.returncode == 1 and "new" in result.stdout


def _spawn_build(root: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "SSINDEX_PROGRESS_SECONDS": "0"}
    return subprocess.Popen([CLI, "build", str(root), "--no-progress", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _kill_when(process: subprocess.Popen[str], ready: Any, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not ready() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process.poll() is None, "build finished before the kill point"
    process.send_signal(signal.SIGKILL)
    process.wait()


def _progress_shows(process: subprocess.Popen[str], stage: str) -> Any:
    """A predicate: the build's progress lines show ``stage`` past zero."""
    assert process.stderr is not None
    fd = process.stderr.fileno()
    os.set_blocking(fd, False)
    seen = bytearray()

    def ready() -> bool:
        with contextlib.suppress(BlockingIOError):
            seen.extend(os.read(fd, 65536))
        return any(f"{stage} " in line and not line.split(f"{stage} ")[1].startswith("0")
                   for line in seen.decode(errors="replace").splitlines())

    return ready


@pytest.mark.parametrize("point", ["walk", "embed", "write"])
def test_sigkill_leaves_old_index_and_next_build_recovers(tmp_path: Path, point: str) -> None:
    root = _tree(tmp_path / "tree")
    _build(root)
    before = cli_json("search", "decode json document", "--index", str(root / ".ssindex"))
    _edit(root)
    for extra in range(3):  # enough new text that embedding takes a while
        shutil.copy(STDLIB / "textwrap.py", root / f"wrap{extra}.py")
        text = (root / f"wrap{extra}.py").read_text()
        (root / f"wrap{extra}.py").write_text(text.replace("width", f"width{extra}"))
    process = _spawn_build(root)
    versions = root / ".ssindex" / "db" / "chunks.lance" / "_versions"
    count = len(list(versions.iterdir()))
    ready = {
        "walk": _progress_shows(process, "walk"),
        "embed": _progress_shows(process, "embed"),
        "write": lambda: len(list(versions.iterdir())) > count,
    }[point]
    _kill_when(process, ready)
    after = cli_json("search", "decode json document", "--index", str(root / ".ssindex"))
    assert after["results"] == before["results"]  # the old index answers, unchanged
    resumed = _build(root)
    if point == "embed":
        assert resumed["chunks_reused"] > 0
    clean = tmp_path / "clean"
    shutil.copytree(root, clean, ignore=shutil.ignore_patterns(".ssindex"))
    _build(clean)
    _assert_same_rows(_rows(root / ".ssindex"), _rows(clean / ".ssindex"))


def test_a_changed_line_length_limit_judges_unchanged_files_again(tmp_path: Path) -> None:
    """Stat-trusted files are not read, so a new limit must make the walk read them."""
    root = tmp_path / "tree"
    root.mkdir()
    (root / "app.py").write_text("def main():\n    return 1\n")
    (root / "bundle.js").write_text(";".join(f"function f{i}(){{}}" for i in range(900)))
    keep_all = tmp_path / "keep.toml"
    keep_all.write_text("[walk]\nmax_average_line_chars = 0\n")
    time.sleep(2.1)  # files older than the racy-stat margin: the next build may trust them
    assert _build(root, "--config", str(keep_all))["files_indexed"] == 2
    rebuilt = _build(root)
    assert rebuilt["files_skipped"] == {"minified": 1} and rebuilt["files_removed"] == 1
    paths = {row["path"] for row in _rows(root / ".ssindex").values()}
    assert paths == {"app.py"}


def test_ctrl_c_stops_a_clean_build_cleanly(tmp_path: Path) -> None:
    """SIGINT while a clean build embeds: exit 130 with one line (no abort, no
    traceback, no backend falling back), nothing committed, and the next build
    reuses the batches checkpointed before the interrupt."""
    root = tmp_path / "tree"
    shutil.copytree(STDLIB / "email", root / "email", ignore=shutil.ignore_patterns("__py*"))
    config = tmp_path / "short.toml"
    config.write_text("[embed]\nmax_tokens = 64\n")  # several batches, each quick
    process = subprocess.Popen(
        [CLI, "build", str(root), "--no-progress", "--config", str(config)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # not inherited ignored
    staging = root / ".ssindex" / "staging"
    deadline = time.monotonic() + 300
    while not any(staging.glob("*/*.arrow")) and process.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process.poll() is None, "build finished before its first checkpoint"
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "interrupted: searches see the last committed build" in stderr
    for noise in ("terminate called", "Traceback", "falling back"):
        assert noise not in stderr
    assert not (root / ".ssindex" / "HEAD.json").exists()
    resumed = cli_json("build", str(root), "--no-progress", "--config", str(config))
    assert resumed["chunks_reused"] > 0
    assert resumed["chunks_reused"] + resumed["chunks_embedded"] + resumed[
        "chunks_deduplicated"] == resumed["chunks_total"]


def test_checkpoints_group_quick_batches_and_lose_none(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches embedded in quick succession wait to share one checkpoint file (the
    first is written at once); a flush writes the rest, and a resuming build reads
    every vector back exactly."""
    monkeypatch.setattr("ssindex.pipeline.staging.CHECKPOINT_SECONDS", 3600.0)
    vectors = np.random.default_rng(0).standard_normal((9, 4)).astype(np.float32)
    keys = [f"key-{i}" for i in range(9)]
    staging = Staging(tmp_path, "model")
    for start in (0, 3, 6):
        staging.checkpoint(keys[start : start + 3], vectors[start : start + 3])
    assert len(list(staging.path.glob("*.arrow"))) == 1
    staging.flush()
    assert len(list(staging.path.glob("*.arrow"))) == 2
    resumed = Staging(tmp_path, "model")
    assert resumed.load() == 9
    found = resumed.lookup(keys)
    assert np.array_equal(np.stack([found[key] for key in keys]), vectors)


READER = """
import sys, json
from ssindex.query.searcher import Searcher
index, rounds = sys.argv[1], int(sys.argv[2])
errors, seen = 0, set()
for _ in range(rounds):
    try:
        hits = Searcher(index).search("versionmarker", k=50, mode="lexical").results
        tags = {line.split("=")[1].strip() for h in hits for line in h["text"].splitlines()
                if line.startswith("TAG =")}
        if len(tags) != 1 or len(hits) != 3:
            errors += 1
        seen |= tags
    except Exception as exc:
        errors += 1
        print(repr(exc), file=sys.stderr)
print(json.dumps({"errors": errors, "seen": sorted(seen)}))
"""


def test_reader_never_sees_a_mixed_or_broken_index(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    root.mkdir()

    def write(tag: str) -> None:
        for name in ("a", "b", "c"):
            (root / f"{name}.py").write_text(
                f"TAG = '{tag}'\n\ndef {name}_versionmarker():\n    return '{name}'\n")

    write("v0")
    _build(root)
    reader = subprocess.Popen([sys.executable, "-c", READER, str(root / ".ssindex"), "150"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for round_ in range(1, 4):
        write(f"v{round_}")
        _build(root)
    out, err = reader.communicate(timeout=600)
    report = __import__("json").loads(out)
    assert report["errors"] == 0, err
    assert len(report["seen"]) >= 1


def test_lock_blocks_a_second_builder_and_stale_locks_are_broken(tmp_path: Path) -> None:
    import fcntl

    root = _tree(tmp_path)
    index = root / ".ssindex"
    index.mkdir()
    with open(index / "lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("999999")
        held.flush()
        result = run_cli("build", str(root), "--no-progress", check=False)
        assert result.returncode == 4 and "another build" in result.stderr
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (index / "lock").write_text(str(dead.pid))
    result = run_cli("build", str(root), "--no-progress")
    assert "stale lock" in result.stderr


def test_many_small_rebuilds_keep_the_table_compact(tmp_path: Path) -> None:
    """Each incremental commit adds a fragment; compaction waits for more than
    ``MAX_FRAGMENTS``, then runs: a CI job rebuilding every hour must not grow the table
    by a fragment per build."""
    from ssindex import Searcher, build
    from ssindex.index.table import MAX_FRAGMENTS

    root = tmp_path / "tree"
    root.mkdir()
    rounds = MAX_FRAGMENTS + 4
    for part in range(rounds):
        (root / f"part_{part}.py").write_text(f"def part_{part}():\n    return {part}\n")
    build(root)
    counts = []
    for part in range(rounds):  # each round edits another file
        (root / f"part_{part}.py").write_text(f"def edited_part_{part}():\n    return -{part}\n")
        build(root)
        table = IndexDir(root / ".ssindex").open_table()
        counts.append(table.stats()["fragment_stats"]["num_fragments"])
    assert max(counts) == MAX_FRAGMENTS and counts[-1] < max(counts), counts
    hits = Searcher(root / ".ssindex").search(f"edited_part_{rounds - 1}", k=1)
    assert hits.results[0]["symbol"] == f"edited_part_{rounds - 1}"


def test_sigkill_during_compaction_and_cleanup_loses_nothing(tmp_path: Path) -> None:
    """A build killed while it compacts the table, or while it drops old versions after
    its commit, leaves a searchable index, and the next build completes both."""
    from ssindex import build
    from ssindex.index.table import MAX_FRAGMENTS

    root = tmp_path / "tree"
    root.mkdir()
    for part in range(MAX_FRAGMENTS + 1):
        (root / f"part_{part}.py").write_text(f"def part_{part}():\n    return {part}\n")
    build(root)
    for part in range(MAX_FRAGMENTS):  # one fragment per rebuild: the next one compacts
        (root / f"part_{part}.py").write_text(f"def edited_{part}():\n    return -{part}\n")
        build(root)
    index = root / ".ssindex"
    versions = index / "db" / "chunks.lance" / "_versions"
    for round_, new_versions in enumerate((1, 2, 3)):  # at, in and after the merge
        (root / "part_8.py").write_text(f"def killed_{round_}():\n    return {round_}\n")
        before = cli_json("search", "edited_3", "--index", str(index), "--mode", "lexical")
        target = len(list(versions.iterdir())) + new_versions
        process = _spawn_build(root)
        _kill_when(process, lambda target=target: len(list(versions.iterdir())) >= target)
        after = cli_json("search", "edited_3", "--index", str(index), "--mode", "lexical")
        assert after["results"] == before["results"]
    stats = _build(root)
    fragments = IndexDir(index).open_table().stats()["fragment_stats"]["num_fragments"]
    assert fragments <= MAX_FRAGMENTS and stats["chunks_total"] == MAX_FRAGMENTS + 1
    # a purge drops every old version right after the commit: kill it there
    _build(root, "--allow-secrets")
    (root / "part_8.py").write_text("def purged():\n    return 0\n")
    head = index / "HEAD.json"
    written = head.stat().st_mtime_ns
    process = _spawn_build(root)
    _kill_when(process, lambda: head.stat().st_mtime_ns != written)
    assert cli_json("repair", "--index", str(index))["damaged"] == []
    assert cli_json("search", "purged", "--index", str(index), "--mode", "lexical",
                    "-k", "1")["results"][0]["symbol"] == "purged"
    _build(root)
    clean = tmp_path / "clean"
    shutil.copytree(root, clean, ignore=shutil.ignore_patterns(".ssindex"))
    _build(clean)
    _assert_same_rows(_rows(index), _rows(clean / ".ssindex"))


def test_rebuild_reads_only_files_whose_stat_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unchanged files are trusted by size, mtime, ctime and inode and not read; an edit
    that keeps the size and restores the mtime still moves the ctime, so it is read."""
    from ssindex import build

    monkeypatch.setattr("ssindex.pipeline.previous.STAT_MARGIN_NS", 0)  # no 2 s wait
    root = _tree(tmp_path)
    first = build(root)
    assert first["files_read"] == first["files_indexed"] >= 5
    again = build(root)
    assert again["files_read"] == 0 and again["rows_written"] == 0
    assert run_cli("build", str(root), "--check", check=False).returncode == 0
    decoder = root / "json" / "decoder.py"
    before = decoder.stat()
    text = decoder.read_text()
    decoder.write_text(text.replace("def py_scanstring(", "def py_scanstrinq("))
    os.utime(decoder, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert decoder.stat().st_size == before.st_size
    assert run_cli("build", str(root), "--check", check=False).returncode == 1
    edited = build(root)
    assert edited["files_read"] == 1 and edited["files_changed"] == 1
    assert edited["chunks_embedded"] >= 1
    hits = cli_json("search", "py_scanstrinq", "--index", str(root / ".ssindex"), "-k", "1")
    assert hits["results"][0]["symbol"].endswith("py_scanstrinq")
