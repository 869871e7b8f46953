"""The hand-written parts of the search path against their plain definitions: BM25
postings against a direct computation, and the sign-bit shortlist against an exact scan."""

from __future__ import annotations

import bisect
import itertools
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from ssindex import build
from ssindex.index.layout import IndexDir
from ssindex.index.postings import K1, B, Lexicon, Postings, Segment, SortedTerms
from ssindex.index.search_files import SNAPSHOT_COLUMNS, SearchFiles
from ssindex.index.table import scan
from ssindex.query import dense
from ssindex.query import searcher as search
from ssindex.text.lexical import analyze

from .conftest import STDLIB, copy_stdlib


def _bm25(docs: list[list[str]], query: list[str]) -> list[float]:
    """Textbook BM25 of each doc for ``query`` (one field)."""
    size = len(docs)
    average = sum(map(len, docs)) / size
    scores = []
    for doc in docs:
        total = 0.0
        for term in query:
            df = sum(1 for d in docs if term in d)
            tf = doc.count(term)
            if tf:
                idf = math.log(1 + (size - df + 0.5) / (df + 0.5))
                total += idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * len(doc) / average))
        scores.append(total)
    return scores


def test_postings_score_like_textbook_bm25_over_both_fields() -> None:
    bodies = [analyze((STDLIB / "json" / name).read_text()) for name in
              ("decoder.py", "encoder.py", "scanner.py", "tool.py", "__init__.py")]
    names = ["decoder json", "encoder json", "scanner json", "tool json", "json init"]
    postings = Postings.build(pa.array(bodies), pa.array(names))
    restored = Lexicon([Segment(Postings.from_table(postings.to_table(), postings.lengths))])
    for query, name_weight in itertools.product(
            (["decode", "json", "string"], ["encoder"], ["scanner", "scanner", "py"],
             ["json", "decode", "json", "json"], ["no_such_term"]), (0.5, 2.0)):
        body = _bm25([b.split() for b in bodies], query)
        name = _bm25([n.split() for n in names], query)
        expected = [x + name_weight * y for x, y in zip(body, name, strict=True)]
        assert np.allclose(restored.scores(query, name_weight), expected, rtol=1e-5)
        docs, scores = restored.top(query, 3, name_weight)
        assert list(docs) == sorted(range(5), key=lambda d: -expected[d])[:len(docs)]
        assert all(s > 0 for s in scores)
    counts = {term: restored.frequency(term) for term in postings.vocabulary}
    everything = " ".join(bodies + names).split()
    assert counts == {term: everything.count(term) for term in set(everything)}
    assert restored.total == len(everything) and restored.frequency("no_such_term") == 0


def test_segments_score_like_postings_built_over_the_rows_they_hold() -> None:
    """A base with deleted rows and a delta (merged from two) weigh every row as postings
    built afresh over the version's rows do: same scores, frequencies and total; and
    merging the two gives those postings."""
    bodies = [analyze((STDLIB / "json" / name).read_text()) for name in
              ("decoder.py", "encoder.py", "scanner.py", "tool.py", "__init__.py")]
    bodies += ["decode twice twice", "parse extra things", "", "json decode"]
    names = ["decoder json", "encoder json", "scanner json", "tool json", "json init",
             "decode_twice", "parse_extra", "empty", "json"]
    base = Postings.build(pa.array(bodies[:5]), pa.array(names[:5]))
    live = np.array([True, False, True, True, False])
    first = Postings.build(pa.array(bodies[5:7]), pa.array(names[5:7]))
    delta = first.merge(np.array([False, True]), Postings.build(pa.array(bodies[7:]),
                                                                pa.array(names[7:])))
    rows = [0, 2, 3, 6, 7, 8]  # the version: live base rows, then the delta's
    fresh = Lexicon([Segment(Postings.build(pa.array([bodies[r] for r in rows]),
                                            pa.array([names[r] for r in rows])))])
    segmented = Lexicon([Segment(base, np.where(live, np.cumsum(live) - 1, -1)),
                         Segment(delta, 3 + np.arange(delta.size))])
    merged = Lexicon([Segment(base.merge(live, delta))])
    for query, name_weight in itertools.product(
            (["decode", "json", "twice"], ["encoder"], ["parse", "things", "extra"],
             ["scanner", "scanner", "py"], ["no_such_term"]), (0.25, 2.0)):
        expected = fresh.scores(query, name_weight)
        assert np.allclose(segmented.scores(query, name_weight), expected, rtol=1e-5)
        assert np.allclose(merged.scores(query, name_weight), expected, rtol=1e-5)
    vocabulary = set(" ".join(bodies + names).split())
    for lexicon in (segmented, merged):
        assert {t: lexicon.frequency(t) for t in vocabulary} == {
            t: fresh.frequency(t) for t in vocabulary}
        assert lexicon.total == fresh.total and lexicon.size == fresh.size == 6
    assert fresh.frequency("encoder") == 0 and segmented.frequency("encoder") == 0


