"""Evaluation harness and abstention, through the real pipeline and the real model."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from ssindex.codec import StoredVectors, quantize_matrix, stored_vectors
from ssindex.errors import ConfigError
from ssindex.index import abstention
from ssindex.index.abstention import (
    CALIBRATION_QUERIES,
    TermStats,
    calibrate,
    nonsense_queries,
    recalibrate,
)
from ssindex.query.searcher import Searcher
from ssindex.tools.evaluate import Dataset, evaluate, metrics

from .conftest import STDLIB, cli_json, run_cli


def test_metrics_on_known_rankings() -> None:
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 1}}
    rankings = {"q1": ["a", "x"], "q2": ["x", "b"], "q3": ["x"] * 10 + ["c"]}
    scores = metrics(rankings, qrels)
    assert scores["mrr@10"] == round((1 + 0.5 + 0) / 3, 4)
    assert scores["recall@1"] == round(1 / 3, 4)
    assert scores["recall@10"] == round(2 / 3, 4) and scores["recall@100"] == 1.0


def _beir(tmp_path: Path) -> Path:
    """A small BEIR set: json/email functions as documents, their docstrings as queries."""
    corpus, queries, qrels = [], [], ["query-id\tcorpus-id\tscore"]
    for name in ("json/decoder.py", "json/encoder.py", "email/utils.py"):
        tree = ast.parse((STDLIB / name).read_text())
        lines = (STDLIB / name).read_text().split("\n")
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                doc_id = f"{name}:{node.name}"
                corpus.append({"_id": doc_id, "text": "\n".join(
                    lines[node.lineno - 1 : node.end_lineno])})
                summary = (ast.get_docstring(node) or "").split("\n")[0]
                if len(summary.split()) >= 4:
                    queries.append({"_id": f"q-{doc_id}", "text": summary})
                    qrels.append(f"q-{doc_id}\t{doc_id}\t1")
    queries.append({"_id": "q-blank", "text": " "})  # judged, but nothing to search for
    qrels.append(f"q-blank\t{corpus[0]['_id']}\t1")
    out = tmp_path / "beir"
    out.mkdir()
    (out / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in corpus))
    (out / "queries.jsonl").write_text("\n".join(json.dumps(q) for q in queries))
    (out / "qrels.tsv").write_text("\n".join(qrels))
    return out


def test_eval_reports_every_mode(tmp_path: Path) -> None:
    report = cli_json("eval", str(_beir(tmp_path)), "--workdir", str(tmp_path / "work"))
    assert report["queries"] >= 5 and report["blank_queries"] == 1
    for mode in ("lexical", "semantic", "hybrid"):
        scores = report["modes"][mode]
        for key in ("mrr@10", "ndcg@10", "recall@1", "recall@10", "recall@100",
                    "latency_ms_p50"):
            assert key in scores
        assert scores["recall@100"] >= scores["recall@10"] >= scores["recall@1"]
    assert report["modes"]["hybrid"]["mrr@10"] >= 0.5  # docstrings find their functions


@pytest.mark.parametrize(("corpus", "queries", "qrels", "message"), [
    ('{"_id": "d1", "text": 5}', '{"_id": "q1", "text": "f"}', "q1\td1\t1",
     "corpus.jsonl line 1: not an object with string _id, text, title"),
    ('{"_id": "d1", "text": "def f(): pass"}', '{"_id": "q1", "text": null}', "q1\td1\t1",
     "queries.jsonl line 1: not an object"),
    ('{"_id": "d1", "text": "def f(): pass"}', "[1, 2]", "q1\td1\t1",
     "queries.jsonl line 1: not an object"),
    ('{"_id": "d1", "text": "def f(): pass"}', '{"_id": "q1", "text": "f"}', "q1\td1\tx",
     "not a BEIR-layout directory"),
])
def test_malformed_beir_sets_are_clear_errors(tmp_path: Path, corpus: str, queries: str,
                                              qrels: str, message: str) -> None:
    for name, text in (("corpus.jsonl", corpus), ("queries.jsonl", queries),
                       ("qrels.tsv", qrels)):
        (tmp_path / name).write_text(text + "\n")
    with pytest.raises(ConfigError, match=message):
        Dataset.load(tmp_path)


def test_eval_of_a_single_query_and_a_bad_suffix(tmp_path: Path) -> None:
    corpus = [{"_id": "d1", "title": None, "text": "def parse_config(path):\n    return path"},
              {"_id": "d2", "text": "def send_mail(to):\n    return to"}]
    (tmp_path / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in corpus))
    (tmp_path / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "parse a config"}))
    (tmp_path / "qrels.tsv").write_text("q1\td1\t1\n")
    with pytest.raises(ConfigError, match="--suffix"):
        evaluate(tmp_path, ["hybrid"], suffix="/../escape.py")
    scores = evaluate(tmp_path, ["hybrid"], workdir=tmp_path / "work")["modes"]["hybrid"]
    assert scores["mrr@10"] == 1.0
    assert scores["latency_ms_p50"] == scores["latency_ms_p95"] is not None


def test_nonsense_abstains_and_real_queries_answer(
        stdlib_index: tuple[Path, dict[str, Any]]) -> None:
    root, _ = stdlib_index
    searcher = Searcher(root / ".ssindex")
    nonsense = nonsense_queries(100, seed=1)  # not the calibration set (seed 0)
    abstained = sum(searcher.search(q, k=5).abstained for q in nonsense)
    assert abstained >= 95
    real = ["parse an email address", "rotate log files", "send an http request",
            "decode json", "format a date for an email header"]
    assert not any(searcher.search(q, k=5).abstained for q in real)
    response = cli_json("search", nonsense[0], "--index", str(root / ".ssindex"),
                        "--no-abstain")
    assert response["abstained"] is False and response["results"]
    silent = next(q for q in nonsense if searcher.search(q, k=5).abstained)
    response = cli_json("search", silent, "--index", str(root / ".ssindex"))
    assert response["abstained"] is True and response["results"] == []


def test_an_empty_query_is_an_error(stdlib_index: tuple[Path, dict[str, Any]]) -> None:
    root, _ = stdlib_index
    for mode in ("hybrid", "semantic", "lexical"):
        with pytest.raises(ConfigError, match="empty"):
            Searcher(root / ".ssindex").search(" \t", mode=mode, abstain=False)
    result = run_cli("search", "", "--index", str(root / ".ssindex"), "--no-abstain",
                     check=False)
    assert result.returncode == 2 and "the query is empty" in result.stderr
    assert not result.stdout


def test_incremental_recalibration_equals_a_full_one() -> None:
    """Thresholds updated from the written rows alone equal those calibrated over every
    row, and the update declines when the row the semantic threshold rests on is gone."""
    rng = np.random.default_rng(0)
    queries = rng.normal(size=(CALIBRATION_QUERIES, 16)).astype(np.float32)

    def embed(texts: list[str]) -> np.ndarray:
        assert len(texts) == len(queries)
        return queries

    stats = TermStats({"gate": 3, "parse": 40}.get, 43)
    matrix = rng.normal(size=(300, 16)).astype(np.float32)
    ids = [f"r{i}" for i in range(300)]
    before = calibrate(stats, matrix, ids, embed)
    assert before.nearest in ids
    for scale in (0.5, 3.0):  # new rows below, then above, the previous best cosine
        written = rng.normal(size=(5, 16)).astype(np.float32) * scale
        new_ids = [f"n{i}-{scale}" for i in range(5)]
        removed = {i for i in ids[:50] if i != before.nearest}
        kept = [i for i, row_id in enumerate(ids) if row_id not in removed]
        full = calibrate(stats, np.concatenate([matrix[kept], written]),
                         [ids[i] for i in kept] + new_ids, embed)
        updated = recalibrate(before, stats, written, new_ids, removed, embed)
        assert updated is not None and updated.nearest == full.nearest
        assert updated.lexical == full.lexical
        assert abs(updated.nearest_cosine - full.nearest_cosine) < 1e-5
    assert recalibrate(before, stats, written, new_ids, {before.nearest}, embed) is None


def test_calibration_reads_stored_codes_block_by_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scored ``BLOCK`` rows at a time, straight from the stored codes, the thresholds are
    those of every decoded row at once."""
    rng = np.random.default_rng(1)
    queries = rng.normal(size=(CALIBRATION_QUERIES, 16)).astype(np.float32)
    vectors = rng.normal(size=(300, 16)).astype(np.float32)
    codes, scales = quantize_matrix(vectors, "int8")
    rows = pa.table({"vec_codes": pa.array([c.tobytes() for c in codes], pa.binary()),
                     "vec_scale": pa.array(scales, pa.float32())})
    ids = [f"r{i}" for i in range(300)]
    stats = TermStats({"gate": 3}.get, 3)
    whole = calibrate(stats, stored_vectors(rows, "int8", 16), ids, lambda texts: queries)
    monkeypatch.setattr(abstention, "BLOCK", 7)
    blocked = calibrate(stats, StoredVectors(rows, "int8", 16), ids, lambda texts: queries)
    assert blocked.nearest == whole.nearest
    assert abs(blocked.nearest_cosine - whole.nearest_cosine) < 1e-6
