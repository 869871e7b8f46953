"""Peak memory of a build against the repository's size: flat means bounded by batches.

Two builds in one run, each in its own process, of standard-library slices about ten
times apart in chunks; peak RSS of each, and the ratio large/small (target <= 1.25). The
baseline, in the same run: the same two builds with heap trimming off (``util.heap``),
the code before it.

    python benchmarks/memory.py [--small PKGS] [--large PKGS|all] [--no-forward] [--json]

``--no-forward`` replaces the model's forward pass with a stand-in. That measures the
pipeline's own memory (dedupe state, search files, commit) in about a minute, where
embedding the whole standard library takes hours on a CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import NO_FORWARD, child_stdout, copy_stdlib, report, without_shared_cache
from _machine import cpu_label

SMALL = "json,email"
LARGE = ("asyncio,email,json,http,logging,multiprocessing,concurrent,xml,unittest,importlib,"
         "tkinter,idlelib")
_BUILD = """
import json, resource, sys
from pathlib import Path
from ssindex import build
from ssindex.util import heap
if sys.argv[3] == "off":
    heap.trim = lambda: None
BACKENDS = None
if len(sys.argv) > 4:
    exec(sys.argv[4])  # benchmarks/_corpus.py's NO_FORWARD
stats = build(Path(sys.argv[1]), sys.argv[2], backend_overrides=BACKENDS)
print(json.dumps({"chunks": stats["chunks_total"],
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))
"""


def peak(packages: str, trim: bool, no_forward: bool, workdir: Path) -> dict[str, int]:
    """Chunks and peak RSS (MB) of one clean build of ``packages`` (``all``: the whole
    standard library), in a fresh process."""
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tree = Path(tmp) / "tree"
        copy_stdlib(tree, packages, everything=packages == "all")
        stub = [NO_FORWARD] if no_forward else []
        out = child_stdout([sys.executable, "-c", _BUILD, str(tree), str(Path(tmp) / "index"),
                            "on" if trim else "off", *stub])
        return json.loads(out.splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", default=SMALL)
    parser.add_argument("--large", default=LARGE)
    parser.add_argument("--no-forward", action="store_true",
                        help="skip the model's forward pass: the pipeline's own memory, fast")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    without_shared_cache()
    result: dict[str, object] = {"cpu": cpu_label()}
    for trim, prefix in ((True, ""), (False, "baseline_")):
        small, large = (peak(args.small, trim, args.no_forward, args.workdir),
                        peak(args.large, trim, args.no_forward, args.workdir))
        result.update({f"{prefix}small_chunks": small["chunks"],
                       f"{prefix}large_chunks": large["chunks"],
                       f"{prefix}small_peak_rss_mb": small["peak_rss_mb"],
                       f"{prefix}large_peak_rss_mb": large["peak_rss_mb"],
                       f"{prefix}ratio": round(large["peak_rss_mb"] / small["peak_rss_mb"], 3)})
    report(result, args.json)


if __name__ == "__main__":
    main()
