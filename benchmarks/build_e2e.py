"""End to end: ``ssindex build`` against a naive pipeline written the obvious way.

    python benchmarks/build_e2e.py [--packages json,email,http,logging | --all] [--json]

Naive: every file (same walk), 40-line windows, sentence-transformers ``encode``
(batch 32, fp32), LanceDB ``add``. Both run as fresh processes on a copy of the
same files; wall time and peak RSS come from the child's resource usage, and
ssindex's per-stage seconds from ``build --json``. The whole standard library
takes over an hour per side on a 2-core CPU, so the default is a slice.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import copy_stdlib, report, without_shared_cache

WINDOW = 40


def naive(root: Path, out: Path) -> None:
    """The obvious pipeline: line windows, sentence-transformers, LanceDB add."""
    import lancedb
    from sentence_transformers import SentenceTransformer

    from ssindex.backends.model import bundled_model_path
    from ssindex.config import WalkConfig
    from ssindex.stages.walk import WalkStats, walk

    model = SentenceTransformer(str(bundled_model_path()), device="cpu")
    rows = []
    for source in walk(root, WalkConfig(), WalkStats()):
        lines = source.text.split("\n")
        for start in range(0, len(lines), WINDOW):
            rows.append({"path": source.path, "start_line": start + 1,
                         "text": "\n".join(lines[start : start + WINDOW])})
    vectors = model.encode([r["text"] for r in rows], batch_size=32, normalize_embeddings=True)
    for row, vector in zip(rows, vectors, strict=True):
        row["vector"] = vector.tolist()
    lancedb.connect(str(out)).create_table("chunks", rows, mode="overwrite")
    print(json.dumps({"chunks": len(rows)}))


def _child(command: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB, stdout) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) / 1024, result.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", default="json,email,http,logging")
    parser.add_argument("--all", action="store_true", help="the whole standard library")
    parser.add_argument("--naive-only", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    without_shared_cache()
    if args.naive_only:
        naive(args.naive_only, args.naive_only.parent / "naive-index")
        return
    with tempfile.TemporaryDirectory(prefix="ssindex-e2e-") as tmp:
        root = Path(tmp) / "tree"
        copy_stdlib(root, args.packages, args.all)
        ssindex_cli = str(Path(sys.executable).with_name("ssindex"))
        # peak RSS of RUSAGE_CHILDREN is a running maximum: measure the smaller run first
        naive_wall, naive_rss, naive_out = _child(
            [sys.executable, __file__, "--naive-only", str(root)])
        wall, rss, out = _child([ssindex_cli, "build", str(root), "--json", "--no-progress",
                                 "--index", str(Path(tmp) / "ssindex-index")])
    stats = json.loads(out)
    stages = stats["stage_seconds"]
    non_embed = sum(v for k, v in stages.items() if k != "embed")
    result = {
        "files": stats["files_indexed"],
        "naive_chunks": json.loads(naive_out)["chunks"],
        "ssindex_chunks": stats["chunks_total"],
        "ssindex_chunks_embedded": stats["chunks_embedded"],
        "naive_wall_s": round(naive_wall, 1),
        "ssindex_wall_s": round(wall, 1),
        "wall_ratio_naive_over_ssindex": round(naive_wall / wall, 3),
        "naive_peak_rss_mib": round(naive_rss),
        "ssindex_peak_rss_mib": round(rss),
        "stage_seconds": stages,
        "non_embed_fraction_of_wall": round(non_embed / stats["wall_seconds"], 3),
    }
    report(result, args.json)


if __name__ == "__main__":
    main()
