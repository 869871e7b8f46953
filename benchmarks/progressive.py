"""Progressive builds: time to the first searchable version, total wall, and quality by coverage.

Two parts, in one run:

- **Time.** Two clean builds of the same tree through the CLI, each in a fresh process:
  progressive (the default: a lexical version first, then partial versions) and
  progressive off (``[commit] progressive = false``, the baseline). It reports when
  the first version was searchable, both walls and their ratio, and both index sizes.
- **Quality.** cosqa-dev (BEIR layout) through the real search path: a ``--no-embed``
  build (0% coverage), then a progressive build completing it with a partial version
  every quarter of the chunks. A reader in this process scores hybrid MRR@10 on every
  version it sees as the build commits them, and lexical MRR@10 once.

    python benchmarks/progressive.py [--packages PKGS | --all] [--cosqa DIR] [--json]

Targets (issue #21, whole standard library): first commit <= 20 s; total wall
<= 1.05x progressive off; MRR@10 equals lexical at 0%, lies between lexical and full
at 50%, equals the full hybrid (0.535) at 100%.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import copy_stdlib, report, without_shared_cache
from _machine import cpu_label

from ssindex.query.searcher import Searcher
from ssindex.tools.evaluate import Dataset, _ranked_docs, metrics, write_tree

CLI = str(Path(sys.executable).with_name("ssindex"))
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "cosqa-dev"


def _build(root: Path, index: Path, config: str, *extra: str) -> dict[str, Any]:
    done = subprocess.run([CLI, "build", str(root), "--index", str(index), "--json",
                           "--no-progress", "--config", config, *extra],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def _size_mb(index: Path) -> float:
    return round(sum(f.stat().st_size for f in index.rglob("*") if f.is_file()) / 1e6, 2)


def timing(root: Path, work: Path) -> dict[str, Any]:
    """Progressive and one-commit builds of ``root``, each in a fresh process."""
    once = work / "once.toml"
    once.write_text("[commit]\nprogressive = false\n")
    # the defaults, but a slice below min_files is progressive as the whole tree would be
    every = work / "progressive.toml"
    every.write_text("[commit]\nmin_files = 0\n")
    progressive = _build(root, work / "progressive", str(every))
    baseline = _build(root, work / "once", str(once))
    return {
        "chunks": progressive["chunks_total"],
        "first_commit_seconds": progressive["first_commit_seconds"],
        "partial_commits": progressive["partial_commits"],
        "progressive_wall_seconds": progressive["wall_seconds"],
        "baseline_wall_seconds": baseline["wall_seconds"],
        "wall_ratio_vs_baseline": round(progressive["wall_seconds"] / baseline["wall_seconds"],
                                        3),
        "progressive_index_mb": _size_mb(work / "progressive"),
        "baseline_index_mb": _size_mb(work / "once"),
    }


def _mrr(index: Path, dataset: Dataset, paths: dict[str, str], mode: str,
         ) -> tuple[float, float]:
    """(coverage, MRR@10) of the version ``HEAD.json`` names now."""
    searcher = Searcher(index)
    rankings = {query_id: _ranked_docs(searcher.search(text, k=10, mode=mode).results, paths)
                for query_id, text in dataset.queries.items()}
    return searcher.dense.coverage, metrics(rankings, dataset.qrels)["mrr@10"]


def quality(directory: Path, work: Path) -> dict[str, Any]:
    """MRR@10 on cosqa-dev by dense coverage, as a progressive build commits."""
    dataset = Dataset.load(directory)
    tree, index = work / "cosqa", work / "cosqa-index"
    paths = write_tree(dataset, tree, ".py")
    no_embed = _build(tree, index, str(work / "default.toml"), "--no-embed")
    _, lexical = _mrr(index, dataset, paths, "lexical")
    curve = [_mrr(index, dataset, paths, "hybrid")]
    config = work / "quarters.toml"
    config.write_text(f"[commit]\nevery_seconds = 100000\n"
                      f"every_chunks = {max(no_embed['chunks_total'] // 4, 1)}\n")
    build = subprocess.Popen([CLI, "build", str(tree), "--index", str(index), "--no-progress",
                              "--config", str(config)], stdout=subprocess.DEVNULL)
    seen = {json.loads((index / "HEAD.json").read_text())["snapshot"]}
    while True:
        finished = build.poll() is not None
        snapshot = json.loads((index / "HEAD.json").read_text())["snapshot"]
        if snapshot not in seen:
            seen.add(snapshot)
            curve.append(_mrr(index, dataset, paths, "hybrid"))
        if finished:
            break
        time.sleep(0.5)
    if build.returncode:
        raise SystemExit(f"the progressive build failed ({build.returncode})")
    if curve[-1][0] < 1.0:
        curve.append(_mrr(index, dataset, paths, "hybrid"))
    return {"lexical_mrr@10": lexical,
            "hybrid_mrr@10_by_coverage": {f"{c:.2f}": m for c, m in curve}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", default="json,email,http,logging")
    parser.add_argument("--all", action="store_true", help="the whole standard library")
    parser.add_argument("--cosqa", default=str(SHARED), help="BEIR dir ('' to skip)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    without_shared_cache()
    result: dict[str, Any] = {"cpu": cpu_label(),
                              "tree": "stdlib" if args.all else args.packages}
    with tempfile.TemporaryDirectory(prefix="ssindex-progressive-") as tmp:
        work = Path(tmp)
        (work / "default.toml").write_text("")
        root = work / "tree"
        copy_stdlib(root, args.packages, args.all)
        result |= timing(root, work)
        if args.cosqa:
            result |= quality(Path(args.cosqa), work)
    report(result, args.json)


if __name__ == "__main__":
    main()
