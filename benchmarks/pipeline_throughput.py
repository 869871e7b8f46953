"""Capacity of the build's CPU side: chunks/s of everything but the model's forward pass.

Clean builds of the whole standard library through the real pipeline (walk, read, chunk,
sign, dedupe, tokenize, quantize, write, commit), with the embedding backend's forward
pass replaced by a cheap stand-in, at 1 and at 2 workers, each in a fresh process, in
one run. The baseline is the 1-worker build; ``scaling`` is the 2-worker rate over it.
It also projects the CPU side of a 16-core GPU node: the driver's own CPU time with
the pool on cannot be shared, the rest of a one-process build spreads over 15 cores.

    python benchmarks/pipeline_throughput.py [--workers 1,2] [--packages PKGS]
        [--repeats N] [--against CHECKOUT] [--json]

``--against`` builds the same tree with the code of another checkout (a ``git worktree``
of an earlier commit) in turn with this one's, build by build, so that both meet the
same noise on a shared machine; it prints that code's rates and the speed-up over them.

Targets: >= 4,000 chunks/s with one worker, and >= 1.7x that with two.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import NO_FORWARD, child_stdout, copy_stdlib, report, without_shared_cache
from _machine import cpu_label

GPU_CHUNKS_PER_S = 20_000
"""The embed stage's target on a data-center GPU (issue #20), for the projection."""
NODE_CORES = 16

_BUILD = NO_FORWARD + """
import json, resource, sys, time
from pathlib import Path
from ssindex import build
from ssindex.config import BuildConfig, CommitConfig

started = time.perf_counter()
once = CommitConfig(progressive=False)  # one pass over the tree: its capacity is the figure
stats = build(Path(sys.argv[1]), sys.argv[2], BuildConfig(workers=int(sys.argv[3]), commit=once),
              BACKENDS)
wall = time.perf_counter() - started
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"chunks": stats["chunks_total"], "wall_seconds": wall,
                  "cpu_seconds": usage.ru_utime + usage.ru_stime,
                  "stage_seconds": stats["stage_seconds"]}))
"""


HERE = Path(__file__).resolve().parents[1]
"""The checkout this benchmark belongs to: its code is the code measured."""


def run(tree: Path, workers: int, workdir: Path, code: Path = HERE) -> dict[str, object]:
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        out = child_stdout([sys.executable, "-c", _BUILD, str(tree), str(Path(tmp) / "index"),
                            str(workers)], env={**os.environ, "PYTHONPATH": str(code)})
        return json.loads(out.splitlines()[-1])  # type: ignore[no-any-return]


def _median(runs: list[dict[str, object]], key: str) -> float:
    return statistics.median(float(r[key]) for r in runs)  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2", help="worker counts, the first the baseline")
    parser.add_argument("--packages", default="", help="stdlib packages (default: all of it)")
    parser.add_argument("--repeats", type=int, default=1, help="builds per count (median)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--against", type=Path, help="another checkout, built in turn")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    without_shared_cache()
    counts = [int(n) for n in args.workers.split(",")]
    codes = [HERE, *([args.against.resolve()] if args.against else [])]
    result: dict[str, object] = {"cpu": cpu_label()}
    runs: dict[tuple[Path, int], list[dict[str, object]]] = {}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        tree = Path(tmp) / "stdlib"
        copy_stdlib(tree, args.packages, everything=not args.packages)
        for _ in range(args.repeats):
            for workers in counts:
                for code in codes:
                    runs.setdefault((code, workers), []).append(
                        run(tree, workers, args.workdir, code))
    chunks = int(runs[HERE, counts[0]][0]["chunks"])  # type: ignore[call-overload]
    result["chunks"] = chunks
    rates = {str(w): round(chunks / _median(runs[HERE, w], "wall_seconds"), 1) for w in counts}
    cpu = {str(w): _median(runs[HERE, w], "cpu_seconds") for w in counts}
    for workers in counts:
        result[f"wall_seconds_{workers}"] = round(_median(runs[HERE, workers], "wall_seconds"), 2)
        result[f"stage_seconds_{workers}"] = runs[HERE, workers][-1]["stage_seconds"]
    result["cpu_side_chunks_per_s"] = rates
    base, best = rates[str(counts[0])], rates[str(counts[-1])]
    result["scaling"] = round(best / base, 3)
    # the projection: the driver's own CPU time (dedupe, write, commit) with the pool on
    # is the part more workers cannot share; the rest of a one-process build's CPU
    # time spreads over the node's other cores
    driver, alone = cpu[str(counts[-1])], cpu[str(counts[0])]
    spread = max(alone - driver, 0.0) / (NODE_CORES - 1)
    node = int(result["chunks"]) / max(driver, spread)  # type: ignore[call-overload]
    result["driver_cpu_seconds"] = round(driver, 1)
    result[f"projected_{NODE_CORES}_core_chunks_per_s"] = round(node)
    result[f"projected_{NODE_CORES}_core_build_seconds"] = round(
        int(result["chunks"]) / min(node, GPU_CHUNKS_PER_S), 1)  # type: ignore[call-overload]
    if args.against:
        theirs = {str(w): round(chunks / _median(runs[codes[1], w], "wall_seconds"), 1)
                  for w in counts}
        result["against"] = str(codes[1])
        result["against_cpu_side_chunks_per_s"] = theirs
        result["against_driver_cpu_seconds"] = round(_median(runs[codes[1], counts[-1]],
                                                             "cpu_seconds"), 1)
        result["speedup_vs_against"] = {w: round(rates[w] / theirs[w], 3) for w in rates}
    report(result, args.json)


if __name__ == "__main__":
    main()
