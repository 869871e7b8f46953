from __future__ import annotations

from ssindex.query.fusion import (
    LEXICAL_WEIGHT_IDENTIFIER,
    LEXICAL_WEIGHT_NATURAL,
    Hit,
    Ranking,
    fuse,
    lexical_weight,
    reciprocal_rank_fusion,
)
from ssindex.text.lexical import analyze, terms


def test_identifiers_are_split_and_kept_whole() -> None:
    assert terms("parseEmailAddress") == ["parseemailaddress", "parse", "email", "address"]
    assert terms("HTTPServer") == ["httpserver", "http", "server"]
    assert terms("parse_addr()") == ["parse_addr", "parse", "addr"]
    assert analyze("Decode JSON") == "decode json"
    assert "x" * 41 not in terms("x" * 41)


def test_query_weights_follow_query_shape() -> None:
    assert lexical_weight("parse_addr") == LEXICAL_WEIGHT_IDENTIFIER
    assert lexical_weight("HTTPServer.serve_forever") == LEXICAL_WEIGHT_IDENTIFIER
    assert lexical_weight("how to read a file line by line") == LEXICAL_WEIGHT_NATURAL


def test_fusion_keeps_a_confident_dense_hit_first() -> None:
    dense = [Hit(1, 0.66), Hit(3, 0.54), Hit(2, 0.50), Hit(4, 0.35)]
    lexical = [Hit(3, 26.0), Hit(2, 22.0)] + [Hit(10 + i, 20.0 - i) for i in range(20)] + [
        Hit(1, 5.0)]
    dense_r, lexical_r = Ranking.of(dense), Ranking.of(lexical)
    assert reciprocal_rank_fusion([dense_r, lexical_r]).rows[0] != 1
    assert fuse(dense_r, lexical_r, LEXICAL_WEIGHT_NATURAL).rows[0] == 1


def test_degenerate_leg_falls_back_to_rrf() -> None:
    dense = [Hit(1, 0.5), Hit(2, 0.4)]
    flat = [Hit(2, 1.0), Hit(3, 1.0)]
    assert fuse(Ranking.of(dense), Ranking.of(flat), 0.5).rows.tolist() == [2, 1, 3]


def test_lone_identifier_queries_ask_for_the_exact_symbol() -> None:
    from ssindex.text.lexical import exact_symbol_term, query_terms

    assert exact_symbol_term("Parser.__init__") == "sym:__init__"
    assert query_terms("_converter").endswith("sym:_converter")
    assert query_terms("HTTPServer.serve_forever()").endswith("sym:serve_forever")
    assert "sym:" not in query_terms("read a file")
