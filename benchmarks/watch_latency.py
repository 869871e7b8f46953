"""A live index: from a saved edit to an MCP search that finds it, under ``serve --watch``.

    python benchmarks/watch_latency.py --source STDLIB_COPY [--edits 20] [--switch 200]
                                       [--idle 60] [--json]

``--source`` is a tree with a built index (``ssindex build STDLIB_COPY``). It is copied,
index included, to a scratch directory that becomes a git repository; nothing in
``--source`` changes. Then, in one run:

1. ``ssindex serve --watch`` starts under the real MCP client, and catches up with the
   copy (untimed).
2. Edits: ``--edits`` times, a uniquely named function is appended to another file; the
   client searches (hybrid, the default) every 20 ms until that function is a result.
   Baseline, same run: the same kind of edit found the way it is without a watcher, a
   ``ssindex build`` and a ``ssindex search`` in fresh processes (3 edits).
3. A branch switch: ``git checkout`` of a branch that appends a function to ``--switch``
   files, until the last file's function is found.
4. Idle: the server's CPU time over ``--idle`` seconds without a change.
5. A second git worktree of the copy: ``ssindex build`` of it, its wall time and the
   share of its chunks it embedded (the rest come from the shared vector cache, which
   the first build of ``--source`` filled).

Targets (issue #23): edit to search p50 ≤ 1.0 s and p95 ≤ 2.0 s; branch switch ≤ 15 s;
idle ≤ 1% of a core; the worktree embeds ≤ 1% of its chunks in ≤ 30 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import report
from _machine import cpu_label

from ssindex.index.layout import IndexDir

POLL_S = 0.05
CLI = str(Path(sys.executable).with_name("ssindex"))


def _git(root: Path, *args: str) -> None:
    done = subprocess.run(["git", "-c", "user.email=bench@example.com", "-c", "user.name=bench",
                           *args], cwd=root, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip()}")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


_WORDS = ["harbor", "lantern", "meadow", "quiver", "saddle", "thimble", "velvet", "walnut",
          "anchor", "bramble", "cobalt", "dapple", "ember", "falcon", "garnet", "hazel",
          "indigo", "juniper", "kestrel", "lagoon", "marble", "nectar", "orchid", "pebble",
          "quartz", "russet", "sable", "tundra", "umber", "willow"]


def _name(seed: object) -> str:
    """A function name no file holds: three real words, as a person names a function. A
    made-up word would not do: one unknown word is no lexical grounding, so a search for
    it alone abstains (``index.abstention``)."""
    rng = random.Random(str(seed))
    return "_".join(rng.sample(_WORDS, 3)) + f"_{rng.randrange(100, 1000)}"


def _function(name: str) -> str:
    return f"\n\ndef {name}(value):\n    \"\"\"Added by the benchmark.\"\"\"\n" \
           f"    return value\n"


def _holds(results: list[dict[str, Any]], name: str) -> bool:
    """Whether a result holds the function ``name``: its text, or its symbol (a file's
    only definition also names the file's other chunks, ``stages.symbols``)."""
    return any(name in hit["text"] or hit["symbol"].endswith(name) for hit in results)


def _server_pid(root: Path) -> int:
    """The ``ssindex serve --watch`` process serving ``root``."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"serve" in argv and b"--watch" in argv and str(root).encode() in argv:
                return int(entry.name)
    raise RuntimeError("the server process was not found")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Session:
    def __init__(self, session: ClientSession) -> None:
        self.session = session

    async def search(self, query: str) -> dict[str, Any]:
        result = await self.session.call_tool("search", {"query": query, "k": 5})
        return dict(json.loads(result.content[0].text))  # type: ignore[union-attr]

    async def settled(self) -> None:
        """Wait until the watcher has built at least once and holds no change back."""
        calm = 0
        while calm < 3:
            result = await self.session.call_tool("status", {})
            watch = json.loads(result.content[0].text)["watch"]  # type: ignore[union-attr]
            calm = calm + 1 if watch["builds"] and not watch["stale_files"] else 0
            await anyio.sleep(0.2)

    async def until_found(self, name: str, timeout: float = 120) -> float:
        """Seconds until a search for ``name`` returns its function."""
        started = time.perf_counter()
        while time.perf_counter() - started < timeout:
            found = await self.search(name)
            if _holds(found.get("results", []), name):
                return time.perf_counter() - started
            await anyio.sleep(POLL_S)
        raise RuntimeError(f"{name} was not found within {timeout} s")


async def measure(root: Path, files: list[Path], edits: int, switch: int,
                  idle: float, log: Path) -> dict[str, Any]:
    params = StdioServerParameters(command=CLI, args=["serve", "--watch", "--root", str(root)],
                                   env=dict(os.environ))
    out: dict[str, Any] = {}
    with open(log, "w") as server_log:
        async with stdio_client(params, errlog=server_log) as (read, write), \
                ClientSession(read, write) as client:
            await client.initialize()
            session = Session(client)
            started = time.perf_counter()
            await session.settled()
            out["catch_up_s"] = round(time.perf_counter() - started, 2)
            await session.search("warm up")

            latencies = []
            for number, path in enumerate(files[:edits]):
                name = _name(("edit", number))
                with path.open("a", encoding="utf-8") as f:
                    f.write(_function(name))
                latencies.append(await session.until_found(name))
            out["edit_to_search_s"] = [round(s, 3) for s in latencies]

            switched = files[edits:edits + switch]
            _git(root, "commit", "-qam", "edits")
            _git(root, "checkout", "-q", "-b", "switch")
            for path in switched:
                with path.open("a", encoding="utf-8") as f:
                    f.write(_function(_name(("switch", path))))
            _git(root, "commit", "-qam", "switch")
            _git(root, "checkout", "-q", "main")
            await session.settled()  # the watcher has taken the way back to main
            started = time.perf_counter()
            _git(root, "checkout", "-q", "switch")
            out["checkout_s"] = round(time.perf_counter() - started, 3)
            await session.until_found(_name(("switch", switched[-1])), timeout=300)
            out["branch_switch_s"] = round(time.perf_counter() - started, 2)

            pid = _server_pid(root)
            await anyio.sleep(3)
            before, started = _cpu_seconds(pid), time.perf_counter()
            await anyio.sleep(idle)
            out["idle_cpu_percent"] = round(
                100 * (_cpu_seconds(pid) - before) / (time.perf_counter() - started), 3)
    return out


def baseline(root: Path, path: Path) -> float:
    """An edit found without a watcher: a fresh ``ssindex build``, then ``ssindex search``."""
    name = _name(("baseline", path))
    with path.open("a", encoding="utf-8") as f:
        f.write(_function(name))
    started = time.perf_counter()
    subprocess.run([CLI, "build", str(root), "--no-progress"], check=True,
                   capture_output=True, timeout=600)
    found = subprocess.run([CLI, "search", name, "--index", str(root / ".ssindex"),
                            "--json", "-k", "5"], check=True, capture_output=True, text=True,
                           timeout=600)
    assert _holds(json.loads(found.stdout)["results"], name)
    return time.perf_counter() - started


def _indexed_sources(root: Path) -> list[Path]:
    """The non-empty Python files the copy's index holds: an edit to a file the walk
    skips (``site-packages`` under a pyenv's standard library) is never found."""
    index = IndexDir(root / ".ssindex")
    listed = index.read_manifest(index.read_head().data["manifest"]).column("path")
    return sorted(root / path for path in listed.to_pylist()
                  if path.endswith(".py") and (root / path).stat().st_size > 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True)
    parser.add_argument("--edits", type=int, default=20)
    parser.add_argument("--switch", type=int, default=200)
    parser.add_argument("--idle", type=float, default=60.0)
    parser.add_argument("--server-log", type=Path, default=Path(os.devnull),
                        help="where the server's lines go (one per build)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not (args.source / ".ssindex" / "HEAD.json").is_file():
        parser.error(f"{args.source} has no built index: run `ssindex build {args.source}`")

    scratch = Path(tempfile.mkdtemp(prefix="ssindex-watch-"))
    root = scratch / "repo"
    try:
        shutil.copytree(args.source, root, symlinks=True)
        _git(root, "init", "-q", "-b", "main")
        # an index built before indexes ignored themselves must not be tracked either
        (root / ".git" / "info").mkdir(parents=True, exist_ok=True)
        (root / ".git" / "info" / "exclude").write_text(".ssindex/\n", encoding="utf-8")
        _git(root, "add", "-A")
        _git(root, "commit", "-qm", "copy")
        files = _indexed_sources(root)
        files = random.Random(0).sample(files, args.edits + args.switch + 3)
        subprocess.run([CLI, "build", str(root), "--no-progress"], check=True,
                       capture_output=True, timeout=1800)  # the copy's new stats, untimed
        without = [baseline(root, path) for path in files[-3:]]
        _git(root, "commit", "-qam", "baseline edits")
        measured = anyio.run(measure, root, files, args.edits, args.switch, args.idle,
                             args.server_log)
        _git(root, "checkout", "-q", "main")

        started = time.perf_counter()
        _git(root, "worktree", "add", "-q", str(scratch / "worktree"), "switch")
        worktree = json.loads(subprocess.run(
            [CLI, "build", str(scratch / "worktree"), "--no-progress", "--json"], check=True,
            capture_output=True, text=True, timeout=1800).stdout)
        worktree_s = time.perf_counter() - started
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    latencies = measured.pop("edit_to_search_s")
    p50 = statistics.median(latencies)
    result = {
        "cpu": cpu_label(),
        "chunks": worktree["chunks_total"],
        "edits": len(latencies),
        "edit_to_search_p50_s": round(p50, 3),
        "edit_to_search_p95_s": round(_percentile(latencies, 0.95), 3),
        "edit_to_search_max_s": round(max(latencies), 3),
        "baseline_build_and_search_s": round(statistics.median(without), 3),
        "speedup_vs_baseline": round(statistics.median(without) / p50, 1),
        **measured,
        "switch_files": args.switch,
        "worktree_build_s": round(worktree_s, 2),
        "worktree_chunks_embedded": worktree["chunks_embedded"],
        "worktree_embedded_share": round(worktree["chunks_embedded"]
                                         / worktree["chunks_total"], 4),
        "worktree_chunks_from_cache": worktree["chunks_from_cache"],
        "worktree_files_cut_from_cache": worktree["files_cut_from_cache"],
    }
    report(result, args.json)
    if not args.json:
        print(f"\nedit to search: p50 {result['edit_to_search_p50_s']} s, "
              f"{result['speedup_vs_baseline']}x faster than build + search in fresh processes")


if __name__ == "__main__":
    main()
