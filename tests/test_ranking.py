"""The ranking stage after fusion: each rule on rows whose answer is known."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ssindex.query.conventions import file_kinds, identifiers
from ssindex.query.fusion import Ranking
from ssindex.query.ranking import (
    CASE_MISMATCH,
    COHERENCE,
    NAME_DEFINITION_BOOST,
    PIECE_WEIGHT,
    PRIORS,
    SAME_FILE_DECAY,
    Ranker,
)

ROWS = [  # path, symbol, kind, text
    ("src/router.ts", "createRouter", "function", "export function createRouter() {\n  1\n}"),
    ("src/router.ts", "mergeRouters", "function", "function mergeRouters(a, b) {\n  return a\n}"),
    ("src/router.ts", "router", "module", "const x = 1\nconst y = 2"),
    ("src/__tests__/router.test.ts", "router.test", "module", "it('works', () => {})"),
    ("docs/routing.md", "routing", "module", "# Routing\nRouters map paths."),
    ("src/index.ts", "index", "module", "export * from './router'\nexport { a } from './a'"),
    ("v1/router.ts", "createRouter", "function", "function createRouter() {\n  old()\n}"),
    ("v2/router.ts", "Router", "class", "class Router {\n  route() {}\n}"),
    ("src/http.ts", "handle", "function", "function handle(req) {\n  return req\n}"),
]


def _ranker(rows: list[tuple[str, str, str, str]] = ROWS) -> Ranker:
    columns = list(zip(*rows, strict=True))
    return Ranker(pa.table({"path": columns[0], "symbol": columns[1], "kind": columns[2],
                            "text": columns[3]}))


def _fused(*rows: int) -> Ranking:
    """Rows in order, with equal scores: whatever reorders them is the ranking stage."""
    return Ranking(np.array(rows, np.int64), np.ones(len(rows)))


def test_file_kinds_follow_each_languages_conventions() -> None:
    newer = {"": 2}
    assert file_kinds("src/__tests__/router.test.ts", newer) == ["test"]
    assert file_kinds("pkg/foo_test.go", newer) == ["test"]
    assert file_kinds("tests/test_api.py", newer) == ["test"]
    assert file_kinds("src/test/java/FooTest.java", newer) == ["test"]
    assert file_kinds("README.md", newer) == ["docs"]
    assert file_kinds("serde/Cargo.toml", newer) == ["config"]
    assert file_kinds("package.json", newer) == ["config"]
    assert file_kinds("examples/basic/main.rs", newer) == ["example"]
    assert file_kinds("lib/compat/shim.py", newer) == ["legacy"]
    assert file_kinds("third_party/zlib/inflate.c", newer) == ["vendored"]
    assert file_kinds("types/index.d.ts", newer) == ["stub"]
    assert file_kinds("v1/router.ts", newer) == ["older"]
    assert file_kinds("v2/router.ts", newer) == []
    assert file_kinds("src/latest.py", newer) == []
    assert file_kinds("src/contest.py", newer) == []  # "test" inside a word is no test


def test_identifiers_in_a_query() -> None:
    assert identifiers("Router") == ["Router"]
    assert identifiers("where is parse_addr defined") == ["parse_addr"]
    assert identifiers("HTTPServer.serve_forever and a::b") == ["serve_forever", "b"]
    assert identifiers("createRouter options") == ["createRouter"]
    assert identifiers("how routers are merged") == []


def test_priors_demote_tests_docs_barrels_and_older_trees() -> None:
    ranked, why = _ranker().rank("how requests are merged", _fused(3, 4, 5, 6, 8), 5)
    assert ranked.rows.tolist()[0] == 8  # the only plain implementation file
    assert why[3].factors["prior:test"] == PRIORS["test"]
    assert why[4].factors["prior:docs"] == PRIORS["docs"]
    assert why[5].factors["prior:barrel"] == PRIORS["barrel"]
    assert why[6].factors["prior:older"] == PRIORS["older"]


def test_a_prior_does_not_apply_when_the_query_asks_for_that_kind() -> None:
    _, why = _ranker().rank("router tests", _fused(3, 8), 2)
    assert "prior:test" not in why[3].factors
    _, why = _ranker().rank("routing docs", _fused(4, 8), 2)
    assert "prior:docs" not in why[4].factors


def test_a_named_definition_comes_first_even_when_no_leg_found_it() -> None:
    ranked, why = _ranker().rank("Router", _fused(8, 2), 3)
    assert ranked.rows.tolist()[0] == 7
    assert why[7].factors["defines"] > 1


def test_a_file_is_credited_once_before_the_next_file() -> None:
    ranked, why = _ranker().rank("merge", Ranking(np.array([0, 1, 2, 8], np.int64),
                                                  np.array([1.0, 0.99, 0.98, 0.7])), 4)
    assert ranked.rows.tolist()[:2] == [0, 8]
    assert why[1].factors["same file"] == SAME_FILE_DECAY
    assert why[2].factors["same file"] == SAME_FILE_DECAY ** 2


def test_the_exact_case_of_a_name_outranks_another_case() -> None:
    rows = [("src/de/impls.rs", "Result.deserialize", "method", "fn deserialize() {}"),
            ("src/de/mod.rs", "Deserialize", "trait", "pub trait Deserialize {}")]
    ranked, why = _ranker(rows).rank("Deserialize", _fused(0, 1), 2)
    assert ranked.rows.tolist() == [1, 0]
    assert why[1].factors["defines"] == NAME_DEFINITION_BOOST
    assert why[0].factors["defines"] == NAME_DEFINITION_BOOST * CASE_MISMATCH


def test_a_definition_inside_a_chunk_named_after_another_counts() -> None:
    rows = [("src/builder.ts", "inferBuilderOptions", "type",
             "export type inferBuilderOptions<T> = T"),
            ("src/procedure.ts", "BuiltProcedureDef", "interface",
             "interface BuiltProcedureDef {}\nexport type inferProcedureInput<T> = T['in']"),
            ("src/router.ts", "createRouter", "function",
             "function createRouter(input: inferProcedureInput<P>) {}")]
    ranked, why = _ranker(rows).rank("inferProcedureInput", _fused(0, 2, 1), 3)
    assert ranked.rows.tolist()[0] == 1
    assert "defines" in why[1].factors and "defines" not in why[2].factors  # a use is no definition


def test_a_file_with_several_strong_chunks_gains_evidence_once() -> None:
    rows = [("src/a.py", "one", "function", "def one(): ..."),
            ("src/b.py", "two", "function", "def two(): ..."),
            ("src/b.py", "three", "function", "def three(): ..."),
            ("src/b.py", "four", "function", "def four(): ...")]
    scores = np.array([1.0, 0.9, 0.8, 0.7])
    ranked, why = _ranker(rows).rank("how values are combined", Ranking(
        np.arange(4, dtype=np.int64), scores), 4)
    assert ranked.rows.tolist()[0] == 1  # b.py's best chunk, raised by its file's others
    assert why[1].added["file evidence"] == COHERENCE * 1.0  # b.py has the most evidence
    assert why[0].added["file evidence"] == COHERENCE * 1.0 * 1.0 / (0.9 + 0.8 + 0.7)
    assert not why[2].added and not why[3].added  # once per file
    _, why = _ranker(rows).rank("combine", Ranking(np.arange(4, dtype=np.int64), scores), 4)
    assert not why[1].added  # a query that is one name: its definition is the answer


def test_the_pieces_of_one_long_definition_are_one_piece_of_evidence() -> None:
    rows = [("src/a.py", "parse", "function", "def parse(): ..."),
            ("src/a.py", "parse", "function", "    more()"),
            ("src/b.py", "load", "function", "def load(): ..."),
            ("src/b.py", "dump", "function", "def dump(): ...")]
    _, why = _ranker(rows).rank("how files are read", Ranking(
        np.arange(4, dtype=np.int64), np.array([1.0, 0.8, 0.95, 0.8])), 4)
    a, b = 1.0 + PIECE_WEIGHT * 0.8, 0.95 + 0.8
    assert why[0].added["file evidence"] == COHERENCE * 1.0 * a / max(a, b)
    assert why[2].added["file evidence"] == COHERENCE * 1.0 * b / max(a, b)


def test_a_file_named_by_a_query_word_or_its_stem_is_evidence() -> None:
    rows = [("core/ColumnType.kt", "ColumnType", "class", "class ColumnType"),
            ("core/Table.kt", "Table", "class", "class Table"),
            ("core/Cargo.toml", "Cargo", "module", "[package]")]
    _, why = _ranker(rows).rank("column types of a table", _fused(0, 1, 2), 3)
    assert why[0].factors["file named"] > why[1].factors["file named"] > 1  # two words, one
    assert why[2].factors == {"prior:config": PRIORS["config"]}
    _, why = _ranker(rows).rank("cargo package manifest", _fused(0, 1, 2), 3)
    assert "prior:config" not in why[2].factors  # asked for
