"""``ssindex watch``, ``serve --watch`` and ``mcp-config``: real files in tmp dirs, real
inotify events, real git branches, the real model, the installed CLI."""

from __future__ import annotations

import fcntl
import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import anyio
import pytest

from ssindex.index.layout import IndexDir

from .conftest import CLI, cli_json, copy_stdlib, run_cli

BUILT = re.compile(r"indexed: (\d+) changed, (\d+) new, (\d+) removed")
FAILED = "build failed ("


class WatchProcess:
    """``ssindex watch`` in a child process, its stderr read line by line."""

    def __init__(self, root: Path, *args: str) -> None:
        self.proc = subprocess.Popen([CLI, "watch", str(root), *args], text=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line.rstrip("\n"))

    def next_line(self, pattern: str, timeout: float = 300) -> str:
        """The next line holding ``pattern``; every line read on the way is kept."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {pattern!r} within {timeout} s; saw {self.seen}"
                                     ) from None
            self.seen.append(line)
            if pattern in line:
                return line

    def built(self) -> tuple[int, int, int]:
        """Counts of the next build: files changed, new, removed."""
        found = BUILT.search(self.next_line("indexed:"))
        assert found is not None
        changed, new, removed = map(int, found.groups())
        return changed, new, removed

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            while not self.lines.empty():
                self.seen.append(self.lines.get())
            raise AssertionError(f"still running 120 s after signal {sig}; saw {self.seen}"
                                 ) from None


def _paths(index: Path, query: str) -> list[str]:
    out = run_cli("search", query, "--index", str(index), "--mode", "lexical",
                  "--format", "files", "-k", "5").stdout
    return [os.path.relpath(path, index.parent) for path in out.split()]


def _tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "maths.py").write_text(
        "def add_numbers(a, b):\n    return a + b\n", encoding="utf-8")
    (root / "pkg" / "text.py").write_text(
        "def shout_words(words):\n    return [w.upper() for w in words]\n", encoding="utf-8")
    (root / "generated").mkdir()
    (root / "generated" / "table.py").write_text(
        "def generated_lookup_table():\n    return {}\n", encoding="utf-8")
    return root


def test_watch_follows_saves_deletes_and_ignore_rules(tmp_path: Path) -> None:
    root = _tree(tmp_path / "repo")
    index = root / ".ssindex"
    watch = WatchProcess(root, "--debounce", "50")
    try:
        assert watch.built() == (0, 3, 0)  # the first build
        assert _paths(index, "generated_lookup_table") == ["generated/table.py"]

        # a plain edit
        with (root / "pkg" / "maths.py").open("a", encoding="utf-8") as f:
            f.write("\n\ndef multiply_numbers(a, b):\n    return a * b\n")
        assert watch.built() == (1, 0, 0)
        assert _paths(index, "multiply_numbers") == ["pkg/maths.py"]

        # an editor's atomic save: a temp file beside it, renamed over it
        temp = root / "pkg" / ".text.py.swp"
        temp.write_text("def whisper_words(words):\n    return [w.lower() for w in words]\n",
                        encoding="utf-8")
        os.replace(temp, root / "pkg" / "text.py")
        assert watch.built() == (1, 0, 0)
        assert _paths(index, "whisper_words") == ["pkg/text.py"]
        assert _paths(index, "shout") == []

        # truncate, then write a moment later (one build, or two if it fell between)
        with (root / "pkg" / "text.py").open("w", encoding="utf-8") as f:
            f.flush()
            time.sleep(0.02)
            f.write("def murmur_words(words):\n    return words\n")
        watch.built()
        if _paths(index, "murmur_words") != ["pkg/text.py"]:
            watch.built()
        assert _paths(index, "murmur_words") == ["pkg/text.py"]

        # a new directory, and a file that does not parse (it is chunked by lines)
        (root / "newdir").mkdir()
        (root / "newdir" / "broken.py").write_text("def broken_parse_fn(:\n    ((( oops\n",
                                                   encoding="utf-8")
        assert watch.built() == (0, 1, 0)
        assert _paths(index, "broken_parse_fn") == ["newdir/broken.py"]

        # a delete
        (root / "newdir" / "broken.py").unlink()
        assert watch.built() == (0, 0, 1)
        assert _paths(index, "broken_parse_fn") == []

        # .gitignore: the rules are read again, and the ignored file leaves the index
        (root / ".gitignore").write_text("generated/\n", encoding="utf-8")
        assert watch.built() == (0, 0, 1)
        assert _paths(index, "generated_lookup_table") == []
        # a change under an ignored directory starts no build: the next one holds only
        # the edit made after it
        (root / "generated" / "table.py").write_text("def ignored_change():\n    pass\n",
                                                     encoding="utf-8")
        time.sleep(0.5)
        (root / "pkg" / "maths.py").write_text("def subtract_numbers(a, b):\n"
                                                "    return a - b\n", encoding="utf-8")
        assert watch.built() == (1, 0, 0)
        assert _paths(index, "ignored_change") == []
        assert watch.proc.poll() is None
    finally:
        assert watch.stop() == 0
    assert "stopped" in watch.next_line("stopped")
    assert IndexDir(index).read_head().data["chunks"] > 0


def test_a_failed_build_is_one_line_and_the_next_change_retries(tmp_path: Path) -> None:
    root = _tree(tmp_path / "repo")
    index = root / ".ssindex"
    watch = WatchProcess(root, "--debounce", "50")
    try:
        watch.built()
        # another builder holds the index: the watcher's build fails, and it goes on
        fd = os.open(index / "lock", os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        (root / "pkg" / "maths.py").write_text("def divide_numbers(a, b):\n"
                                                "    return a / b\n", encoding="utf-8")
        failure = watch.next_line(FAILED)
        assert "IndexLocked" in failure and "retrying on the next change" in failure
        assert "Traceback" not in "\n".join(watch.seen)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        (root / "pkg" / "text.py").write_text("def yell_words(words):\n    return words\n",
                                              encoding="utf-8")
        assert watch.built() == (2, 0, 0)  # both changes, in one build
        assert _paths(index, "divide_numbers") == ["pkg/maths.py"]
        assert _paths(index, "yell_words") == ["pkg/text.py"]
    finally:
        assert watch.stop() == 0


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
                   cwd=root, check=True, capture_output=True, timeout=120)


def test_a_branch_switch_is_one_build_and_sigterm_mid_build_keeps_the_index(
        tmp_path: Path) -> None:
    root = copy_stdlib(tmp_path / "repo", "json")
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "main")
    _git(root, "checkout", "-qb", "other")
    for number in range(40):
        (root / f"module_{number}.py").write_text(
            f"def branch_function_{number}(value):\n    return value + {number}\n",
            encoding="utf-8")
    (root / "json" / "tool.py").unlink()
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "other")
    _git(root, "checkout", "-q", "main")
    index = root / ".ssindex"
    watch = WatchProcess(root, "--debounce", "300")
    try:
        watch.built()
        assert subprocess.run(["git", "status", "--porcelain"], cwd=root, check=True,
                              capture_output=True, text=True).stdout == ""  # index ignored
        _git(root, "checkout", "-q", "other")
        assert watch.built() == (0, 40, 1)  # one build for the whole checkout
        assert _paths(index, "branch_function_7")[0] == "module_7.py"
        _git(root, "checkout", "-q", "main")
        assert watch.built() == (0, 1, 40)
        assert not any(path.startswith("module_") for path in _paths(index, "branch_function_7"))
        committed = IndexDir(index).read_head().data["table_version"]

        # SIGTERM while a build runs: it is abandoned, the lock released, exit 0
        for number in range(300):
            (root / f"bulk_{number}.py").write_text(
                f"def bulk_function_{number}(value):\n    '''Bulk {number}.'''\n"
                f"    return [value] * {number}\n", encoding="utf-8")
        deadline = time.monotonic() + 60
        running = None
        while running is None and time.monotonic() < deadline:
            running = cli_json("status", "--index", str(index))["build"]
        assert running is not None and running["pid"] == watch.proc.pid
        assert watch.stop() == 0
    finally:
        if watch.proc.poll() is None:
            watch.stop(signal.SIGKILL)
    status = cli_json("status", "--index", str(index))
    assert status["build"] is None
    assert status["table_version"] >= committed
    assert cli_json("search", "JSONDecoder", "--index", str(index), "--mode", "lexical",
                    )["results"]
    rebuilt = cli_json("build", str(root), "--no-progress")  # the lock was released
    assert rebuilt["chunks_total"] > 300


async def _mcp_calls(root: Path, log: Path) -> list[dict[str, Any]]:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=CLI, args=["serve", "--watch", "--root", str(root),
                                                      "--debounce", "50"], env=dict(os.environ))
    seen: list[dict[str, Any]] = []

    async def call(session: ClientSession, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        result = (await session.call_tool(tool, args)).model_dump(by_alias=True)
        data = {"error": result["content"][0]["text"]} if result.get("isError") else \
            json.loads(result["content"][0]["text"])
        seen.append({"tool": tool, **data})
        return data

    async def until(session: ClientSession, query: str, path: str) -> dict[str, Any]:
        for _ in range(1200):
            found = await call(session, "search", {"query": query, "mode": "lexical", "k": 3})
            if any(hit["path"] == path for hit in found.get("results", [])):
                return found
            await anyio.sleep(0.05)
        raise AssertionError(f"{query!r} never found in {path}")

    with log.open("w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            await call(session, "status", {})  # answered while the first build runs
            await until(session, "add_numbers", "pkg/maths.py")
            (root / "pkg" / "fresh.py").write_text("def freshly_written_fn():\n    pass\n",
                                                    encoding="utf-8")
            await until(session, "freshly_written_fn", "pkg/fresh.py")
            # searches follow the commit; the watcher counts the build once it has finished
            for _ in range(600):
                if not (await call(session, "status", {}))["watch"]["building"]:
                    break
                await anyio.sleep(0.05)
    return seen


def test_serve_watch_builds_follows_edits_and_reports_freshness(tmp_path: Path) -> None:
    root = _tree(tmp_path / "repo")
    seen = anyio.run(_mcp_calls, root, tmp_path / "server.log")
    first = seen[0]
    assert first["tool"] == "status" and first["watch"]["watching"]
    assert first.get("searchable") is False or "chunks" in first  # built, or building
    searches = [call for call in seen if call["tool"] == "search"]
    assert all("results" in call or "first build" in call["error"] for call in searches)
    found = [call for call in searches if "results" in call]
    versions = [call["table_version"] for call in found]
    assert versions == sorted(versions) and versions[-1] > versions[0]
    assert all(set(call["watch"]) >= {"stale_files", "building"} for call in found)
    last = seen[-1]
    assert last["tool"] == "status" and last["watch"]["builds"] >= 2
    assert last["watch"]["last_error"] is None and last["files"] == 4


@pytest.mark.parametrize("client", ["claude", "codex", "cursor", "generic"])
def test_mcp_config_prints_a_snippet_each_client_reads(tmp_path: Path, client: str) -> None:
    printed = run_cli("mcp-config", "--client", client, "--root", str(tmp_path))
    if client == "codex":
        entry = tomllib.loads(printed.stdout)["mcp_servers"]["ssindex"]
    elif client == "generic":
        entry = json.loads(printed.stdout)
    else:
        entry = json.loads(printed.stdout)["mcpServers"]["ssindex"]
    assert Path(entry["command"]).is_absolute() and Path(entry["command"]).name == "ssindex"
    assert entry["args"] == ["serve", "--watch", "--root", str(tmp_path.resolve())]
    assert printed.stderr.strip()  # where it goes
    assert not list(tmp_path.iterdir())  # printed, nothing written


def test_mcp_config_rejects_an_unknown_client(tmp_path: Path) -> None:
    refused = run_cli("mcp-config", "--client", "emacs", check=False)
    assert refused.returncode == 2 and "unknown client 'emacs'" in refused.stderr
