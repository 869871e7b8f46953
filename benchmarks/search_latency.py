"""Search latency: warm in-process queries at scale, and a cold ``ssindex search`` process.

    python benchmarks/search_latency.py --index DIR [--rows 100000] [--json]

The index at DIR (any built index) is replicated until it holds ``--rows``
chunks (fresh ids and paths, same vectors and text), committed like a build
does, then queried through the real ``Searcher``: p50/p95 of warm hybrid,
semantic and lexical queries, and the wall time of cold CLI processes.

Baseline, in the same run: hybrid search as plainly done, with every stored
vector scored exactly (no sign-bit shortlist) and the query embedded with fp32
weights (``onnx-cpu``); the table ends with its p50 and our speed-up over it.

Filters (``--path 'copy1*/'``, about 44% of 100k rows): warm hybrid p50 with the
filter, the time it adds (the median of each query's filtered minus unfiltered time,
run back to back), and the first use of a new filter (its row mask). Over the first
200 CoSQA dev queries, the share whose filtered top 10 equals a reference computed
by hand (both legs score every row, then only the filtered rows are fused and
ranked): with the dense leg scanning every row as the reference does, with its
sign-bit shortlist as usual, and, for contrast, post-filtering an unfiltered top 100.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import report

from ssindex.codec import row_dots
from ssindex.index.layout import CHUNK_SCHEMA, IndexDir
from ssindex.index.postings import NAME_WEIGHT_IDENTIFIER, NAME_WEIGHT_NATURAL
from ssindex.index.search_files import SEARCH_FILES_VERSION, write_search_files
from ssindex.index.table import scan
from ssindex.query import dense
from ssindex.query.filters import Filters
from ssindex.query.fusion import Ranking, fuse, lexical_weight
from ssindex.query.searcher import CANDIDATES, LEXICAL_CANDIDATES, Searcher
from ssindex.text.lexical import names_identifier, query_terms

QUERIES = ["parse a json document", "read a file line by line", "open a network socket",
           "sort a list of dictionaries by key", "format a date as a string",
           "compute a checksum of bytes", "retry a failed http request", "JSONDecoder",
           "split a string on whitespace", "walk a directory tree recursively"]
COSQA_QUERIES = Path(__file__).resolve().parents[1].parent / "shared/data/cosqa-dev/queries.jsonl"
SCOPE = Filters.of(paths=["copy1*/"])


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
        result.update(_filtered(index, args.repeats))
    report(result, args.json)


def _filtered(index: Path, repeats: int) -> dict[str, object]:
    """The filter figures of the module docstring, on fresh searchers of ``index``."""
    searcher = Searcher(index).warm()
    started = time.perf_counter()
    allowed = searcher.row_filter.mask(SCOPE)
    assert allowed is not None
    figures: dict[str, object] = {
        "filter_rows": int(allowed.sum()),
        "filter_first_use_ms": round((time.perf_counter() - started) * 1000, 2)}
    times, added = [], []
    for _ in range(repeats):
        for query in QUERIES:
            plain = _once(searcher, query, None)
            times.append(_once(searcher, query, SCOPE))
            added.append(times[-1] - plain)
    figures["warm_hybrid_filtered_ms_p50"] = round(statistics.median(times), 2)
    figures["filter_added_ms_p50"] = round(statistics.median(added), 2)
    queries = [json.loads(line)["text"] for line in
               COSQA_QUERIES.read_text(encoding="utf-8").splitlines()[:200]]
    row_of = {key: row for row, key in enumerate(zip(
        searcher.rows.column("path").to_pylist(),
        searcher.rows.column("start_line").to_pylist(), strict=True))}

    def top(one: Searcher, query: str, filters: Filters | None, k: int = 10) -> list[int]:
        hits = one.search(query, k=k, abstain=False, filters=filters).results
        return [row_of[hit["path"], hit["start_line"]] for hit in hits]

    reference = [_exact(searcher, query, allowed) for query in queries]
    approximate = [top(searcher, query, SCOPE) for query in queries]
    shortlisted, dense.PREFILTER_ROWS = dense.PREFILTER_ROWS, len(searcher.rows) + 1
    try:  # the dense leg scans every row, as the reference does
        filtered = [top(searcher, query, SCOPE) for query in queries]
    finally:
        dense.PREFILTER_ROWS = shortlisted
    post = [[row for row in top(searcher, query, None, 100) if allowed[row]][:10]
            for query in queries]
    figures["filtered_top10_equal_exact_share"] = _share(filtered, reference)
    figures["shortlisted_filtered_top10_equal_exact_share"] = _share(approximate, reference)
    figures["post_filtered_top10_equal_exact_share"] = _share(post, reference)
    paths = searcher.rows.column("path")
    figures["filtered_results_outside_filter"] = sum(  # by hand: SCOPE selects copy1*/
        not paths[row].as_py().split("/", 1)[0].startswith("copy1")
        for rows in filtered + approximate for row in rows)
    return figures


def _exact(searcher: Searcher, query: str, allowed: np.ndarray) -> list[int]:
    """The filtered top 10 by hand: both legs score every row, then only the rows
    ``allowed`` are kept, fused and ranked (the reference the search must equal)."""
    vector = searcher.embed_query(query)
    scores = np.where(allowed, row_dots(searcher.dense.vectors(), vector), -np.inf)
    order = np.lexsort((np.arange(len(scores)), -scores))[:min(CANDIDATES, int(allowed.sum()))]
    near = Ranking(order.astype(np.int64), scores[order].astype(np.float64))
    weight = NAME_WEIGHT_IDENTIFIER if names_identifier(query) else NAME_WEIGHT_NATURAL
    terms = query_terms(query).split()
    bm25 = searcher.lexicon.scores(terms, weight) * allowed if terms else \
        np.zeros(len(scores), np.float32)
    hits = np.flatnonzero(bm25 > 0)
    hits = hits[np.lexsort((hits, -bm25[hits]))][:LEXICAL_CANDIDATES]
    lexical = Ranking(hits.astype(np.int64), bm25[hits].astype(np.float64))
    ranked, _ = searcher.ranker.rank(query, fuse(near, lexical, lexical_weight(query)), 10,
                                     allowed, SCOPE.asked())
    return ranked.rows.tolist()


def _once(searcher: Searcher, query: str, filters: Filters | None) -> float:
    started = time.perf_counter()
    searcher.search(query, k=10, filters=filters)
    return (time.perf_counter() - started) * 1000


def _share(got: list[list[int]], expected: list[list[int]]) -> float:
    return round(sum(a == b for a, b in zip(got, expected, strict=True)) / len(expected), 3)


if __name__ == "__main__":
    main()
