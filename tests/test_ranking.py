"""The ranking stage after fusion: each rule on rows whose answer is known."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ssindex.query.fusion import Ranking
from ssindex.query.ranking import PRIORS, SAME_FILE_DECAY, Ranker, file_kinds, identifiers

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


def _ranker() -> Ranker:
    columns = list(zip(*ROWS, strict=True))
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
    assert file_kinds("examples/basic/main.rs", newer) == ["example"]
    assert file_kinds("lib/compat/shim.py", newer) == ["legacy"]
    assert file_kinds("third_party/zlib/inflate.c", newer) == ["vendored"]
    assert file_kinds("types/index.d.ts", newer) == ["stub"]
    assert file_kinds("v1/router.ts", newer) == ["older"]
    assert file_kinds("v2/router.ts", newer) == []
    assert file_kinds("src/latest.py", newer) == []
    assert file_kinds("src/contest.py", newer) == []  # "test" inside a word is no test


def test_identifiers_in_a_query() -> None:
    assert identifiers("Router") == ["router"]
    assert identifiers("where is parse_addr defined") == ["parse_addr"]
    assert identifiers("HTTPServer.serve_forever and a::b") == ["serve_forever", "b"]
    assert identifiers("createRouter options") == ["createrouter"]
    assert identifiers("how routers are merged") == []


def test_priors_demote_tests_docs_barrels_and_older_trees() -> None:
    ranked, why = _ranker().rank("how routers are merged", _fused(3, 4, 5, 6, 8), 5)
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
