"""``ssindex eval``: retrieval quality through the real pipeline on a BEIR-layout set.

Each corpus document becomes a file in a tree, the tree is built with the
real pipeline (walk, chunk, dedupe, embed, quantize, write), and every query
runs through the real search path. A document's rank is the rank of its best
chunk. An identifier query set (each corpus function's own name, where that
name is unique) checks that exact names find their function.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from ssindex.config import SEARCH_MODES, BuildConfig
from ssindex.errors import ConfigError
from ssindex.pipeline.build import build
from ssindex.query.searcher import Searcher

_DEF_NAME = re.compile(r"^\s*(?:async\s+)?(?:def|function|func|fn)\s+([A-Za-z_]\w*)", re.M)
DEPTH = 100


@dataclass(frozen=True)
class Dataset:
    corpus: dict[str, str]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    blank_queries: int = 0  # judged queries with empty text: not searched, scored as misses

    @classmethod
    def load(cls, directory: Path) -> Dataset:
        directory = Path(directory)
        try:
            corpus = {d["_id"]: (d["title"] + "\n" + d["text"]).strip()
                      for d in _jsonl(directory / "corpus.jsonl", title="")}
            queries = {q["_id"]: q["text"] for q in _jsonl(directory / "queries.jsonl")}
            qrels: dict[str, dict[str, int]] = {}
            lines = (directory / "qrels.tsv").read_text(encoding="utf-8").splitlines()
            for line in lines[1:] if lines and lines[0].startswith("query") else lines:
                query, doc, score = line.split("\t")
                if int(score) > 0:
                    qrels.setdefault(query, {})[doc] = int(score)
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(f"not a BEIR-layout directory ({directory}): {exc}") from exc
        judged = {q: t for q, t in queries.items() if q in qrels}
        asked = {q: t for q, t in judged.items() if t.strip()}
        return cls(corpus, asked, qrels, len(judged) - len(asked))

    def identifier_queries(self, limit: int = 200) -> tuple[dict[str, str], dict[str, dict]]:
        """Each document's function name as a query, for names unique in the corpus."""
        names: dict[str, list[str]] = {}
        for doc, text in self.corpus.items():
            match = _DEF_NAME.search(text)
            if match:
                names.setdefault(match.group(1), []).append(doc)
        unique = sorted((name, docs[0]) for name, docs in names.items() if len(docs) == 1)
        step = max(1, len(unique) // limit)
        picked = unique[::step][:limit]
        return ({f"id:{n}": n for n, _ in picked}, {f"id:{n}": {d: 1} for n, d in picked})


def _jsonl(path: Path, **defaults: str) -> Iterator[dict[str, str]]:
    """A BEIR file's records: JSON objects with string ``_id`` and ``text`` (and any
    ``defaults`` keys, filled in where absent or null); else the line is an error."""
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            if isinstance(record, dict):
                record = {**defaults, **{k: v for k, v in record.items() if v is not None}}
                if all(isinstance(record.get(key), str) for key in ("_id", "text", *defaults)):
                    yield record
                    continue
            raise ConfigError(f"{path.name} line {number}: not an object with string "
                              f"{', '.join(('_id', 'text', *defaults))}")


def doc_path(doc_id: str, suffix: str) -> str:
    """A file name for a document id (ids may hold any character)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", doc_id)[:80]
    return f"docs/{safe}-{xxhash.xxh32_hexdigest(doc_id.encode())}{suffix}"


def write_tree(dataset: Dataset, root: Path, suffix: str) -> dict[str, str]:
    """Write each document as a file; returns path → document id."""
    paths = {}
    for doc_id, text in dataset.corpus.items():
        rel = doc_path(doc_id, suffix)
        file = root / rel
        file.parent.mkdir(parents=True, exist_ok=True)
        if not file.exists() or file.read_text(encoding="utf-8") != text + "\n":
            file.write_text(text + "\n", encoding="utf-8")
        paths[rel] = doc_id
    return paths


def _ranked_docs(results: list[dict[str, Any]], paths: dict[str, str]) -> list[str]:
    ranked: list[str] = []
    for hit in results:
        doc = paths.get(hit["path"])
        if doc is not None and doc not in ranked:
            ranked.append(doc)
    return ranked


def metrics(rankings: dict[str, list[str]], qrels: dict[str, dict[str, int]]) -> dict[str, float]:
    """MRR@10, nDCG@10 and recall@1/10/100 averaged over queries."""
    totals = dict.fromkeys(("mrr@10", "ndcg@10", "recall@1", "recall@10", "recall@100"), 0.0)
    for query, relevant in qrels.items():
        ranked = rankings.get(query, [])
        first = next((i for i, d in enumerate(ranked[:10]) if d in relevant), None)
        totals["mrr@10"] += 0.0 if first is None else 1.0 / (first + 1)
        dcg = sum(relevant.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:10]))
        ideal = sum(g / math.log2(i + 2) for i, g in enumerate(
            sorted(relevant.values(), reverse=True)[:10]))
        totals["ndcg@10"] += dcg / ideal if ideal else 0.0
        for k in (1, 10, 100):
            totals[f"recall@{k}"] += len(set(ranked[:k]) & relevant.keys()) / len(relevant)
    return {name: round(value / max(len(qrels), 1), 4) for name, value in totals.items()}


def _run_queries(searcher: Searcher, queries: dict[str, str], mode: str, paths: dict[str, str],
                 abstain: bool) -> tuple[dict[str, list[str]], list[float], int]:
    rankings, latencies, abstained = {}, [], 0
    searcher.search("warm up the query backend", k=1, mode=mode)
    for query_id, text in queries.items():
        started = time.perf_counter()
        response = searcher.search(text, k=DEPTH, mode=mode, abstain=abstain)
        latencies.append((time.perf_counter() - started) * 1000)
        abstained += response.abstained
        rankings[query_id] = _ranked_docs(response.results, paths)
    return rankings, latencies, abstained


def _latency(milliseconds: list[float]) -> tuple[float | None, float | None]:
    """p50 and p95 of the query latencies; None where no query was searched."""
    if len(milliseconds) < 2:  # quantiles need two points
        return (round(milliseconds[0], 2),) * 2 if milliseconds else (None, None)
    return (round(statistics.median(milliseconds), 2),
            round(statistics.quantiles(milliseconds, n=20)[-1], 2))


@contextmanager
def _workdir(workdir: Path | None) -> Iterator[Path]:
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
        yield workdir
        return
    with tempfile.TemporaryDirectory(prefix="ssindex-eval-") as tmp:
        yield Path(tmp)


def evaluate(directory: Path, modes: list[str], config: BuildConfig | None = None,
             workdir: Path | None = None, suffix: str = ".py",
             abstain: bool = True) -> dict[str, Any]:
    """Build the corpus with the real pipeline and score every mode."""
    for mode in modes:
        if mode not in SEARCH_MODES:
            raise ConfigError(f"unknown mode {mode!r} (modes: {', '.join(SEARCH_MODES)})")
    if not re.fullmatch(r"\.[A-Za-z0-9_+-]{1,16}", suffix):
        raise ConfigError(f"--suffix must be a file extension such as .py, got {suffix!r}")
    cfg = config or BuildConfig()
    dataset = Dataset.load(directory)
    with _workdir(workdir) as work:
        tree = work / "tree"
        paths = write_tree(dataset, tree, suffix)
        index = work / f"index-{cfg.quantization}"
        float_index = work / "index-none"
        if not index.exists() and float_index.exists():
            shutil.copytree(float_index, index)  # exact float32 vectors: nothing re-embedded
        stats = build(tree, index, cfg)
        searcher = Searcher(index).warm()
        id_queries, id_qrels = dataset.identifier_queries()
        report: dict[str, Any] = {
            "dataset": str(directory), "documents": len(dataset.corpus),
            "queries": len(dataset.queries), "blank_queries": dataset.blank_queries,
            "quantization": cfg.quantization,
            "vector_bytes_per_chunk": stats["vector_bytes_per_chunk"],
            "chunks": stats["chunks_total"], "build_seconds": stats["wall_seconds"],
            "modes": {},
        }
        for mode in modes:
            rankings, latencies, abstained = _run_queries(searcher, dataset.queries, mode,
                                                          paths, abstain)
            scores: dict[str, Any] = metrics(rankings, dataset.qrels)
            id_rankings, _, _ = _run_queries(searcher, id_queries, mode, paths, abstain)
            scores["identifier_top1"] = metrics(id_rankings, id_qrels)["recall@1"]
            scores["latency_ms_p50"], scores["latency_ms_p95"] = _latency(latencies)
            scores["abstained"] = abstained
            report["modes"][mode] = scores
    return report
