"""Search filters, test-code marks, output formats and context, on a real multi-language
index: each filter against an exact scan of the rows it lets through, through the
installed CLI and the library."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pathspec
import pytest

from ssindex.codec import row_dots
from ssindex.query import dense
from ssindex.query.filters import Filters
from ssindex.query.fusion import Ranking, fuse, lexical_weight
from ssindex.query.searcher import CANDIDATES, LEXICAL_CANDIDATES, Searcher
from ssindex.text.lexical import names_identifier, query_terms
from ssindex.text.roles import is_test

from .conftest import CLI, STDLIB, run_cli

SOURCES = {
    "pkg/server/server.go": "package server\n\n// Listen opens a TCP listener on addr.\n"
                            "func Listen(addr string) error {\n\treturn nil\n}\n",
    "pkg/server/server_test.go": "package server\n\nimport \"testing\"\n\n"
                                 "func TestListen(t *testing.T) {\n\tListen(\":0\")\n}\n",
    "web/src/router.ts": "export function matchRoute(path: string): string {\n"
                         "  return path.split('/')[1];\n}\n",
    "web/src/router.spec.ts": "import { matchRoute } from './router';\n"
                              "it('matches the first segment of a route', () => {\n"
                              "  expect(matchRoute('/a/b')).toBe('a');\n});\n",
    "web/src/__tests__/app.test.ts": "test('app starts', () => { expect(1).toBe(1); });\n",
    "src/main/java/org/demo/Parser.java": "package org.demo;\n\npublic class Parser {\n"
                                          "  public int parseNumber(String s) {\n"
                                          "    return Integer.parseInt(s);\n  }\n}\n",
    "src/test/java/org/demo/ParserTest.java": "package org.demo;\n\npublic class ParserTest {\n"
                                              "  void parsesNumbers() {\n"
                                              "    new Parser().parseNumber(\"4\");\n  }\n}\n",
    "lib/thing.rb": "class Thing\n  def greet(name)\n    \"hello #{name}\"\n  end\nend\n",
    "spec/thing_spec.rb": "describe Thing do\n  it 'greets' do\n"
                          "    expect(Thing.new.greet('a')).to eq('hello a')\n  end\nend\n",
    "docs/guide.md": "# Guide\n\nDecode a JSON document with `json.loads`.\n",
}
TEST_FILES = {"pkg/server/server_test.go", "web/src/router.spec.ts",
              "web/src/__tests__/app.test.ts", "src/test/java/org/demo/ParserTest.java",
              "spec/thing_spec.rb"}
QUERIES = ["decode a json document", "encode python objects as json", "open a tcp listener",
           "match a route path", "parse a number from a string", "greet someone by name",
           "raw_decode", "JSONDecodeError", "scanstring", "test that dumps sort keys",
           "indentation of nested lists", "circular reference detection"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """json from the standard library with its own tests, and small files in five more
    languages, each beside a test by its language's convention; built through the CLI."""
    root = tmp_path_factory.mktemp("filters")
    shutil.copytree(STDLIB / "json", root / "src/json",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(STDLIB / "test/test_json", root / "tests/test_json",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name, text in SOURCES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    run_cli("build", str(root), "--no-progress", "--json")
    return root


@pytest.fixture(scope="module")
def searcher(tree: Path) -> Searcher:
    return Searcher(tree / ".ssindex")


def _rows(searcher: Searcher) -> list[dict[str, Any]]:
    return searcher.rows.select(["path", "language", "kind", "symbol", "is_test"]).to_pylist()


def _search(tree: Path, query: str, *options: str) -> list[dict[str, Any]]:
    out = run_cli("search", query, "--index", str(tree / ".ssindex"), "--format", "ndjson",
                  *options).stdout
    return [json.loads(line) for line in out.splitlines()]


def _exact_semantic(searcher: Searcher, query: str, keep: list[bool], k: int) -> list[tuple]:
    """The ``k`` nearest rows among those ``keep`` selects, by scoring every one."""
    scores = row_dots(searcher.dense.vectors(), searcher.embed_query(query))
    kept = [row for row in range(len(keep)) if keep[row]]
    best = sorted(kept, key=lambda row: (-scores[row], row))[:k]
    rows = searcher.rows
    return [(rows.column("path")[r].as_py(), rows.column("start_line")[r].as_py()) for r in best]


def test_test_code_is_marked_by_each_languages_conventions(searcher: Searcher) -> None:
    marks = {row["path"]: row["is_test"] for row in _rows(searcher)}
    assert {path for path, mark in marks.items() if mark} == TEST_FILES | {
        path for path in marks if path.startswith("tests/test_json/")}
    assert not marks["src/json/decoder.py"] and not marks["docs/guide.md"]
    for path in ("a/conftest.py", "Lib/idlelib/idle_test/test_x.py", "x/FooTests.cs",
                 "app/src/androidTest/java/A.kt", "x/UserIT.java", "e2e/login.ts"):
        assert is_test(path), path
    for path in ("src/contest.py", "src/latest.py", "lib/attestation.rb", "src/Tester.java"):
        assert not is_test(path), path


@pytest.mark.parametrize(("options", "keeps"), [
    (["--path", "src/"], lambda r: r["path"].startswith(("src/", "web/src/"))),
    (["--path", "*.go", "--path", "*.rb"], lambda r: r["path"].endswith((".go", ".rb"))),
    (["--path", "src/", "--path", "!src/json/"],  # "src/" is any src, "src/json/" the top one
     lambda r: r["path"].startswith(("src/", "web/src/")) and
     not r["path"].startswith("src/json/")),
    (["--path", "/src/**/*.py"], lambda r: r["path"].startswith("src/json/")),
    (["--exclude", "tests/", "--exclude", "*.md"],
     lambda r: not r["path"].startswith("tests/") and not r["path"].endswith(".md")),
    (["--lang", "go,ts"], lambda r: r["language"] in ("go", "typescript")),
    (["--kind", "class"], lambda r: r["kind"] == "class"),
    (["--kind", "method", "--lang", "python"],
     lambda r: r["kind"] == "method" and r["language"] == "python"),
    (["--symbol", "raw_decode"], lambda r: r["symbol"].split(".")[-1] == "raw_decode"),
    (["--symbol", "JSON*"], lambda r: r["symbol"].split(".")[-1].startswith("JSON")
     or r["symbol"].startswith("JSON")),
    (["--tests", "only"], lambda r: r["is_test"]),
    (["--tests", "exclude", "--lang", "python"],
     lambda r: not r["is_test"] and r["language"] == "python"),
])
def test_each_filter_returns_the_exact_top_of_the_rows_it_lets_through(
        tree: Path, searcher: Searcher, options: list[str], keeps: Any) -> None:
    keep = [bool(keeps(row)) for row in _rows(searcher)]
    assert 0 < sum(keep) < len(keep)
    for query in ("decode a json document", "open a tcp listener", "raw_decode Listen"):
        got = _search(tree, query, "--mode", "semantic", "-k", "8", "--no-abstain", *options)
        assert [(h["path"], h["start_line"]) for h in got] == \
            _exact_semantic(searcher, query, keep, 8), (options, query)
        hybrid = _search(tree, query, "-k", "10", "--no-abstain", *options)
        assert hybrid and len(hybrid) == min(10, sum(keep))
        allowed = {(r["path"], r["start_line"]) for r, kept in zip(
            searcher.rows.select(["path", "start_line"]).to_pylist(), keep, strict=True) if kept}
        assert all((h["path"], h["start_line"]) in allowed for h in hybrid)


def test_filtered_top_k_equals_the_exact_filtered_top_k_on_random_queries(
        searcher: Searcher) -> None:
    """200 random queries, each with a random filter: both legs and the hybrid ranking
    equal a scan that scores every row and then keeps the filtered ones."""
    rows = _rows(searcher)
    words = sorted({word for text in searcher.rows.column("text").to_pylist()[:400]
                    for word in text.split() if word.isidentifier() and len(word) > 3})
    pick = random.Random(22)
    choices = [Filters.of(paths=["src/"]), Filters.of(excludes=["tests/"]),
               Filters.of(languages=["python"], kinds=["function", "method"]),
               Filters.of(tests="exclude"), Filters.of(tests="only"),
               Filters.of(paths=["*.py", "!**/tool.py"], kinds=["class"])]
    vectors = searcher.dense.vectors()
    for _ in range(200):
        query = " ".join(pick.sample(words, pick.randint(1, 4)))
        filters = pick.choice(choices)
        allowed = searcher.row_filter.mask(filters)
        assert allowed is not None and allowed.tolist() == [
            _allows(filters, row) for row in rows]
        vector = searcher.embed_query(query)
        scores = np.where(allowed, row_dots(vectors, vector), -np.inf)
        order = np.lexsort((np.arange(len(scores)), -scores))[:int(allowed.sum())][:CANDIDATES]
        dense_exact = Ranking(order.astype(np.int64), scores[order].astype(np.float64))
        terms = query_terms(query).split()
        weight = 2.0 if names_identifier(query) else 0.25
        bm25 = searcher.lexicon.scores(terms, weight) * allowed
        hits = np.flatnonzero(bm25 > 0)
        hits = hits[np.lexsort((hits, -bm25[hits]))][:LEXICAL_CANDIDATES]
        lexical_exact = Ranking(hits.astype(np.int64), bm25[hits].astype(np.float64))
        assert [h.row_id for h in searcher.semantic(query, CANDIDATES, filters)] == \
            dense_exact.rows.tolist()
        assert [h.row_id for h in searcher.lexical(query, LEXICAL_CANDIDATES, filters)] == \
            lexical_exact.rows.tolist()
        expected, _ = searcher.ranker.rank(
            query, fuse(dense_exact, lexical_exact, lexical_weight(query)), 10, allowed,
            filters.asked())
        got = searcher.search(query, k=10, abstain=False, filters=filters)
        assert [h["path"] for h in got.results] == [
            rows[row]["path"] for row in expected.rows.tolist()], (query, filters)
        assert all(allowed[row] for row in expected.rows.tolist())


def _allows(filters: Filters, row: dict[str, Any]) -> bool:
    """``filters`` decided row by row in Python: the reference for the masks."""
    if filters.paths and not pathspec.GitIgnoreSpec.from_lines(filters.paths).match_file(
            row["path"]):
        return False
    if filters.excludes and pathspec.GitIgnoreSpec.from_lines(filters.excludes).match_file(
            row["path"]):
        return False
    if filters.languages and row["language"] not in filters.languages:
        return False
    if filters.kinds and row["kind"] not in filters.kinds:
        return False
    return filters.tests == "include" or row["is_test"] == (filters.tests == "only")


def test_a_selective_filter_makes_the_shortlisted_scan_exact(
        tree: Path, searcher: Searcher, monkeypatch: pytest.MonkeyPatch) -> None:
    keep = [not row["path"].endswith(".py") or row["path"] == "src/json/decoder.py"
            for row in _rows(searcher)]
    filters = Filters.of(excludes=["*.py", "!src/json/decoder.py"])
    expected = {q: _exact_semantic(searcher, q, keep, 5) for q in QUERIES}
    monkeypatch.setattr(dense, "PREFILTER_ROWS", 10)
    monkeypatch.setattr(dense, "SHORTLIST", sum(keep))
    large = Searcher(tree / ".ssindex")
    assert len(large.rows) > 3 * sum(keep)
    for query in QUERIES:
        got = [(large.rows.column("path")[h.row_id].as_py(),
                large.rows.column("start_line")[h.row_id].as_py())
               for h in large.semantic(query, 5, filters)]
        assert got == expected[query], query
    monkeypatch.setattr(dense, "SHORTLIST", 20)  # fewer than the filter lets through
    for query in QUERIES:
        shortlisted = large.semantic(query, 5, filters)
        assert len(shortlisted) == 5 and all(keep[h.row_id] for h in shortlisted)


def test_a_test_prior_is_lifted_when_a_filter_selects_tests(searcher: Searcher) -> None:
    for filters in (Filters.of(tests="only"), Filters.of(paths=["tests/"])):
        response = searcher.search("dumps with sorted keys", k=5, abstain=False,
                                   explain=True, filters=filters)
        assert response.results
        assert all("prior:test" not in hit["explain"]["factors"] for hit in response.results)
    plain = searcher.search("dumps with sorted keys", k=30, abstain=False, explain=True)
    assert any("prior:test" in hit["explain"]["factors"] for hit in plain.results)


def test_formats_parse_back(tree: Path) -> None:
    index = ["--index", str(tree / ".ssindex"), "-k", "6", "--no-abstain"]
    data = json.loads(run_cli("search", "decode a json document", *index, "--format",
                              "json").stdout)
    assert data["root"] == str(tree) and len(data["results"]) == 6
    ndjson = _search(tree, "decode a json document", "-k", "6", "--no-abstain")
    assert [{k: v for k, v in hit.items() if k != "rank"} for hit in ndjson] == data["results"]
    assert [hit["rank"] for hit in ndjson] == list(range(1, 7))
    vimgrep = run_cli("search", "decode a json document", *index, "--format", "vimgrep",
                      cwd=tree).stdout.splitlines()
    assert len(vimgrep) == 6
    for line, hit in zip(vimgrep, data["results"], strict=True):
        path, number, column, text = line.split(":", 3)
        assert path == hit["path"]
        assert hit["start_line"] <= int(number) <= hit["end_line"]
        on_disk = (tree / path).read_text(encoding="utf-8").split("\n")[int(number) - 1]
        assert on_disk == text and on_disk.strip()
        assert int(column) == len(on_disk) - len(on_disk.lstrip()) + 1
    files = run_cli("search", "decode a json document", *index, "--format", "files",
                    cwd=tree.parent).stdout.splitlines()
    assert files == list(dict.fromkeys(f"{tree.name}/{h['path']}" for h in data["results"]))


def test_a_path_no_line_can_hold_is_quoted_in_the_line_formats(tmp_path: Path) -> None:
    """A name with a newline would split its vimgrep and files lines in two: such a
    path, and one that starts with a quote, is written as a JSON string."""
    names = ["odd\nname.py", '"quoted".py', "plain.py"]
    for name in names:
        (tmp_path / name).write_text("def frobnicate_widget():\n    return 1\n")
    run_cli("build", str(tmp_path), "--no-embed", "--no-progress")
    index = ["--index", str(tmp_path / ".ssindex"), "--mode", "lexical", "--no-abstain"]
    files = run_cli("search", "frobnicate_widget", *index, "--format", "files",
                    cwd=tmp_path).stdout.splitlines()
    assert sorted(json.loads(f) if f.startswith('"') else f for f in files) == sorted(names)
    vimgrep = run_cli("search", "frobnicate_widget", *index, "--format", "vimgrep",
                      cwd=tmp_path).stdout.splitlines()
    assert len(vimgrep) == 3
    for line in vimgrep:
        path, end = json.JSONDecoder().raw_decode(line) if line.startswith('"') else (
            line.split(":", 1)[0], line.index(":"))
        assert path in names and line[end:] == ":1:1:def frobnicate_widget():"


def test_context_lines_are_the_files_lines_around_each_result(tree: Path) -> None:
    data = json.loads(run_cli("search", "decode a json document", "--index",
                              str(tree / ".ssindex"), "-k", "8", "--no-abstain", "--json",
                              "--context", "3").stdout)
    for hit in data["results"]:
        lines = (tree / hit["path"]).read_text(encoding="utf-8").split("\n")
        start, end = hit["start_line"], hit["end_line"]
        assert hit["context"]["before"] == lines[max(start - 4, 0):start - 1]
        assert hit["context"]["after"] == lines[end:end + 3][:len(hit["context"]["after"])]
        assert len(hit["context"]["after"]) == min(3, len(lines) - end) or \
            lines[end:] == [""]
    text = run_cli("search", "raw_decode", "--index", str(tree / ".ssindex"), "-k", "1",
                   "-C", "2").stdout
    assert "│" in text and "def raw_decode" in text


@pytest.mark.parametrize(("options", "message"), [
    (["--lang", "cobol"], "unknown language 'cobol' (known: bash, c, "),
    (["--kind", "widget"], "unknown kind 'widget' (known: class, enum, function, "),
    (["--tests", "some"], "--tests must be one of include, only, exclude"),
    (["--symbol", "a*b"], "--symbol 'a*b': a name"),
    (["--symbol", ""], "--symbol '': a name"),
    (["--lang", ""], "--lang '' names nothing: give a value, or leave --lang out"),
    (["--kind", " , "], "--kind ' , ' names nothing"),
    (["--path", "", "--path", ","], "--path '' ',' names nothing"),
    (["--exclude", ""], "--exclude '' names nothing"),
    (["--format", "xml"], "--format must be one of text, json, ndjson, vimgrep, files"),
    (["--json", "--format", "files"], "--json and --format files ask for two formats"),
    (["--path", "!"], "bad path glob: Invalid git pattern"),
    (["--exclude", "[z-a]"], "bad path glob: bad character range"),
])
def test_a_bad_filter_or_format_is_one_line(tree: Path, options: list[str],
                                            message: str) -> None:
    result = run_cli("search", "x", "--index", str(tree / ".ssindex"), *options, check=False)
    assert result.returncode == 2 and not result.stdout
    assert len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr


def test_a_filter_that_selects_nothing_answers_empty_not_abstained(tree: Path) -> None:
    data = json.loads(run_cli("search", "decode", "--index", str(tree / ".ssindex"),
                              "--path", "nowhere/", "--json").stdout)
    assert data["results"] == [] and data["abstained"] is False
    assert data["filters"] == {"paths": ["nowhere/"], "rows": 0}
    assert Path(CLI).exists()
