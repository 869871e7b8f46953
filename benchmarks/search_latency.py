"""Search latency: warm in-process queries at scale, and a cold ``ssindex search`` process.

    python benchmarks/search_latency.py --index DIR [--rows 100000] [--json]

The index at DIR (any built index) is replicated until it holds ``--rows``
chunks (fresh ids and paths, same vectors and text), committed like a build
does, then queried through the real ``Searcher``: p50/p95 of warm hybrid,
semantic and lexical queries, and the wall time of cold CLI processes.

Baseline, in the same run: hybrid search as plainly done, with every stored
vector scored exactly (no sign-bit shortlist) and the query embedded with fp32
weights (``onnx-cpu``); the table ends with its p50 and our speed-up over it.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import report

from ssindex.index.layout import CHUNK_SCHEMA, IndexDir
from ssindex.index.search_files import SEARCH_FILES_VERSION, write_search_files
from ssindex.index.table import scan
from ssindex.query import dense
from ssindex.query.searcher import Searcher

QUERIES = ["parse a json document", "read a file line by line", "open a network socket",
           "sort a list of dictionaries by key", "format a date as a string",
           "compute a checksum of bytes", "retry a failed http request", "JSONDecoder",
           "split a string on whitespace", "walk a directory tree recursively"]


def replicate(source: Path, target: Path, rows: int) -> int:
    """Copy ``source`` to ``target`` and grow its table to ``rows`` chunks."""
    shutil.copytree(source, target)
    index = IndexDir(target)
    head = index.read_head()
    table = index.open_table(head.table_version)
    base = scan(table, CHUNK_SCHEMA.names)
    copies = [base]
    for copy in range(1, -(-rows // base.num_rows)):
        prefix = pa.scalar(f"copy{copy}/")
        copies.append(base.set_column(0, "id", pc.binary_join_element_wise(
            base.column("id"), pa.scalar(f"-{copy}"), pa.scalar(""))).set_column(
            1, "path", pc.binary_join_element_wise(prefix, base.column("path"),
                                                   pa.scalar(""))))
    grown = pa.concat_tables(copies).slice(0, rows)
    db = index.connect()
    fresh = db.create_table("chunks", grown, schema=CHUNK_SCHEMA, mode="overwrite")
    files, _, _ = write_search_files(index, fresh.version)
    data = dict(head.data, table_version=fresh.version, chunks=grown.num_rows,
                search_files=SEARCH_FILES_VERSION, **files)
    index.write_head(data)
    return grown.num_rows


def _timed(searcher: Searcher, mode: str, repeats: int,
           stage: list[float] | None = None) -> list[float]:
    """Milliseconds of each warm search, every query ``repeats`` times; ``stage``
    collects the ranking stage's share of each hybrid search."""
    times = []
    for _ in range(repeats):
        for query in QUERIES:
            started = time.perf_counter()
            response = searcher.search(query, k=10, mode=mode)
            times.append((time.perf_counter() - started) * 1000)
            if stage is not None and "ranking" in response.timings_ms:  # not if abstained
                stage.append(response.timings_ms["ranking"])
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ssindex-latency-") as tmp:
        index = Path(tmp) / "index"
        rows = replicate(args.index, index, args.rows)
        searcher = Searcher(index).warm()
        searcher.search("warm up", k=10)
        result: dict[str, object] = {"rows": rows}
        stage: list[float] = []
        for mode in ("hybrid", "semantic", "lexical"):
            times = _timed(searcher, mode, args.repeats, stage if mode == "hybrid" else None)
            result[f"warm_{mode}_ms_p50"] = round(statistics.median(times), 2)
            result[f"warm_{mode}_ms_p95"] = round(statistics.quantiles(times, n=20)[-1], 2)
        result["warm_ranking_stage_ms_p50"] = round(statistics.median(stage), 3)
        plain = Searcher(index, backend="onnx-cpu").warm()
        exact_below, dense.PREFILTER_ROWS = dense.PREFILTER_ROWS, rows + 1
        try:
            baseline = statistics.median(_timed(plain, "hybrid", args.repeats))
        finally:
            dense.PREFILTER_ROWS = exact_below
        result["baseline_hybrid_ms_p50"] = round(baseline, 2)
        hybrid = statistics.median(_timed(searcher, "hybrid", args.repeats))
        result["hybrid_ms_p50_after_baseline"] = round(hybrid, 2)
        result["hybrid_speedup_vs_baseline"] = round(baseline / hybrid, 2)
        cli = str(Path(sys.executable).with_name("ssindex"))
        colds = []
        for query in QUERIES[:3]:
            started = time.perf_counter()
            subprocess.run([cli, "search", query, "--index", str(index), "--json"],
                           capture_output=True, check=True)
            colds.append(time.perf_counter() - started)
        result["cold_process_s_p50"] = round(statistics.median(colds), 2)
    report(result, args.json)


if __name__ == "__main__":
    main()
