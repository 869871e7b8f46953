"""Progressive builds and ``--no-embed``: real builds of standard-library copies, the real
model, real processes killed mid-build, and readers running while a build commits."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from ssindex import build
from ssindex.config import BuildConfig, CommitConfig, EmbedConfig
from ssindex.index.layout import IndexDir
from ssindex.index.table import scan
from ssindex.pipeline.encoder import LazyEncoder
from ssindex.pipeline.publication import Publisher
from ssindex.query.searcher import Searcher

from .conftest import CLI, cli_json, copy_stdlib, run_cli

COLUMNS = ["id", "path", "start_line", "end_line", "symbol", "kind", "text", "dup_of",
           "embed_key", "vec_codes", "vec_scale", "lex_body", "lex_name", "row_digest"]
PARTIAL = "[commit]\nevery_chunks = 200\nevery_seconds = 1000\nmin_files = 0\n"
ONCE = "[commit]\nprogressive = false\n"


def _config(tmp: Path, text: str) -> str:
    path = tmp / f"config-{abs(hash(text))}.toml"
    path.write_text(text)
    return str(path)


def _size(index: Path) -> int:
    return sum(f.stat().st_size for f in index.rglob("*") if f.is_file())


def assert_same_index(built: Path, reference: Path) -> None:
    """Rows, vectors, search files and thresholds of two indexes are identical."""
    a, b = IndexDir(built), IndexDir(reference)
    rows = [scan(index.open_table(), COLUMNS).sort_by("id") for index in (a, b)]
    assert rows[0].equals(rows[1])
    heads = [index.read_head().data for index in (a, b)]
    assert heads[0]["abstention"] == heads[1]["abstention"]
    assert heads[0]["dense_coverage"] == heads[1]["dense_coverage"] == 1.0
    assert heads[0]["near_duplicates"] is heads[1]["near_duplicates"] is True
    for key in ("snapshot", "postings"):
        assert a.read_manifest(heads[0][key]).equals(b.read_manifest(heads[1][key]))


def test_partial_versions_are_the_lexical_rows_with_the_vectors_so_far(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partial snapshot streams the lexical one a record batch at a time: it must hold
    the lexical rows in order, each vector received so far as the finished version
    stores it (a duplicate's is its exemplar's) and nulls elsewhere. The lexical
    snapshot is read anew for each, so it must outlive any number of partial versions."""
    monkeypatch.setattr("ssindex.index.search_files.BLOCK_ROWS", 64)  # several batches
    published: list[tuple[pa.Table, pa.Table]] = []
    publish = Publisher.publish

    def kept(self: Publisher) -> None:
        publish(self)
        lexical = f"search-v{self.head['table_version']}.arrow"
        published.append((self.index.read_manifest(self.head["snapshot"]),
                          self.index.read_manifest(lexical)))

    monkeypatch.setattr(Publisher, "publish", kept)
    root = copy_stdlib(tmp_path, "json", "email")
    commit = CommitConfig(every_chunks=150, every_seconds=1000, min_files=0)
    assert build(root, config=BuildConfig(commit=commit))["partial_commits"] >= 3
    index = IndexDir(root / ".ssindex")
    finished = index.read_manifest(index.read_head().data["snapshot"])
    vectors = ["vec_codes", "vec_scale"]
    shown = [0]
    for partial, lexical in published:
        rest = [name for name in partial.column_names if name not in vectors]
        assert partial.select(rest).equals(lexical.select(rest))
        present = partial.column("vec_codes").is_valid()
        assert partial.filter(present).select(vectors).equals(
            finished.filter(present).select(vectors))
        shown.append(int(pc.sum(present).as_py() or 0))
    assert shown == sorted(shown) and shown[1] > 0


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A build of json and email that commits once, at the end: what the others must equal."""
    root = copy_stdlib(tmp_path_factory.mktemp("reference"), "json", "email")
    config = _config(root.parent, ONCE)
    assert cli_json("build", str(root), "--no-progress", "--config", config)["partial_commits"] == 0
    return root


def _tree(tmp: Path) -> Path:
    return copy_stdlib(tmp / "tree", "json", "email")


def test_no_embed_builds_a_lexical_index_that_a_plain_build_completes(
        tmp_path: Path, reference: Path) -> None:
    root = _tree(tmp_path)
    stats = cli_json("build", str(root), "--no-progress", "--no-embed")
    assert stats["chunks_embedded"] == 0 and stats["dense_coverage"] == 0.0
    assert stats["backends"]["embed_bulk"]["reason"] == "not loaded: --no-embed"
    index = root / ".ssindex"
    codes = scan(IndexDir(index).open_table(), ["vec_codes"]).column("vec_codes")
    assert codes.null_count == stats["chunks_total"] > 0

    hybrid = run_cli("search", "parse an email address header", "--index", str(index),
                     "--json")
    found = json.loads(hybrid.stdout)
    assert found["dense_coverage"] == 0.0 and found["results"] and not found["abstained"]
    assert "dense leg 0% embedded, `ssindex build` embeds the rest" in hybrid.stderr
    lexical = run_cli("search", "parse an email address header", "--index", str(index),
                      "--mode", "lexical", "--json")
    assert "dense leg" not in lexical.stderr  # it asked for no dense leg
    lexical_hits = json.loads(lexical.stdout)["results"]
    assert lexical_hits[0]["path"] in {hit["path"] for hit in found["results"]}
    semantic = run_cli("search", "parse an email address header", "--index", str(index),
                       "--mode", "semantic", check=False)
    assert semantic.returncode == 2 and "no vectors yet" in semantic.stderr
    status = cli_json("status", "--index", str(index))
    assert status["dense_coverage"] == 0.0 and status["build"] is None
    stale = run_cli("build", str(root), "--check", check=False)
    assert stale.returncode == 1 and "100% of chunks not embedded yet" in stale.stdout

    again = cli_json("build", str(root), "--no-progress", "--no-embed")  # nothing to do
    assert again["rows_written"] == 0 and again["dense_coverage"] == 0.0
    done = cli_json("build", str(root), "--no-progress", "--config",
                    _config(tmp_path, PARTIAL))
    assert done["dense_coverage"] == 1.0 and done["chunks_embedded"] > 0
    assert done["partial_commits"] >= 1  # the plain build completed it progressively
    assert done["search_files"] == "revectored"
    assert_same_index(index, reference / ".ssindex")
    assert _size(index) <= 1.1 * _size(reference / ".ssindex")


def _reader(index: Path, build: subprocess.Popen[str]) -> tuple[list[float], list[str]]:
    """Open and search the index until ``build`` exits: each version's coverage seen,
    and every error met."""
    coverages: list[float] = []
    errors: list[str] = []
    while build.poll() is None or not coverages:
        if not (index / "HEAD.json").is_file():
            if build.poll() is not None:
                break
            time.sleep(0.05)
            continue
        try:
            searcher = Searcher(index)
            response = searcher.search("parse an email address header", k=5)
            head = searcher.head.data
            embedded = len(searcher.rows) - searcher.rows.column("vec_codes").null_count
            if len(searcher.rows) != head["chunks"] or \
                    embedded / len(searcher.rows) != head["dense_coverage"]:
                errors.append(f"mixed version: {head['snapshot']}")
            if not response.results:
                errors.append(f"no results at coverage {response.dense_coverage}")
            coverages.append(response.dense_coverage)
        except Exception as exc:  # every failure is the finding
            errors.append(repr(exc))
    return coverages, errors


def test_a_progressive_build_is_searchable_before_it_embeds_and_readers_see_whole_versions(
        tmp_path: Path, reference: Path) -> None:
    root = _tree(tmp_path)
    index = root / ".ssindex"
    build = subprocess.Popen([CLI, "build", str(root), "--no-progress", "--json", "--config",
                              _config(tmp_path, PARTIAL)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    coverages, errors = _reader(index, build)
    out, err = build.communicate(timeout=600)
    assert build.returncode == 0, err
    assert errors == []
    assert coverages[0] == 0.0 and coverages[-1] == 1.0
    assert coverages == sorted(coverages)
    assert any(0.0 < c < 1.0 for c in coverages)  # a partial version was searched
    stats = json.loads(out)
    assert stats["first_commit_seconds"] < stats["wall_seconds"]
    assert stats["partial_commits"] >= 2
    assert stats["search_files"] == "revectored"  # the lexical version's postings, linked
    # the summary counts files against the index before the build, not the lexical version
    assert stats["files_new"] == stats["files_indexed"] > 0
    assert stats["files_changed"] == stats["files_removed"] == stats["files_unchanged"] == 0
    assert "searchable now: lexical version of" in err
    assert_same_index(index, reference / ".ssindex")
    assert _size(index) <= 1.1 * _size(reference / ".ssindex")


def test_a_file_changed_between_the_passes_gets_its_search_files_written(
        tmp_path: Path) -> None:
    """The finished version links the lexical version's postings only when its rows are
    the same: here one file changed after the lexical pass."""
    root = copy_stdlib(tmp_path / "tree", "json")
    cli_json("build", str(root), "--no-progress", "--no-embed")
    tool = root / "json" / "tool.py"
    tool.write_text(tool.read_text() + "\n\ndef zebra_crossing_marker():\n    return 1\n")
    done = cli_json("build", str(root), "--no-progress")
    assert done["search_files"] == "written" and done["dense_coverage"] == 1.0
    found = cli_json("search", "zebra_crossing_marker", "--index", str(root / ".ssindex"),
                     "--mode", "lexical")
    assert found["results"][0]["path"] == "json/tool.py"


def _wait_for(predicate: Any, build: subprocess.Popen[str], what: str) -> None:
    while not predicate():
        assert build.poll() is None, f"the build ended before {what}"
        time.sleep(0.05)


def test_a_build_killed_after_its_first_commit_stays_searchable_and_resumes(
        tmp_path: Path, reference: Path) -> None:
    root = _tree(tmp_path)
    index = root / ".ssindex"
    config = _config(tmp_path, PARTIAL)
    build = subprocess.Popen([CLI, "build", str(root), "--no-progress", "--config", config],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)

    def partial() -> bool:
        try:
            return 0.0 < IndexDir(index).read_head().data.get("dense_coverage", 0.0) < 1.0
        except Exception:  # no head yet
            return False

    _wait_for(partial, build, "a partial version")
    status = cli_json("status", "--index", str(index))
    assert status["build"]["pid"] == build.pid and status["build"]["chunks_left"] > 0
    os.killpg(build.pid, signal.SIGKILL)
    build.wait()
    searched = cli_json("search", "parse an email address header", "--index", str(index))
    assert 0.0 < searched["dense_coverage"] < 1.0 and searched["results"]
    assert cli_json("status", "--index", str(index))["build"] is None
    # its lexical pass marked exact duplicates alone: a --no-embed build does not carry
    # such a version's verdicts forward (it rebuilds), and keeps its vectors
    assert IndexDir(index).read_head().data["near_duplicates"] is False
    lexical = cli_json("build", str(root), "--no-progress", "--no-embed")
    assert lexical["rows_written"] == lexical["chunks_total"]
    assert 0.0 < lexical["dense_coverage"] < 1.0

    resumed = cli_json("build", str(root), "--no-progress", "--config", config)
    exemplars = resumed["chunks_total"] - resumed["chunks_deduplicated"]
    assert resumed["chunks_reused"] >= 200  # the checkpointed vectors were not embedded again
    assert resumed["chunks_embedded"] + resumed["chunks_reused"] == exemplars
    assert_same_index(index, reference / ".ssindex")
    shutil.rmtree(root)


def test_a_build_committed_once_knows_from_its_survey_that_it_is_large(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build committed once learns its size only after chunking every file; the survey
    (``pipeline.survey``) estimates what it will embed beforehand, so a large one
    compiles and embeds in wide calls as a progressive build's second pass does. Before
    the survey, such a build always embedded a batch at a time, in the eager model."""
    monkeypatch.setattr("ssindex.pipeline.encoder.COMPILE_MIN_CHUNKS", 600)
    monkeypatch.setattr("ssindex.pipeline.encoder.LARGE_CALL_CHUNKS", 300)
    calls: list[tuple[int, int]] = []
    encode_tokens = LazyEncoder.encode_tokens

    def counted(self: LazyEncoder, tokens: list[Any]) -> Any:
        calls.append((len(tokens), self.expected))
        return encode_tokens(self, tokens)

    monkeypatch.setattr(LazyEncoder, "encode_tokens", counted)
    config = BuildConfig(commit=CommitConfig(progressive=False, min_files=0),
                         embed=EmbedConfig(compile="never"))
    done = build(_tree(tmp_path), config=config)
    assert done["partial_commits"] == 0 and done["first_commit_seconds"] == done[
        "wall_seconds"]  # one pass, no lexical version
    expected = calls[0][1]
    chunks = done["chunks_total"]
    assert 0.8 * chunks <= expected <= 1.2 * chunks, (expected, chunks)
    assert max(size for size, _ in calls) > 256  # several batches of 256 a call


