"""The whole pipeline through the installed console script, on real stdlib code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from .conftest import cli_json, run_cli

BUILD_KEYS = {"files_seen", "files_indexed", "files_skipped", "chunks_total", "chunks_embedded",
              "chunks_deduplicated", "stage_seconds", "wall_seconds", "backends", "model",
              "quantization"}
RESULT_KEYS = {"path", "start_line", "end_line", "language", "symbol", "kind", "score", "text"}


def _search(root: Path, query: str, *args: str) -> dict[str, Any]:
    return cli_json("search", query, "--index", str(root / ".ssindex"), *args)


def test_build_json_contract(stdlib_index: tuple[Path, dict[str, Any]]) -> None:
    _, stats = stdlib_index
    assert stats.keys() >= BUILD_KEYS
    assert set(stats["stage_seconds"]) == {"walk", "chunk", "dedupe", "embed", "quantize",
                                           "write"}
    assert stats["files_indexed"] > 30 and stats["chunks_total"] > 500
    assert stats["chunks_embedded"] + stats["chunks_deduplicated"] == stats["chunks_total"]
    assert stats["quantization"] == "int8"
    assert stats["backends"]["embed_bulk"]["backend"].startswith("torch-cpu")


def test_natural_language_queries_find_the_right_files(
        stdlib_index: tuple[Path, dict[str, Any]]) -> None:
    root, _ = stdlib_index
    hits = _search(root, "parse an email address into name and address", "-k", "3")
    assert "email/utils.py" in [h["path"] for h in hits["results"]]
    hits = _search(root, "decode json from a string", "-k", "3")
    assert any(h["path"].startswith("json/") for h in hits["results"])


def test_result_text_is_exactly_the_indexed_lines(
        stdlib_index: tuple[Path, dict[str, Any]]) -> None:
    root, _ = stdlib_index
    for mode in ("hybrid", "lexical", "semantic"):
        response = _search(root, "rotate log files when they grow too large", "--mode", mode)
        assert response["mode"] == mode and response["results"]
        for hit in response["results"]:
            assert hit.keys() >= RESULT_KEYS
            lines = (root / hit["path"]).read_text().split("\n")
            assert hit["text"] == "\n".join(lines[hit["start_line"] - 1 : hit["end_line"]])


def test_status_reports_the_index(stdlib_index: tuple[Path, dict[str, Any]]) -> None:
    root, stats = stdlib_index
    status = cli_json("status", "--index", str(root / ".ssindex"))
    assert status["chunks"] == stats["chunks_total"]
    assert status["files"] == stats["files_indexed"]
    assert status["quantization"] == "int8" and status["model"] == stats["model"]
    assert {"index_version", "built_at"} <= status.keys()


def test_identical_copies_are_embedded_once_and_both_found(tmp_path: Path) -> None:
    source = Path(json.__file__).with_name("decoder.py")
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        shutil.copy(source, tmp_path / name / "decoder.py")
    stats = cli_json("build", str(tmp_path), "--no-progress")
    assert stats["chunks_deduplicated"] == stats["chunks_total"] // 2
    assert stats["chunks_embedded"] == stats["chunks_total"] // 2
    hits = _search(tmp_path, "JSONDecoder raw_decode", "-k", "4", "--mode", "lexical")
    assert {h["path"] for h in hits["results"]} == {"a/decoder.py", "b/decoder.py"}
    import lancedb

    table = lancedb.connect(str(tmp_path / ".ssindex" / "db")).open_table("chunks")
    rows = table.search().select(["path", "dup_of"]).limit(None).to_arrow().to_pylist()
    assert all(r["dup_of"] for r in rows if r["path"] == "b/decoder.py")
    assert not any(r["dup_of"] for r in rows if r["path"] == "a/decoder.py")


def test_user_errors_are_one_line_without_traceback(tmp_path: Path) -> None:
    cases = [
        ("build", str(tmp_path / "missing")),
        ("search", "x", "--index", str(tmp_path / "nothing")),
        ("build", str(tmp_path), "--quantize", "int3"),
        ("build", str(tmp_path), "--config", str(tmp_path / "no.toml")),
        ("search", "x", "--index", str(tmp_path), "--mode", "fuzzy"),
    ]
    (tmp_path / "bad.toml").write_text("[chunk]\nmax_char = 3\n")
    cases.append(("build", str(tmp_path), "--config", str(tmp_path / "bad.toml")))
    for args in cases:
        result = run_cli(*args, check=False)
        assert result.returncode != 0, args
        assert "Traceback" not in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
