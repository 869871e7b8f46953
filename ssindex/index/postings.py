"""In-memory BM25 over the analyzed columns, for the lexical leg of warm searches.

Written here rather than queried from Lance's full-text index because of
latency: on 2 cores at 100,000 chunks a Lance multi-field FTS query took
~30 ms, while weighing the postings of a query's terms and summing them with
``np.bincount`` takes ~1.5 ms, and the whole search has a 10 ms budget. A build
writes postings per segment of rows (``to_table``, an Arrow manifest beside the
index); searches map them in milliseconds.

Scoring is the classic per-field BM25 (k1 = 1.2, b = 0.75, Lucene's idf),
summed over the body and name fields with a per-query weight on the name
field. Names are short, so a name match outweighs a body match by far: right
for a query naming an identifier, wrong for a question in English, whose
common words ("get", "file") match countless names. On CoSQA's 500 web
questions the lexical leg scored MRR@10 0.251 with the name field weighted ×2,
0.320 with it ignored and 0.332 at ×0.25; identifier queries keep ×2. The terms
are the analyzer's (``ssindex.text.lexical``), split on spaces.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa

from ssindex.util.arrays import best_first, numeric_view, whole

K1, B = 1.2, 0.75
NAME_WEIGHT_NATURAL = 0.25
NAME_WEIGHT_IDENTIFIER = 2.0


@dataclass(frozen=True)
class Postings:
    """The postings of one segment of documents: which terms each holds, how often, in
    which field. Scores are not stored: ``Lexicon`` weighs them per query with the
    statistics of the version's rows, so a segment stays valid as others change."""

    terms: pa.Array
    """Term t's text is ``terms[t]``; sorted (by UTF-8 bytes, as Arrow sorts strings)."""
    offsets: np.ndarray
    """Term t's postings are ``docs[offsets[t]:offsets[t + 1]]``, one per field it occurs in."""
    docs: np.ndarray
    tf: np.ndarray
    """Occurrences of the term in the doc's field."""
    in_name: np.ndarray
    """Whether the posting is the name field's (else the body's)."""
    lengths: np.ndarray
    """(2, docs): terms in each doc's body and name fields (stored with the docs, in the
    snapshot, not in ``to_table``)."""
    prefixes: np.ndarray | None = None
    """Each term's ``SortedTerms`` prefix, when read from a table (computed otherwise)."""

    @property
    def size(self) -> int:
        return int(self.lengths.shape[1])

    @cached_property
    def vocabulary(self) -> SortedTerms:
        return SortedTerms(self.terms, self.prefixes)

    @classmethod
    def build(cls, body: pa.ChunkedArray | pa.Array, name: pa.ChunkedArray | pa.Array,
              ) -> Postings:
        """Postings of the documents (rows) of two fields of space-separated terms."""
        import pyarrow.compute as pc  # here, not above: searches never need it (~0.1 s)

        fields = [_tokens(column) for column in (body, name)]
        terms = pc.unique(pa.concat_arrays([words for words, *_ in fields]))
        terms = terms.take(pc.sort_indices(terms))
        remaps = [pc.index_in(words, value_set=terms).to_numpy(zero_copy_only=False)
                  for words, *_ in fields]
        term, docs, tf, in_name, lengths = _entries(fields, remaps)
        order = np.argsort(term, kind="stable")
        return cls._assemble(terms, term[order], docs[order], tf[order], in_name[order],
                             lengths)

    def merge(self, keep: np.ndarray, other: Postings) -> Postings:
        """These postings without the docs not in ``keep`` (a mask), followed by the docs
        of ``other``: the postings ``build`` would give for the docs in that order (up
        to the order of a term's postings), without tokenizing anything again. Both are
        sorted by term, so ``other``'s entries are inserted, not sorted in."""
        import pyarrow.compute as pc

        present = np.asarray(pc.is_in(other.terms, value_set=self.terms), bool)
        unseen = other.terms.filter(pa.array(~present))
        # term i of ours moves up by the unseen terms sorting before it
        slots = self.vocabulary.insertions(unseen)
        moved = np.arange(len(self.terms)) + np.searchsorted(slots, np.arange(len(self.terms)),
                                                             side="right")
        placed = slots + np.arange(len(unseen))
        order = np.empty(len(self.terms) + len(unseen), np.int64)
        order[moved], order[placed] = np.arange(len(self.terms)), len(self.terms) + np.arange(
            len(unseen))
        terms = pa.concat_arrays([self.terms, unseen]).take(pa.array(order))
        theirs = np.empty(len(other.terms), np.int64)
        theirs[~present] = placed
        theirs[present] = moved[np.asarray(pc.index_in(
            other.terms.filter(pa.array(present)), value_set=self.terms), np.int64)]
        kept = keep[self.docs]
        ours = (np.repeat(moved, np.diff(self.offsets))[kept],
                (np.cumsum(keep) - 1)[self.docs[kept]], self.tf[kept], self.in_name[kept])
        added = (np.repeat(theirs, np.diff(other.offsets)), other.docs + int(keep.sum()),
                 other.tf, other.in_name)
        at = np.searchsorted(ours[0], added[0], side="right")
        term, docs, tf, in_name = (np.insert(a, at, b) for a, b in zip(ours, added, strict=True))
        return self._assemble(terms, term, docs, tf, in_name,
                              np.concatenate([self.lengths[:, keep], other.lengths], axis=1))

    @classmethod
    def concatenate(cls, parts: list[Postings]) -> Postings:
        """The postings of the parts' docs, one part after the other: those that merging
        each into the ones before would give (``merge``), without tokenizing anything
        again. The parts' terms are encoded in one pass and their entries sorted by term
        at once: a chain of merges over the standard library's 9 blocks took 0.9 s, most
        of a clean commit's time on one core; this takes 0.1 s."""
        import pyarrow.compute as pc

        if len(parts) == 1:
            return parts[0]
        encoded = pc.dictionary_encode(pa.concat_arrays([part.terms for part in parts]))
        order = pc.sort_indices(encoded.dictionary).to_numpy()
        rank = np.empty(len(order), np.int32)
        rank[order] = np.arange(len(order), dtype=np.int32)
        term = np.repeat(rank[encoded.indices.to_numpy(zero_copy_only=False)],
                         np.concatenate([np.diff(part.offsets) for part in parts]))
        starts = np.cumsum([0, *(part.size for part in parts[:-1])], dtype=np.int32)
        docs = np.concatenate([part.docs + start for part, start in zip(parts, starts,
                                                                        strict=True)])
        # each part's entries are sorted by term, in doc order within a term: a stable
        # sort keeps the parts in order within a term, as merging them does
        by_term = np.argsort(term, kind="stable")
        return cls._assemble(encoded.dictionary.take(pa.array(order)), term[by_term],
                             docs[by_term], np.concatenate([p.tf for p in parts])[by_term],
                             np.concatenate([p.in_name for p in parts])[by_term],
                             np.concatenate([part.lengths for part in parts], axis=1))

    @classmethod
    def _assemble(cls, terms: pa.Array, term: np.ndarray, docs: np.ndarray, tf: np.ndarray,
                  in_name: np.ndarray, lengths: np.ndarray) -> Postings:
        """Postings of entries sorted by term (unused terms dropped)."""
        used = np.bincount(term, minlength=len(terms)) > 0
        if not used.all():
            terms = terms.filter(pa.array(used))
            term = (np.cumsum(used) - 1)[term]
        offsets = np.zeros(len(terms) + 1, np.int64)
        np.cumsum(np.bincount(term, minlength=len(terms)), out=offsets[1:])
        return cls(terms, offsets, docs.astype(np.int32, copy=False),
                   tf.astype(np.int32, copy=False), in_name.astype(bool, copy=False),
                   lengths.astype(np.int32, copy=False))

    def to_table(self) -> pa.Table:
        """One row per term: its postings as lists (the list offsets are ``offsets``)."""
        offsets = pa.array(self.offsets, pa.int64())

        def lists(values: np.ndarray) -> pa.LargeListArray:
            return pa.LargeListArray.from_arrays(offsets, pa.array(values))

        return pa.table({"term": self.terms,
                         "prefix": pa.array(self.vocabulary.prefixes, pa.uint64()),
                         "docs": lists(self.docs), "tf": lists(self.tf),
                         "in_name": lists(self.in_name.view(np.uint8))})

    @classmethod
    def from_table(cls, table: pa.Table, lengths: np.ndarray) -> Postings:
        """The postings ``to_table`` wrote, of docs with ``lengths`` (2, docs)."""
        docs, tf, in_name = (whole(table.column(name)) for name in ("docs", "tf", "in_name"))
        return cls(whole(table.column("term")),
                   numeric_view(docs.offsets, np.int64), numeric_view(docs.values, np.int32),
                   numeric_view(tf.values, np.int32),
                   numeric_view(in_name.values, np.uint8).view(bool), lengths,
                   numeric_view(table.column("prefix"), np.uint64))

    def span(self, term: str) -> slice | None:
        """Where ``term``'s postings are, if it occurs."""
        i = self.vocabulary.get(term)
        return None if i is None else slice(int(self.offsets[i]), int(self.offsets[i + 1]))