def test_sign_bit_shortlist_keeps_the_exact_top_hits(
        stdlib_index: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = stdlib_index
    queries = ["parse an email address", "decode json from a string", "send an http request",
               "rotate log files by size", "quote a header value", "handle a redirect",
               "format a log record", "encode a python object", "read a cookie",
               "base64 encode a message body"]
    exact = search.Searcher(root / ".ssindex")
    expected = {q: [h.row_id for h in exact.semantic(q, 10)] for q in queries}
    monkeypatch.setattr(dense, "PREFILTER_ROWS", 100)
    monkeypatch.setattr(dense, "SHORTLIST", 300)
    shortlisted = search.Searcher(root / ".ssindex")
    overlap = []
    for query in queries:
        got = [h.row_id for h in shortlisted.semantic(query, 10)]
        assert got[0] == expected[query][0], query
        overlap.append(len(set(got) & set(expected[query])) / 10)
    assert np.mean(overlap) >= 0.9
    assert len(shortlisted.rows) > 3 * 300  # the shortlist really was a subset


@pytest.mark.parametrize("merge", [False, True])
def test_incremental_search_files_equal_rebuilt_ones(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     merge: bool) -> None:
    """Rebuilds update the search files in place of rebuilding them: a delta over the
    kept base, or (past the merge share) a new base merged from the two. Either way the
    version must hold the same rows, scores and term counts as postings built afresh."""
    root = copy_stdlib(tmp_path / "tree", "json")
    build(root)

    def refuse(*_: Any) -> None:
        raise AssertionError("the rebuild recomputed the search files from the table")

    monkeypatch.setattr("ssindex.pipeline.commit.write_search_files", refuse)
    if merge:
        monkeypatch.setattr("ssindex.index.search_files.MERGE_ROWS", 0)
    index = IndexDir(root / ".ssindex")
    base = index.read_head().data["snapshot"]
    decoder = root / "json" / "decoder.py"
    decoder.write_text(decoder.read_text() + "\n\ndef decode_twice(s):\n    return s * 2\n")
    (root / "json" / "tool.py").unlink()
    build(root)
    # a second change: a new file, and one of the first change's rows replaced
    decoder.write_text(decoder.read_text().replace("return s * 2", "return s + s"))
    (root / "json" / "extra.py").write_text("def parse_extra_things(data):\n"
                                            "    return [d for d in data if d]\n")
    build(root)
    head = index.read_head().data
    assert ("delta_snapshot" in head) is not merge and (head["snapshot"] == base) is not merge
    files = SearchFiles.read(index, head)
    rows, updated = files.rows, files.lexicon()
    table = scan(index.open_table(head["table_version"]), ["id", "lex_body", "lex_name"])
    fresh = Lexicon([Segment(Postings.build(table.column("lex_body"), table.column("lex_name")))])
    assert sorted(rows.column("id").to_pylist()) == sorted(table.column("id").to_pylist())
    position = {row_id: i for i, row_id in enumerate(rows.column("id").to_pylist())}
    order = [position[row_id] for row_id in table.column("id").to_pylist()]
    for query, name_weight in itertools.product(
            (["decode", "twice"], ["parse", "extra", "things"], ["json", "scanner"], ["tool"]),
            (0.25, 2.0)):
        expected = fresh.scores(query, name_weight)
        assert np.allclose(updated.scores(query, name_weight)[order], expected, rtol=1e-5)
    vocabulary = set(" ".join(table.column("lex_body").to_pylist()
                              + table.column("lex_name").to_pylist()).split())
    assert {t: updated.frequency(t) for t in vocabulary} == {
        t: fresh.frequency(t) for t in vocabulary}
    assert updated.frequency("twice") and updated.frequency("extra")
    hits = search.Searcher(index.path).search("parse_extra_things", k=3)
    assert hits.results[0]["symbol"].endswith("parse_extra_things")


def test_search_files_written_in_blocks_equal_ones_written_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A clean version's search files stream in blocks of rows, their postings built
    apart and concatenated: the rows, scores and term counts must be those of postings
    built over every row."""
    root = copy_stdlib(tmp_path / "tree", "json")
    monkeypatch.setattr("ssindex.index.search_files.BLOCK_ROWS", 5)  # blocks of every size
    build(root, no_embed=True)
    index = IndexDir(root / ".ssindex")
    head = index.read_head().data
    files = SearchFiles.read(index, head)
    table = index.open_table(head["table_version"]).to_lance().to_table(
        columns=["id", "lex_body", "lex_name"])
    assert files.rows.column("id").equals(table.column("id")) and table.num_rows > 5 * 8
    fresh = Lexicon([Segment(Postings.build(table.column("lex_body"), table.column("lex_name")))])
    concatenated = files.lexicon()
    for query, name_weight in itertools.product(
            (["decode", "json"], ["scanner", "py_scanstring"], ["encoder", "indent"]), (0.25, 2.0)):
        assert np.allclose(concatenated.scores(query, name_weight),
                           fresh.scores(query, name_weight), rtol=1e-5)
    vocabulary = set(" ".join(table.column("lex_body").to_pylist()
                              + table.column("lex_name").to_pylist()).split())
    assert {t: concatenated.frequency(t) for t in vocabulary} == {t: fresh.frequency(t)
                                                              for t in vocabulary}
    assert concatenated.total == fresh.total


def test_concatenated_postings_are_those_merges_give() -> None:
    """Concatenating blocks' postings (terms shared, new, or in one block alone; an
    empty block) gives exactly what merging each block into those before gives: the
    same terms, entries in the same order, and lengths."""
    texts = [analyze((STDLIB / "json" / name).read_text()) for name in
             ("decoder.py", "encoder.py", "scanner.py", "tool.py", "__init__.py")]
    bodies = [texts[:2], [], texts[2:3], ["zz_only_here é ée", "json json decode"], texts[3:]]
    parts = [Postings.build(pa.array(block, pa.string()),
                            pa.array([f"name{len(block)} json" for _ in block], pa.string()))
             for block in bodies]
    merged = parts[0]
    for part in parts[1:]:
        merged = merged.merge(np.ones(merged.size, bool), part)
    concatenated = Postings.concatenate(parts)
    assert concatenated.terms.equals(merged.terms)
    for field in ("offsets", "docs", "tf", "in_name", "lengths"):
        assert np.array_equal(getattr(concatenated, field), getattr(merged, field)), field
    assert concatenated.size == sum(map(len, bodies)) == 7


def test_a_revectored_snapshot_streamed_in_other_blocks_equals_the_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The finished version of a lexical one streams the old snapshot's rows with the
    table's new vectors, in blocks that need not line up: its rows must be the table's."""
    root = copy_stdlib(tmp_path / "tree", "json")
    monkeypatch.setattr("ssindex.index.search_files.BLOCK_ROWS", 5)
    build(root, no_embed=True)
    monkeypatch.setattr("ssindex.index.search_files.BLOCK_ROWS", 7)  # the table's batches
    assert build(root)["search_files"] == "revectored"
    index = IndexDir(root / ".ssindex")
    head = index.read_head().data
    rows = SearchFiles.read(index, head).rows
    table = index.open_table(head["table_version"]).to_lance().to_table(
        columns=SNAPSHOT_COLUMNS)
    assert rows.column("vec_codes").null_count == 0 and table.num_rows > 7 * 8
    assert rows.select(SNAPSHOT_COLUMNS).equals(table)


