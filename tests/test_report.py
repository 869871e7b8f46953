from __future__ import annotations

import io
import re

from rich.console import Console

from ssindex.tools.listing import snippet
from ssindex.tools.report import PlainProgress, RichProgress, doctor_table, summary_table


def test_rich_progress_shows_every_stage_on_a_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with RichProgress(console) as progress:
        progress.advance("walk", 3)
        progress.advance("chunk", 10)
        progress.advance("embed", 4)
        progress.message("torch-cuda could not run; falling back")
    text = out.getvalue()
    for word in ("walk", "chunk", "embed", "4/10", "falling back"):
        assert word in text


def test_plain_progress_prints_lines_not_control_codes(capsys) -> None:  # type: ignore[no-untyped-def]
    with PlainProgress(every=0) as progress:
        progress.advance("walk", 1)
        progress.advance("walk", 1)
        progress.advance("embed", 1)
    err = capsys.readouterr().err
    assert "progress:" in err and "\x1b" not in err and "\r" not in err
    assert "walk 1 file |" in err and "walk 2 files |" in err


def test_summary_table_renders_build_stats() -> None:
    stats = {
        "files_indexed": 2, "files_seen": 3, "files_skipped": {"binary": 1},
        "files_changed": 1, "files_new": 0, "files_removed": 2, "files_read": 1,
        "chunks_total": 5, "chunks_embedded": 4, "chunks_deduplicated": 1, "chunks_reused": 0,
        "chunks_truncated": 0, "quantization": "int8", "vector_bytes_per_chunk": 388,
        "backends": {"embed_bulk": {"backend": "torch-cpu", "device": "cpu", "dtype": "fp32",
                                    "reason": "cpu"}},
        "model": "m", "stage_seconds": {"walk": 0.1}, "wall_seconds": 1.0, "index": "/i",
        "table_version": 3, "secrets_allowed": False, "secrets_redacted": 3,
        "secrets_redacted_now": {"github_token": 1},
    }
    out = io.StringIO()
    Console(file=out, width=160).print(summary_table(stats))
    assert "2 indexed of 3 seen" in out.getvalue() and "binary 1" in out.getvalue()
    assert "1 changed, 0 new, 2 removed, 1 read" in out.getvalue()
    assert "0 files skipped, 3 values redacted (this build: github_token 1)" in out.getvalue()
    assert "binary 1 " in out.getvalue() and "unreadable" not in out.getvalue()
    out = io.StringIO()
    Console(file=out, width=160).print(summary_table(
        stats | {"dirs_pruned": {"denied": 4, "unreadable": 2},
                 "ignore_skipped": {"invalid_rule": 1}}))
    assert ("binary 1; 2 unreadable directories; ignore rules not followed: invalid_rule 1"
            in out.getvalue())


def test_search_snippets_cut_long_lines_and_keep_short_ones() -> None:
    text = "def f():\n    return '" + "x" * 100_000 + "'\n" + "".join(f"# {i}\n" for i in range(9))
    lines = snippet(text).splitlines()
    assert len(lines) == 6 and lines[0] == "def f():"
    assert len(lines[1]) == 200 and lines[1].endswith("…")
    assert lines[2:] == ["# 0", "# 1", "# 2", "# 3"]


def test_doctor_table_names_choices_fallbacks_and_calibration() -> None:
    report = {
        "hardware": {"cpu_model": "EPYC", "cpu_count": 2, "cpu_flags": ["avx2"],
                     "cuda_devices": [{"name": "H200"}], "mps": False, "neural_engine": False},
        "runtimes": {"torch": {"version": "2.13.0", "cuda_build": None},
                     "onnxruntime": {"version": "1.32.0",
                                     "listed_providers": ["CUDAExecutionProvider"]}},
        "model": "all-MiniLM-L6-v2@a26f",
        "card": {"architecture": "BertModel", "model_type": "bert", "remote_code": "",
                 "pooling": "mean", "query_prompt": "query: ", "document_prompt": "",
                 "window": 256, "dim": 384, "modules": ["normalize"]},
        "backends": {"onnx-cpu": "runs"},
        "phases": {"embed_query": {"backend": "onnx-cpu", "device": "cpu", "dtype": "fp32",
                                   "reason": "single queries", "fallback_reason": "no GPU"}},
        "calibrated": {"embed_bulk": {"backend": "torch-cuda", "figure": "9000 chunks/s"}},
        "warnings": ["embed_query: onnx-cuda could not run"],
    }
    out = io.StringIO()
    Console(file=out, width=200).print(doctor_table(report))
    text = re.sub(r" +", " ", out.getvalue())  # the key column's width aside
    for line in ("CUDA │ H200", "torch │ version 2.13.0, cuda_build none",
                 "listed_providers CUDAExecutionProvider",
                 "embed_query │ onnx-cpu (fp32): single queries [fallback: no GPU]",
                 "calibrated │ embed_bulk: torch-cuda (9000 chunks/s)",
                 "warning │ embed_query: onnx-cuda could not run",
                 "architecture │ BertModel (bert)", "pooling │ mean → normalize",
                 "prompts │ query 'query: ', document ''", "window │ 256 tokens, 384 dimensions",
                 "onnx-cpu │ runs"):
        assert line in text, text