def test_a_large_build_embeds_in_wide_calls_and_resumes_to_the_same_vectors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build with ``COMPILE_MIN_CHUNKS`` to embed hands the encoder several batches at
    once (``LARGE_CALL_CHUNKS``), and a text's vector depends on its call in the last
    bits. So a build interrupted after a partial version must meet the same calls when it
    resumes, and finish as the index of a build never interrupted."""
    monkeypatch.setattr("ssindex.pipeline.encoder.COMPILE_MIN_CHUNKS", 1)
    monkeypatch.setattr("ssindex.pipeline.encoder.LARGE_CALL_CHUNKS", 300)
    config = BuildConfig(commit=CommitConfig(every_chunks=150, every_seconds=1000, min_files=0),
                         embed=EmbedConfig(compile="never"))
    calls: list[int] = []
    add, publish = Publisher.add, Publisher.publish

    def counted(self: Publisher, keys: list[str], vectors: Any, publish: bool = True) -> None:
        calls.append(len(keys))
        add(self, keys, vectors, publish)

    monkeypatch.setattr(Publisher, "add", counted)
    whole = _tree(tmp_path / "whole")
    done = build(whole, config=config)
    assert len(calls) >= 2 and min(calls[:-1]) >= 300  # whole batches of 256, two a call
    assert done["partial_commits"] >= 1

    def interrupted(self: Publisher) -> None:
        if self.commits:
            raise KeyboardInterrupt  # after the second call's vectors were checkpointed
        publish(self)

    monkeypatch.setattr(Publisher, "publish", interrupted)
    tree = _tree(tmp_path / "resumed")
    with pytest.raises(KeyboardInterrupt):
        build(tree, config=config)
    monkeypatch.setattr(Publisher, "publish", publish)
    resumed = build(tree, config=config)
    exemplars = resumed["chunks_total"] - resumed["chunks_deduplicated"]
    assert resumed["chunks_reused"] == sum(calls[:2])
    assert resumed["chunks_embedded"] + resumed["chunks_reused"] == exemplars
    assert_same_index(tree / ".ssindex", whole / ".ssindex")