def test_sorted_terms_find_and_place_like_a_sorted_list() -> None:
    """Term lookups binary-search Arrow buffers through 8-byte prefixes, one at a time or
    many at once: they must agree with a plain sorted list, for terms sharing long
    prefixes and non-ASCII ones too."""
    words = sorted({"a", "ab", "abcdefgh", "abcdefghi", "abcdefghij", "abcdefgh\0", "zz", "é",
                    "ée", "parse_json_document", "parse_json_documents", "x" * 40, "b"},
                   key=str.encode)
    terms = SortedTerms(pa.array(words, pa.string()).slice(0))
    keys = [w.encode() for w in words]
    probes = [*words, "", "aa", "abcdefgh0", "abcdefghia", "parse_json", "ë", "zzz", "0"]
    for probe in probes:
        assert terms.insertion(probe) == bisect.bisect_left(keys, probe.encode()), probe
        assert (probe in terms) == (probe in words), probe
    assert terms.insertions(pa.array(probes, pa.string()).slice(1)).tolist() == [
        bisect.bisect_left(keys, probe.encode()) for probe in probes[1:]]
    assert [terms[w] for w in words] == list(range(len(words)))
    assert list(terms) == words and len(terms) == len(words)
    assert "" not in SortedTerms(pa.array([], pa.string())) and "a" in SortedTerms(
        pa.array(["b", "a"], pa.string()).slice(1))


