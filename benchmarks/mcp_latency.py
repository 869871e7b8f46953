"""Warm query latency of ``ssindex serve`` through the real MCP client over stdio.

    python benchmarks/mcp_latency.py                     # index a copy of stdlib json, 50 calls
    python benchmarks/mcp_latency.py --index repo/.ssindex -n 200 --mode semantic

Starts the server once, makes one untimed call, then times ``-n`` ``search``
calls round trip (client send to parsed reply). ``search in server`` is the
server's own time for the query; the rest is protocol overhead, whose floor the
``status`` round trip (one small file read) shows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

QUERIES = [
    "decode a JSON document", "pretty print with indentation", "scanner for string literals",
    "encode floats and infinity", "JSONDecodeError line and column", "object_pairs_hook",
    "escape non-ASCII characters", "detect the encoding of bytes",
]
TARGET_P50_MS = 20.0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(index: Path, calls: int, mode: str, k: int) -> dict[str, list[float]]:
    """Milliseconds of ``calls`` warm searches: round trip, server side, and a ``status`` floor."""
    params = StdioServerParameters(command=_cli(), args=["serve", "--index", str(index)],
                                   env=dict(os.environ))
    times: dict[str, list[float]] = {"search round trip": [], "search in server": [],
                                     "status round trip": []}
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.call_tool("search", {"query": "warm up", "k": k, "mode": mode})
        for i in range(calls):
            started = time.perf_counter()
            result = await session.call_tool(
                "search", {"query": QUERIES[i % len(QUERIES)], "k": k, "mode": mode})
            times["search round trip"].append((time.perf_counter() - started) * 1000)
            payload = json.loads(result.content[0].text)  # type: ignore[union-attr]
            times["search in server"].append(float(payload["timings_ms"]["total"]))
            started = time.perf_counter()
            await session.call_tool("status", {})
            times["status round trip"].append((time.perf_counter() - started) * 1000)
    return times


def _cli() -> str:
    return str(Path(sys.executable).with_name("ssindex"))


def _build_default(workdir: Path) -> Path:
    root = workdir / "repo"
    shutil.copytree(Path(sysconfig.get_paths()["stdlib"]) / "json", root / "json",
                    ignore=shutil.ignore_patterns("__pycache__", "tests"))
    stats = subprocess.run([_cli(), "build", str(root), "--json", "--no-progress"],
                           check=True, capture_output=True, text=True).stdout
    return Path(json.loads(stats)["index"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, help="index dir (default: build one of stdlib json)")
    parser.add_argument("-n", "--calls", type=int, default=50)
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument("--mode", default="hybrid", choices=["hybrid", "lexical", "semantic"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mcp-latency-") as tmp:
        index = args.index or _build_default(Path(tmp))
        times = anyio.run(measure, index, args.calls, args.mode, args.k)
    print(f"{'ms':<18}{'p50':>8}{'p95':>8}{'mean':>8}{'max':>8}   ({args.calls} calls, "
          f"mode={args.mode}, k={args.k})")
    for label, values in times.items():
        print(f"{label:<18}{_percentile(values, 0.5):>8.2f}{_percentile(values, 0.95):>8.2f}"
              f"{statistics.fmean(values):>8.2f}{max(values):>8.2f}")
    p50 = _percentile(times["search round trip"], 0.5)
    verdict = "meets" if p50 <= TARGET_P50_MS else "misses"
    print(f"round-trip p50 {p50:.2f} ms {verdict} the {TARGET_P50_MS:.0f} ms target")


if __name__ == "__main__":
    main()
