"""Faults end with the previous index intact and searchable, or one line naming the fix.

The disks here are real: a small tmpfs the test mounts (root only), filled to the
byte count a case needs, or remounted read-only while a build runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from time import time_ns

import pytest

from tests.conftest import CLI, STDLIB, cli_json, run_cli

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
_PHASE = re.compile(r"while writing (.+?) in ")


@contextlib.contextmanager
def _tmpfs(path: Path, size: str = "8m") -> Iterator[Path]:
    path.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _tree(root: Path) -> Path:
    root.mkdir()
    for name in ("decoder.py", "encoder.py", "scanner.py"):
        shutil.copy(STDLIB / "json" / name, root / name)
    return root


def _search(index: Path) -> list[tuple[str, int]]:
    found = cli_json("search", "decode a json document", "--index", str(index), "-k", "5")
    return [(hit["path"], hit["start_line"]) for hit in found["results"]]


def _fill(disk: Path, leave_kib: int) -> Path:
    """A file that takes all of ``disk``'s free space but ``leave_kib``."""
    free = shutil.disk_usage(disk).free // 1024
    filler = disk / "filler"
    with open(filler, "wb") as handle:
        os.posix_fallocate(handle.fileno(), 0, max(free - leave_kib, 1) * 1024)
    return filler


def _phase(result: subprocess.CompletedProcess[str]) -> str:
    """What a build that failed on a full disk was writing: it exits 5 with one line."""
    line = _one_line_error(result, 5)
    assert "the previous index is intact" in line
    phase = _PHASE.search(line)
    assert phase is not None, line
    what = phase.group(1)
    return ("the table" if what.startswith("the table") else
            "search files" if what.startswith("manifests/") else what)


@needs_root
def test_a_full_disk_at_any_write_leaves_the_previous_index(tmp_path: Path) -> None:
    root = _tree(tmp_path / "repo")
    with _tmpfs(tmp_path / "disk") as disk:
        index = disk / "index"
        run_cli("build", str(root), "--index", str(index), "--no-progress")
        answers = _search(index)
        # every attempt's free KiB and failed write: the space a build needs grows a little
        # with each version, so one amount can fail at one write, then at another
        phases: list[tuple[int, str | None]] = []

        def attempt(leave_kib: int) -> str | None:
            # the same amount of new work each time: one function, renamed
            (root / "extra.py").write_text(f"def added_{leave_kib:05d}(x):\n    return x\n")
            filler = _fill(disk, leave_kib)
            try:
                result = run_cli("build", str(root), "--index", str(index), "--no-progress",
                                 check=False)
            finally:
                filler.unlink()
            phase = None if result.returncode == 0 else _phase(result)
            nonlocal answers
            if phase is None:
                answers = _search(index)
            else:
                assert _search(index) == answers  # the previous index answers as before
            phases.append((leave_kib, phase))
            return phase

        assert attempt(0) == "the build lock" and attempt(4096) is None
        for leave in (8, 16):  # room for the lock, none for the table
            attempt(leave)
        low, high = 16, 4096
        while high - low > 4:  # the least free space a build needs, to the page
            middle = (low + high) // 2 // 4 * 4
            if attempt(middle) is None:
                high = middle
            else:
                low = middle
        for leave in range(max(low - 8, 0), high + 1):  # just short of it: the last write
            if attempt(leave) == "HEAD.json":
                break
        seen = {phase for _, phase in phases}
        assert {"the build lock", "the table", "search files", "HEAD.json"} <= seen, [
            (leave, phase or "built") for leave, phase in phases]
        leftovers = list((index / "manifests").glob(".*"))
        assert leftovers == []  # a failed write leaves no half-written file
        run_cli("build", str(root), "--index", str(index), "--no-progress")
        assert _search(index)