def test_a_search_process_imports_no_build_machinery(
        stdlib_index: tuple[Path, dict[str, Any]]) -> None:
    """A cold search pays for every import: it must not load LanceDB, torch, pandas or
    pyarrow.compute (each 0.1 s to seconds), only the search files and the query model.
    A query that names a symbol builds the symbol table in Arrow: pyarrow.compute
    (~25 ms) then, for less than the table's build in Python, and still nothing else.
    (The first search on a machine may export the ONNX query model with torch, once.)"""
    root, _ = stdlib_index

    def loaded(query: str) -> str:
        probe = ("import sys\nfrom ssindex.query.searcher import Searcher\n"
                 f"response = Searcher({str(root / '.ssindex')!r}).search({query!r}, k=3)\n"
                 "assert response.results, response\n"
                 "print(sorted(m for m in ('lancedb', 'lance', 'torch', 'pandas', "
                 "'pyarrow.compute', 'transformers') if m in sys.modules))")
        return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              check=True).stdout.strip()

    loaded("decode json")  # the first may export the query model
    assert loaded("decode json") == "[]"
    assert loaded("JSONDecoder") == "['pyarrow.compute']"


def test_shortlist_ranks_the_farthest_sign_patterns_last(
        stdlib_index: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Hamming distances reach 384 bits: they must not wrap around (as a uint8 sum would,
    shortlisting a row with every sign opposite to the query's)."""
    root, _ = stdlib_index
    searcher = search.Searcher(root / ".ssindex")
    vector = searcher.embed_query("decode json from a string")
    searcher.dense.shortlist(vector)  # builds the sign words of every row
    query = dense.sign_words(vector[None, :] > 0)[0]
    signs = np.random.default_rng(0).integers(0, 2**63, size=searcher.dense._signs.shape,
                                              dtype=np.int64).astype(np.uint64)
    signs[:, 0] = ~query  # every sign opposite: distance 384
    signs[:, 1] = query  # every sign equal: distance 0
    monkeypatch.setattr(searcher.dense, "_signs", signs)
    monkeypatch.setattr(dense, "SHORTLIST", 100)
    shortlist = searcher.dense.shortlist(vector)
    assert 1 in shortlist and 0 not in shortlist and 100 <= len(shortlist) < 200
