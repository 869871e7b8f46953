"""Several indexes searched as one, against one index of everything they hold.

    python benchmarks/workspace.py [--workdir DIR] [--json]

Standard-library packages are split between two indexes (json and http; email and
logging) and also built as one index of all four. For each query: whether the merged top
1 is the one index's top 1, and how much of the one index's top 10 the merged top 10
holds. The baseline, in the same run: merging each index's own search by score, each
index's legs normalized by its own range (what comparable scores are there to avoid).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import copy_stdlib, report
from _machine import cpu_label

from ssindex import build
from ssindex.query.searcher import Searcher
from ssindex.query.workspace import Workspace

PARTS = {"a": "json,http", "b": "email,logging", "whole": "json,http,email,logging"}
QUERIES = ["parse an email address", "decode json from a string", "send an http request",
           "rotate log files by size", "quote a header value", "handle a redirect",
           "format a log record", "encode a python object", "read a cookie",
           "base64 encode a message body", "JSONDecoder", "HTTPConnection request",
           "getLogger"]


def _top(results: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(hit["path"], hit["start_line"]) for hit in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/ssindex-workspace"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    searchers = {}
    for name, packages in PARTS.items():
        root = args.workdir / name
        if not root.exists():
            root.mkdir(parents=True)
            copy_stdlib(root, packages, everything=False)
        build(root)  # incremental when the workdir is kept
        searchers[name] = Searcher(root / ".ssindex").warm()
    workspace = Workspace([searchers["a"], searchers["b"]])
    figures: dict[str, list[float]] = {"merged_top1": [], "merged_overlap": [],
                                       "naive_top1": [], "naive_overlap": []}
    for query in QUERIES:
        expected = _top(searchers["whole"].search(query, k=10, abstain=False).results)
        merged = _top(workspace.search(query, k=10, abstain=False).results)
        own = sorted((hit for name in ("a", "b") for hit in
                      searchers[name].search(query, k=10, abstain=False).results),
                     key=lambda hit: -hit["score"])
        naive = _top(own[:10])
        for kind, got in (("merged", merged), ("naive", naive)):
            figures[f"{kind}_top1"].append(float(got[:1] == expected[:1]))
            figures[f"{kind}_overlap"].append(len(set(got) & set(expected)) / 10)
    result: dict[str, object] = {"cpu": cpu_label(), "queries": len(QUERIES)}
    result.update({key: round(statistics.mean(values), 3) for key, values in figures.items()})
    result["overlap_merged_over_naive"] = round(
        statistics.mean(figures["merged_overlap"]) / statistics.mean(figures["naive_overlap"]),
        3)
    report(result, args.json)


if __name__ == "__main__":
    main()
