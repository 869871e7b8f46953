"""What a running build is doing: ``ssindex status`` and searches of a partial index ask.

A build keeps ``INDEX/build.json`` current (written whole, at most every
``EVERY`` seconds): its pid, when it started, how many files and chunks each
stage has passed, and how many chunks it expects. Whether the build still runs
is the build lock's answer, not the file's: the kernel drops the lock's
``flock`` with its holder, so the file of a killed build is never taken for a
live one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

from ssindex.util.fsio import atomic_write_bytes

EVERY = 2.0
"""Seconds between two writes of the file."""
FILE = "build.json"


class Activity:
    """The running build's side: counts per stage, written to ``INDEX/build.json``."""

    def __init__(self, index_path: Path, expected_chunks: int | None = None) -> None:
        self.path = Path(index_path) / FILE
        self.state: dict[str, Any] = {
            "pid": os.getpid(), "started": time.time(), "expected_chunks": expected_chunks,
            "counts": {}, "embed_started": None, "phase": "building"}
        self._written = 0.0

    def advance(self, stage: str, amount: int) -> None:
        counts = self.state["counts"]
        counts[stage] = counts.get(stage, 0) + amount
        if stage == "embed" and amount and self.state["embed_started"] is None:
            self.state["embed_started"] = time.time()
        if time.monotonic() - self._written >= EVERY:
            self.write()

    def expect(self, chunks: int, phase: str) -> None:
        """The build now knows how many chunks it will end with, and what it does next."""
        self.state.update(expected_chunks=chunks, phase=phase, embed_started=None, counts={})
        self.write()

    def write(self) -> None:
        self._written = time.monotonic()
        with contextlib.suppress(OSError):  # a report, never a reason to fail a build
            atomic_write_bytes(self.path, json.dumps(self.state).encode())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


def running_build(index_path: Path) -> dict[str, Any] | None:
    """The build running on ``index_path`` now: pid, start, chunks left and an ETA
    (from its embedding rate so far) when it knows them; ``None`` when none runs."""
    lock = Path(index_path) / "lock"
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
    try:
        state = json.loads((Path(index_path) / FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        state = {}
    if not holder.isdigit() or state.get("pid") != int(holder):
        return {"pid": int(holder) if holder.isdigit() else None}
    return _described(state)


def _described(state: dict[str, Any]) -> dict[str, Any]:
    now, counts = time.time(), state.get("counts", {})
    embedded, written = counts.get("embed", 0), counts.get("write", 0)
    expected = state.get("expected_chunks")
    report: dict[str, Any] = {
        "pid": state["pid"], "phase": state.get("phase"),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(state["started"])),
        "running_seconds": round(now - state["started"], 1),
        "chunks_seen": counts.get("chunk", 0), "chunks_embedded": embedded,
        "chunks_written": written}
    if expected is not None:  # a pass embeds its rows, or writes them without vectors
        report["chunks_left"] = max(expected - embedded - written, 0)
        began = state.get("embed_started")
        if began is not None and embedded and now > began:
            report["eta_seconds"] = round(report["chunks_left"] * (now - began) / embedded)
    return report
