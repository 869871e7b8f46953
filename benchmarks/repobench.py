"""Repository-level search quality on Semble's benchmark (the dev split in shared/).

For each repository: build (or reuse) an index of its ``benchmark_root``, run every
annotated query in each mode, and score the top 10 by Semble's rule (README of the
data set): targets are ``relevant`` + ``secondary``; a chunk hits a target when the
paths match by suffix and, for a span, the lines overlap; each target is credited once,
at its first hit; NDCG@10 against the targets the index covers. Prints per-repository,
per-category and macro NDCG@10 beside the peers' published figures, and the search
latency per mode.

    python benchmarks/repobench.py [--data DIR] [--workdir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_label

from ssindex import build
from ssindex.query.filters import Filters
from ssindex.query.fusion import fuse, lexical_weight
from ssindex.query.searcher import Searcher

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "repobench-dev"
MODES = ("lexical", "semantic", "hybrid")
BASELINE = "hybrid_unranked"
"""Hybrid without the ranking stage: the same legs fused, cut at 10 (the baseline)."""
CATEGORIES = ("architecture", "semantic", "symbol")
PEERS = ("semble", "coderankembed_hybrid", "coderankembed", "bm25")


def _same_path(chunk: str, target: str) -> bool:
    return chunk == target or chunk.endswith("/" + target) or target.endswith("/" + chunk)


def _hits(result: dict[str, Any], target: Any) -> bool:
    if isinstance(target, str):
        return _same_path(result["path"], target)
    return _same_path(result["path"], target["path"]) and not (
        result["end_line"] < target["start_line"] or result["start_line"] > target["end_line"])


def ndcg10(results: list[dict[str, Any]], targets: list[Any], covered: int) -> float:
    """Semble's NDCG@10: each target credited once, at the rank of its first hit."""
    if covered == 0:
        return 0.0
    credited: set[int] = set()
    dcg = 0.0
    for rank, result in enumerate(results[:10], 1):
        new = {i for i, target in enumerate(targets) if i not in credited and _hits(result,
                                                                                     target)}
        if new:
            credited |= new
            dcg += 1 / math.log2(rank + 1)
    ideal = sum(1 / math.log2(rank + 1) for rank in range(1, min(10, covered) + 1))
    return dcg / ideal


def _covered(targets: list[Any], paths: set[str]) -> int:
    """Targets at least one indexed file can hit (Semble's ``count_indexed_targets``)."""
    return sum(1 for t in targets
               if any(_same_path(p, t if isinstance(t, str) else t["path"]) for p in paths))


def evaluate_repo(searcher: Searcher, queries: list[dict[str, Any]]) -> dict[str, Any]:
    paths = set(searcher.rows.column("path").to_pylist())
    scores: dict[str, list[tuple[str, float]]] = {mode: [] for mode in (*MODES, BASELINE)}
    latency: dict[str, list[float]] = {mode: [] for mode in MODES}
    ranking: list[float] = []
    for item in queries:
        targets = [*item.get("relevant", []), *item.get("secondary", [])]
        covered = _covered(targets, paths)
        for mode in MODES:
            started = time.perf_counter()
            response = searcher.search(item["query"], k=10, mode=mode, abstain=False)
            latency[mode].append((time.perf_counter() - started) * 1000)
            if "ranking" in response.timings_ms:
                ranking.append(response.timings_ms["ranking"])
            scores[mode].append((item["category"], ndcg10(response.results, targets, covered)))
        legs = searcher.legs(item["query"], 10, "hybrid", Filters(), abstain=False)
        fused = fuse(legs.dense, legs.lexical, lexical_weight(item["query"]))
        unranked = [{name: searcher.rows.column(name)[row].as_py()
                     for name in ("path", "start_line", "end_line")}
                    for row in fused.rows[:10].tolist()]
        scores[BASELINE].append((item["category"], ndcg10(unranked, targets, covered)))
    out: dict[str, Any] = {"ranking_ms_p50": round(statistics.median(ranking), 3)}
    for mode in (*MODES, BASELINE):
        by_category = {c: [s for cat, s in scores[mode] if cat == c] for c in CATEGORIES}
        out[mode] = {"ndcg10": statistics.mean(s for _, s in scores[mode]),
                     "by_category": {c: statistics.mean(v) for c, v in by_category.items() if v}}
        if mode in latency:
            out[mode]["latency_ms_p50"] = round(statistics.median(latency[mode]), 2)
    return out


def _macro(per_repo: dict[str, dict[str, Any]], key: str) -> dict[str, float]:
    """Macro means over repositories: overall and per category (as Semble averages)."""
    values = [r[key] for r in per_repo.values() if key in r]
    out = {"ndcg10": statistics.mean(v["ndcg10"] for v in values)}
    for category in CATEGORIES:
        found = [v["by_category"][category] for v in values
                 if category in v.get("by_category", {})]
        if found:
            out[category] = statistics.mean(found)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/ssindex-repobench"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    peers = json.loads((args.data / "peer-results.json").read_text())["repos"]
    per_repo: dict[str, dict[str, Any]] = {}
    for repo in json.loads((args.data / "repos.json").read_text()):
        name = repo["name"]
        index = args.workdir / name
        # incremental: a kept workdir is only brought up to this release's search files
        build(args.data / "repos" / name / repo.get("benchmark_root", ""), index)
        queries = json.loads((args.data / "annotations" / f"{name}.json").read_text())
        per_repo[name] = evaluate_repo(Searcher(index).warm(), queries)
        per_repo[name].update({peer: peers[name][peer] for peer in PEERS if peer in peers[name]})
    columns = [*MODES, BASELINE, *PEERS]
    summary = {column: _macro(per_repo, column) for column in columns}
    report = {"cpu": cpu_label(), "repos": per_repo, "macro": summary}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"repobench-dev NDCG@10, ssindex modes beside published peers; CPU: {report['cpu']}")
    print(f"{'repo':<14}" + "".join(f"{c:>22}" for c in columns))
    for name, row in per_repo.items():
        print(f"{name:<14}" + "".join(f"{row[c]['ndcg10']:>22.3f}" if c in row else f"{'':>22}"
                                      for c in columns))
    for key in ("ndcg10", *CATEGORIES):
        print(f"{'macro ' + key[:8]:<14}" + "".join(
            f"{summary[c][key]:>22.3f}" if key in summary[c] else f"{'':>22}" for c in columns))
    hybrid, semble = summary["hybrid"]["ndcg10"], summary["semble"]["ndcg10"]
    stage = statistics.median(r["ranking_ms_p50"] for r in per_repo.values())
    print(f"hybrid / {BASELINE} (same run): {hybrid / summary[BASELINE]['ndcg10']:.3f}; "
          f"hybrid / semble (published): {hybrid / semble:.3f}")
    print("latency p50 (ms): " + ", ".join(
        f"{m} {statistics.median(r[m]['latency_ms_p50'] for r in per_repo.values()):.1f}"
        for m in MODES) + f", ranking stage {stage:.2f}")


if __name__ == "__main__":
    main()