@needs_root
def test_a_disk_that_turns_read_only_mid_build(tmp_path: Path) -> None:
    root = _tree(tmp_path / "repo")
    with _tmpfs(tmp_path / "backing", "64m") as backing:
        disk = tmp_path / "disk"  # the index's path: a bind mount of the tmpfs
        disk.mkdir()
        subprocess.run(["mount", "--bind", str(backing), str(disk)], check=True)
        index = disk / "index"
        try:
            run_cli("build", str(root), "--index", str(index), "--no-progress")
            answers = _search(index)
            for extra in range(4):  # enough new text that the build is still embedding
                text = (STDLIB / "textwrap.py").read_text()
                (root / f"wrap{extra}.py").write_text(text.replace("width", f"width{extra}"))
            env = {**os.environ, "SSINDEX_PROGRESS_SECONDS": "0"}
            process = subprocess.Popen([CLI, "build", str(root), "--index", str(index)],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, env=env)
            assert process.stderr is not None
            for line in process.stderr:
                if "embed " in line and not line.split("embed ")[1].startswith("0"):
                    break
            # the path turns read-only under the running build: a remount is refused while
            # it holds files open for writing, so the rw view is swapped for a ro one
            subprocess.run(["umount", "-l", str(disk)], check=True)
            subprocess.run(["mount", "--bind", "-o", "ro", str(backing), str(disk)],
                           check=True)
            _, stderr = process.communicate(timeout=300)
            line = _one_line_error(subprocess.CompletedProcess([], process.returncode, "",
                                                               stderr), 5)
            assert "read-only" in line and "previous index is intact" in line
            assert _search(index) == answers  # searchable on the read-only disk
            subprocess.run(["umount", str(disk)], check=True)
            subprocess.run(["mount", "--bind", str(backing), str(disk)], check=True)
            stats = cli_json("build", str(root), "--index", str(index), "--no-progress")
            assert stats["files_new"] == 4
        finally:
            subprocess.run(["umount", "-l", str(disk)], check=False)