@dataclass(frozen=True)
class Segment:
    """Postings that hold some of a version's rows."""

    postings: Postings
    rows: np.ndarray | None = None
    """The version row of each of the postings' docs (-1: not in the version); ``None``:
    doc i is row i."""


class Lexicon:
    """BM25 over a version's rows, whose postings are in segments: a base written
    once, and the rows changed since (``ssindex.index.search_files``).

    Documents are weighed at query time, from each term's postings and the version's
    own statistics (document frequencies, field lengths), not from scores stored with
    the postings: stored scores would hold the statistics of the rows they were
    written with, so every commit would have rewritten every posting (~0.4 s of a
    one-file change to the standard library's index). Weighing a query's postings
    (38k for the median CoSQA question over the standard library) takes ~0.7 ms, ~0.35 ms
    more than summing stored scores; a hybrid search does it beside the dense scan."""

    def __init__(self, segments: list[Segment]) -> None:
        self.segments = segments
        size = sum(int(np.sum(s.rows >= 0)) if s.rows is not None else s.postings.size
                   for s in segments)
        self.lengths = np.zeros((2, size), np.int32)
        """(2, rows): terms in each row's body and name fields."""
        for segment in segments:
            rows = segment.rows if segment.rows is not None else np.arange(segment.postings.size)
            live = rows >= 0
            self.lengths[:, rows[live]] = segment.postings.lengths[:, live]
        self.size = size
        average = np.maximum(self.lengths.mean(axis=1), 1e-9) if size else np.ones(2)
        self._norms = (K1 * (1 - B) + self.lengths * (K1 * B / average)[:, None]).astype(
            np.float32).ravel()
        """BM25's length norm of each row's body, then of each row's name."""

    @cached_property
    def total(self) -> int:
        """Terms in all rows, both fields (the sum of every term's ``frequency``)."""
        return int(self.lengths.sum(dtype=np.int64))

    def _postings(self, term: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The (row, tf, in_name) postings of ``term`` in the version's rows."""
        found = []
        for segment in self.segments:
            where = segment.postings.span(term)
            if where is None:
                continue
            p = segment.postings
            docs, tf, in_name = p.docs[where], p.tf[where], p.in_name[where]
            if segment.rows is not None:
                docs = segment.rows[docs]
                live = docs >= 0
                docs, tf, in_name = docs[live], tf[live], in_name[live]
            found.append((docs, tf, in_name))
        if len(found) == 1:
            return found[0]
        return (np.concatenate([f[0] for f in found]).astype(np.int64, copy=False),
                np.concatenate([f[1] for f in found]), np.concatenate([f[2] for f in found])) \
            if found else (np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, bool))

    def frequency(self, term: str) -> int:
        """Occurrences of ``term`` in the version's rows, over both fields."""
        return int(self._postings(term)[1].sum(dtype=np.int64))

    def scores(self, query_terms: list[str], name_weight: float) -> np.ndarray:
        """BM25 score of every row (zero where no term matches), the name field's part
        weighted by ``name_weight``."""
        rows, weights = [], []
        # a term the query repeats counts that many times: its postings are read once
        # (a pasted snippet repeats its words hundreds of times)
        for term, repeats in sorted(Counter(query_terms).items()):
            docs, tf, in_name = self._postings(term)
            if not len(docs):
                continue
            named = int(np.count_nonzero(in_name))
            df = np.array([len(docs) - named, named], np.float64)  # per field
            idf = np.log1p((self.size - df + 0.5) / (df + 0.5)) * repeats * np.array(
                [1.0, name_weight])
            counts = tf.astype(np.float32)
            norms = self._norms[docs + in_name * self.size] if named else self._norms[docs]
            weight = counts * np.float32(K1 + 1) / (counts + norms)
            weight *= np.where(in_name, np.float32(idf[1]), np.float32(idf[0])) if named \
                else np.float32(idf[0])
            rows.append(docs)
            weights.append(weight)
        if not rows:
            return np.zeros(self.size, np.float32)
        return np.bincount(np.concatenate(rows), weights=np.concatenate(weights),
                           minlength=self.size).astype(np.float32)

    def top(self, query_terms: list[str], limit: int, name_weight: float,
            allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Rows with a positive score, best first (at most ``limit``), and their
        scores; only rows ``allowed`` lets through, when given."""
        scores = self.scores(query_terms, name_weight)
        if allowed is not None:
            np.multiply(scores, allowed, out=scores)
        matched = np.flatnonzero(scores > 0)
        best = matched[best_first(scores[matched], limit)]  # equal scores rank by row
        return best, scores[best]


def _tokens(column: pa.ChunkedArray | pa.Array,
            ) -> tuple[pa.Array, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One field's (words, word index, doc, term frequency) entries, one per distinct
    (word, doc), and each doc's length in terms."""
    import pyarrow.compute as pc

    column = whole(column)
    size = len(column)
    tokens = pc.split_pattern(pc.fill_null(column, ""), " ")
    words, parents = pc.list_flatten(tokens), pc.list_parent_indices(tokens)
    present = pc.not_equal(words, "")
    words, parents = words.filter(present), parents.filter(present)
    encoded = whole(pc.dictionary_encode(words))
    word = encoded.indices.to_numpy().astype(np.int64)
    doc = parents.to_numpy().astype(np.int64)
    lengths = np.bincount(doc, minlength=size)
    pairs, tf = np.unique(word * max(size, 1) + doc, return_counts=True)
    return encoded.dictionary, pairs // max(size, 1), pairs % max(size, 1), tf, lengths


def _entries(fields: list[tuple[pa.Array, np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
             remaps: list[np.ndarray],
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The (term, doc, tf, in_name) entries and (2, docs) lengths of tokenized body and
    name fields; ``remaps[f]`` maps field f's word indices to term ids."""
    term, docs, tf, in_name = [], [], [], []
    for field, ((_, word, doc, counts, _), remap) in enumerate(zip(fields, remaps, strict=True)):
        term.append(remap[word].astype(np.int64))
        docs.append(doc)
        tf.append(counts)
        in_name.append(np.full(len(word), bool(field)))
    lengths = np.stack([fields[0][4], fields[1][4]])
    return (np.concatenate(term), np.concatenate(docs), np.concatenate(tf),
            np.concatenate(in_name), lengths)


class SortedTerms(Mapping[str, int]):
    """Term → id over the postings' sorted terms, by binary search in the Arrow buffers.

    Not a dict: building one over the ~240k terms of a standard-library index costs
    ~0.2 s, in every build and every cold search, for a handful of lookups. Each
    term's first 8 bytes, as one integer, narrow a lookup with one numpy search to
    the few terms sharing them (~5 µs a lookup, where bisecting the strings took 20)."""

    def __init__(self, terms: pa.Array, prefixes: np.ndarray | None = None) -> None:
        self._size = len(terms)
        self._offsets = np.frombuffer(terms.buffers()[1], np.int32)[
            terms.offset : terms.offset + len(terms) + 1] if len(terms) else np.zeros(1, np.int32)
        data = terms.buffers()[2]
        self._data = memoryview(data) if data is not None else memoryview(b"")
        self._terms = terms
        self.prefixes = self._compute_prefixes() if prefixes is None else prefixes

    def _compute_prefixes(self) -> np.ndarray:
        """Each term's first 8 bytes (zero-padded) as a big-endian integer."""
        width = np.arange(8)
        inside = width < np.diff(self._offsets)[:, None]
        head = np.zeros(inside.shape, np.uint64)
        head[inside] = np.frombuffer(self._data, np.uint8)[
            (self._offsets[:-1, None] + width)[inside]]
        return (head << (8 * (7 - width)).astype(np.uint64)).sum(axis=1, dtype=np.uint64)

    def insertions(self, terms: pa.Array) -> np.ndarray:
        """``insertion`` of each of ``terms`` at once: their prefixes are searched in one
        numpy call, and only terms sharing a prefix with one of ours are bisected. Term
        by term, a merge of two blocks' postings spent ~60% of its time here."""
        asked = SortedTerms(terms)
        low = np.searchsorted(self.prefixes, asked.prefixes, "left")
        high = np.searchsorted(self.prefixes, asked.prefixes, "right")
        for at in np.flatnonzero(high > low).tolist():
            low[at] = bisect.bisect_left(range(self._size), asked._key(at), int(low[at]),
                                         int(high[at]), key=self._key)
        return low.astype(np.int64)

    def _key(self, i: int) -> bytes:
        return bytes(self._data[self._offsets[i] : self._offsets[i + 1]])

    def insertion(self, term: str) -> int:
        """Where ``term`` sorts among the terms (its id when present)."""
        key = term.encode()
        prefix = np.uint64(int.from_bytes(key[:8].ljust(8, b"\0"), "big"))
        low = int(np.searchsorted(self.prefixes, prefix, "left"))
        high = int(np.searchsorted(self.prefixes, prefix, "right"))
        return bisect.bisect_left(range(self._size), key, low, high, key=self._key)

    def _find(self, term: object) -> int | None:
        if not isinstance(term, str):
            return None
        i = self.insertion(term)
        return i if i < self._size and self._key(i) == term.encode() else None

    def __getitem__(self, term: str) -> int:
        i = self._find(term)
        if i is None:
            raise KeyError(term)
        return i

    def __contains__(self, term: object) -> bool:
        return self._find(term) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self._terms.to_pylist())

    def __len__(self) -> int:
        return self._size
