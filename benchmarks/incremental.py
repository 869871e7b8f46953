"""Incremental rebuild after editing one file, against the full build, in one run.

    python benchmarks/incremental.py [--packages email,json,http,logging | --all] [--json]
    python benchmarks/incremental.py --all --workdir W [--json]
    python benchmarks/incremental.py --tree DIR --index INDEX [--json]

The first form copies the tree to a temporary directory, builds it and rebuilds after
an edit. With ``--workdir`` the copy, the index and the full build's time stay in ``W``:
the first run pays the full build (about 70 minutes for the whole standard library on
two CPU cores), later runs reuse it and time only the one-file rebuilds. The third form
times one-file rebuilds of an existing tree and index in place (for example the tree
and index ``ssindex eval --workdir W`` leaves in ``W``). Edited files are restored.

Both builds run in this process through the library API (``ssindex.build``),
so interpreter start-up and imports are not counted for either.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import copy_stdlib, report, without_shared_cache

from ssindex import build


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", default="email,json,http,logging")
    parser.add_argument("--all", action="store_true", help="the whole standard library")
    parser.add_argument("--tree", type=Path, help="an already indexed tree (with --index)")
    parser.add_argument("--index", type=Path)
    parser.add_argument("--workdir", type=Path, help="keep the tree, index and full build here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    without_shared_cache()
    if args.tree is not None:
        report(in_place(args.tree, args.index), args.json)
        return
    if args.workdir is not None:
        report(in_workdir(args.workdir, args.packages, args.all), args.json)
        return
    with tempfile.TemporaryDirectory(prefix="ssindex-incremental-") as tmp:
        root = Path(tmp) / "tree"
        copy_stdlib(root, args.packages, args.all)
        started = time.perf_counter()
        full = build(root)
        full_s = time.perf_counter() - started
        edited = next(p for p in sorted(root.rglob("*.py")) if p.stat().st_size > 2000)
        edited.write_text(edited.read_text() + "\n\ndef added_by_benchmark(x):\n"
                          "    \"\"\"Return x doubled.\"\"\"\n    return 2 * x\n")
        started = time.perf_counter()
        incremental = build(root)
        incremental_s = time.perf_counter() - started
        started = time.perf_counter()
        build(root)
        unchanged_s = time.perf_counter() - started
    result = {
        "files": full["files_indexed"], "chunks": full["chunks_total"],
        "edited_file": str(edited.relative_to(root)),
        "full_build_s": round(full_s, 2),
        "incremental_s": round(incremental_s, 2),
        "unchanged_rebuild_s": round(unchanged_s, 2),
        "speedup": round(full_s / incremental_s, 1),
        "incremental_chunks_embedded": incremental["chunks_embedded"],
        "incremental_files_changed": incremental["files_changed"],
        "incremental_backend": incremental["backends"]["embed_bulk"]["backend"],
        "incremental_stage_seconds": incremental["stage_seconds"],
    }
    report(result, args.json)


def in_workdir(workdir: Path, packages: str, everything: bool) -> dict[str, object]:
    """Full build once (its time kept in ``full_build.json``), then in-place rebuilds."""
    root, record = workdir / "tree", workdir / "full_build.json"
    if not record.exists():
        if not root.exists():
            copy_stdlib(root, packages, everything)
        started = time.perf_counter()
        full = build(root)
        record.write_text(json.dumps({
            "full_build_s": round(time.perf_counter() - started, 1),
            "files": full["files_indexed"], "chunks": full["chunks_total"],
            "chunks_embedded": full["chunks_embedded"],
            "measured_at": time.strftime("%Y-%m-%d %H:%M"),
        }))
    full_record = json.loads(record.read_text())
    result = in_place(root, root / ".ssindex")
    result["full_build_s"] = full_record["full_build_s"]
    result["full_build_measured_at"] = full_record["measured_at"]
    result["speedup"] = round(full_record["full_build_s"] / result["incremental_s_median"], 1)
    return result


def in_place(root: Path, index: Path, runs: int = 3) -> dict[str, object]:
    """Median of ``runs`` one-file rebuilds of an indexed tree, after one unchanged rebuild."""
    edited = next(p for p in sorted(root.rglob("*.py")) if p.stat().st_size > 500)
    original = edited.read_bytes()
    build(root, index)  # brings the index up to date (and warms caches and imports)
    seconds, stats = [], {}
    try:
        for run in range(runs):
            edited.write_bytes(original + f"\n\ndef added_{run}(x):\n    return x\n".encode())
            started = time.perf_counter()
            stats = build(root, index)
            seconds.append(time.perf_counter() - started)
    finally:
        edited.write_bytes(original)
        build(root, index)
    return {"files": stats["files_indexed"], "chunks": stats["chunks_total"],
            "edited_file": str(edited.relative_to(root)),
            "incremental_s_median": round(statistics.median(seconds), 2),
            "incremental_chunks_embedded": stats["chunks_embedded"],
            "incremental_stage_seconds": stats["stage_seconds"]}


if __name__ == "__main__":
    main()