def _flip(path: Path, truncate: bool = False) -> None:
    data = bytearray(path.read_bytes())
    if truncate:
        path.write_bytes(bytes(data[: len(data) // 2]))
        return
    data[len(data) // 2] ^= 0x5A
    path.write_bytes(bytes(data))


def _built(tmp_path: Path) -> tuple[Path, Path, list[tuple[str, int]]]:
    """A tree, its index, and the index's answers to ``_search``."""
    root = _tree(tmp_path / "repo")
    run_cli("build", str(root), "--no-progress")
    return root, root / ".ssindex", _search(root / ".ssindex")


def _one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code and "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(("damaged", "truncate"), [("search", False), ("postings", True)])
def test_a_damaged_search_file_is_detected_and_repaired(tmp_path: Path, damaged: str,
                                                        truncate: bool) -> None:
    _, index, answers = _built(tmp_path)
    head = json.loads((index / "HEAD.json").read_text())
    target = next((index / "manifests").glob(f"{damaged}-v*.arrow"))
    assert f"manifests/{target.name}" in head["checksums"]
    _flip(target, truncate)
    failed = run_cli("search", "decode a json document", "--index", str(index), check=False)
    line = _one_line_error(failed, 3)
    assert target.name in line and "ssindex repair" in line
    report = cli_json("repair", "--index", str(index))
    assert report["repaired"] == [f"manifests/{target.name}"]
    assert _search(index) == answers
    assert cli_json("repair", "--index", str(index))["damaged"] == []


@pytest.mark.parametrize("damaged", ["delta_snapshot", "deleted"])
def test_a_damaged_delta_is_repaired_into_one_base(tmp_path: Path, damaged: str) -> None:
    root, index, _ = _built(tmp_path)
    changed = next(path for path in sorted(root.rglob("*.py")) if "decode" in path.read_text())
    changed.write_text(changed.read_text() + "\n\ndef decode_twice(s):\n    return s * 2\n")
    run_cli("build", str(root), "--no-progress")
    answers = _search(index)
    head = json.loads((index / "HEAD.json").read_text())
    target = index / "manifests" / head[damaged]
    _flip(target)
    line = _one_line_error(run_cli("search", "decode a json document", "--index", str(index),
                                   check=False), 3)
    assert target.name in line and "ssindex repair" in line
    assert cli_json("repair", "--index", str(index))["repaired"] == [f"manifests/{target.name}"]
    repaired = json.loads((index / "HEAD.json").read_text())
    assert "delta_snapshot" not in repaired and repaired["snapshot"] != head["snapshot"]
    assert _search(index) == answers
    assert cli_json("repair", "--index", str(index))["damaged"] == []


def test_a_damaged_build_manifest_is_rebuilt_by_the_next_build(tmp_path: Path) -> None:
    root, index, answers = _built(tmp_path)
    head = json.loads((index / "HEAD.json").read_text())
    _flip(index / "manifests" / head["manifest"])
    result = run_cli("build", str(root), "--no-progress", "--json")
    assert "repairing damaged files of the previous index" in result.stderr
    stats = json.loads(result.stdout)
    assert stats["chunks_embedded"] == 0  # every vector reused
    assert _search(index) == answers
    assert cli_json("repair", "--index", str(index))["damaged"] == []


def test_a_damaged_table_file_is_named_and_rebuilt_from_the_tree(tmp_path: Path) -> None:
    root, index, answers = _built(tmp_path)
    fragment = next((index / "db" / "chunks.lance" / "data").glob("*.lance"))
    _flip(fragment)
    line = _one_line_error(run_cli("repair", "--index", str(index), check=False), 3)
    assert fragment.name in line and "ssindex build" in line
    assert _search(index) == answers  # searches read the intact search files meanwhile
    result = run_cli("build", str(root), "--no-progress")
    assert "rebuilding from scratch" in result.stderr and "damaged" in result.stderr
    assert _search(index) == answers
    assert cli_json("repair", "--index", str(index))["damaged"] == []


def test_a_table_whose_lance_manifest_is_lost_is_rebuilt_from_the_tree(tmp_path: Path) -> None:
    """Lance cannot open a table whose latest manifest is empty, and writing it anew
    reads that manifest first: the build removes the table and writes it again."""
    root, index, answers = _built(tmp_path)
    for manifest in (index / "db" / "chunks.lance" / "_versions").glob("*.manifest"):
        manifest.write_bytes(b"")
    result = run_cli("build", str(root), "--no-progress")
    assert "rebuilding from scratch" in result.stderr and "cannot open chunks" in result.stderr
    assert _search(index) == answers
    assert cli_json("build", str(root), "--no-progress")["chunks_embedded"] == 0


def test_a_file_that_vanishes_or_changes_between_walk_and_read(tmp_path: Path) -> None:
    """A file the walk trusted by its stat is read later (``reread``): gone by then, it
    is a counted skip; changed, it is read as it is now, with the hash of what was read."""
    from ssindex.config import WalkConfig
    from ssindex.records import Stamp
    from ssindex.stages.walk import WalkStats, content_hash, reread, walk

    for name in "ab":
        (tmp_path / f"{name}.py").write_text(f"{name} = 1\n")
    old = time_ns() - 10**10
    for name in "ab":
        os.utime(tmp_path / f"{name}.py", ns=(old, old))
    first = {s.path: s for s in walk(tmp_path, WalkConfig(), WalkStats())}
    known = {path: Stamp(s.size, s.mtime_ns, s.ctime_ns, s.inode, s.content_hash)
             for path, s in first.items()}
    stats = WalkStats()
    trusted = list(walk(tmp_path, WalkConfig(), stats, known=known))
    assert [s.read for s in trusted] == [False, False] and stats.files_read == 0
    (tmp_path / "a.py").unlink()
    (tmp_path / "b.py").write_text("b = 2  # changed after the walk\n")
    assert reread(tmp_path, trusted[0], WalkConfig(), stats) is None
    assert stats.skipped["vanished"] == 1
    changed = reread(tmp_path, trusted[1], WalkConfig(), stats)
    assert changed is not None and changed.text == "b = 2  # changed after the walk\n"
    assert changed.content_hash == content_hash(changed.text.encode())
