"""In-memory BM25 over the analyzed columns, for the lexical leg of warm searches.

Written here rather than queried from Lance's full-text index because of
latency: on 2 cores at 100,000 chunks a Lance multi-field FTS query took
~30 ms, while summing precomputed impacts with ``np.bincount`` takes ~1.5 ms,
and the whole search has a 10 ms budget. A build computes the postings once
per committed version (``to_table``, an Arrow manifest beside the index);
searches load them in milliseconds.

Scoring is the classic per-field BM25 (k1 = 1.2, b = 0.75, Lucene's idf),
summed over the body and name fields with a per-query weight on the name
field. Names are short, so a name match outweighs a body match by far: right
for a query naming an identifier, wrong for a question in English, whose
common words ("get", "file") match countless names. On CoSQA's 500 web
questions the lexical leg scored MRR@10 0.251 with the name field weighted ×2,
0.320 with it ignored and 0.332 at ×0.25; identifier queries keep ×2. The terms
are the analyzer's (``ssindex.lexical``), split on spaces.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ssindex.store import numeric_view

K1, B = 1.2, 0.75
NAME_WEIGHT_NATURAL = 0.25
NAME_WEIGHT_IDENTIFIER = 2.0


@dataclass(frozen=True)
class Postings:
    terms: pa.Array
    """Term t's text is ``terms[t]``."""
    offsets: np.ndarray
    """Term t's postings are ``docs[offsets[t]:offsets[t + 1]]``, one per field it occurs in."""
    docs: np.ndarray
    tf: np.ndarray
    """Occurrences of the term in the doc's field."""
    in_name: np.ndarray
    """Whether the posting is the name field's (else the body's)."""
    impacts: np.ndarray
    """BM25 contribution of the term to the doc within one field."""
    counts: np.ndarray
    """Collection frequency of each term over both fields (for ``ssindex.abstain``)."""
    size: int
    lengths: np.ndarray | None = None
    """(2, docs): terms in each doc's body and name fields; needed by ``update`` only,
    so stored with the docs (the search snapshot), not in ``to_table``."""

    @cached_property
    def vocabulary(self) -> dict[str, int]:
        return {word: i for i, word in enumerate(self.terms.to_pylist())}

    @classmethod
    def build(cls, body: pa.ChunkedArray | pa.Array, name: pa.ChunkedArray | pa.Array,
              ) -> Postings:
        """Postings of the documents (rows) of two fields of space-separated terms."""
        fields = [_tokens(column) for column in (body, name)]
        terms = pc.unique(pa.concat_arrays([words for words, *_ in fields]))
        return cls._assemble(terms, *_entries(fields, terms, 0))

    def update(self, keep: np.ndarray, body: pa.ChunkedArray | pa.Array,
               name: pa.ChunkedArray | pa.Array) -> Postings:
        """These postings without the docs not in ``keep`` (a mask), followed by new docs
        with fields ``body`` and ``name``: the postings ``build`` would give for the docs
        in that order, tokenizing only the new ones."""
        if self.lengths is None:
            raise ValueError("postings without doc lengths cannot be updated")
        term = np.repeat(np.arange(len(self.terms)), np.diff(self.offsets))
        kept = keep[self.docs]
        position = np.cumsum(keep) - 1
        fields = [_tokens(column) for column in (body, name)]
        words = pc.unique(pa.concat_arrays([words for words, *_ in fields]))
        unseen = words.filter(pc.invert(pc.is_in(words, value_set=self.terms)))
        terms = pa.concat_arrays([self.terms, unseen.cast(pa.string())])
        added = _entries(fields, terms, int(keep.sum()))
        return self._assemble(
            terms, np.concatenate([term[kept], added[0]]),
            np.concatenate([position[self.docs[kept]], added[1]]),
            np.concatenate([self.tf[kept], added[2]]),
            np.concatenate([self.in_name[kept], added[3]]),
            np.concatenate([self.lengths[:, keep], added[4]], axis=1))

    @classmethod
    def _assemble(cls, terms: pa.Array, term: np.ndarray, docs: np.ndarray, tf: np.ndarray,
                  in_name: np.ndarray, lengths: np.ndarray) -> Postings:
        """Postings sorted by term (unused terms dropped), with BM25 impacts per field."""
        used = np.bincount(term, minlength=len(terms)) > 0
        if not used.all():
            terms = terms.filter(pa.array(used))
            term = (np.cumsum(used) - 1)[term]
        order = np.argsort(term, kind="stable")
        term, docs, tf, in_name = term[order], docs[order], tf[order], in_name[order]
        offsets = np.zeros(len(terms) + 1, np.int64)
        np.cumsum(np.bincount(term, minlength=len(terms)), out=offsets[1:])
        impacts = np.empty(len(term), np.float64)
        size = lengths.shape[1]
        for field in (0, 1):
            mask = in_name == bool(field)
            df = np.bincount(term[mask], minlength=len(terms))
            idf = np.log1p((size - df + 0.5) / (df + 0.5))
            average = max(float(lengths[field].mean()), 1e-9) if size else 1.0
            field_tf = tf[mask].astype(np.float64)
            norm = K1 * (1 - B + B * lengths[field][docs[mask]] / average)
            impacts[mask] = idf[term[mask]] * field_tf * (K1 + 1) / (field_tf + norm)
        counts = np.bincount(term, weights=tf, minlength=len(terms)).astype(np.int64)
        return cls(terms, offsets, docs.astype(np.int32), tf.astype(np.int32), in_name,
                   impacts.astype(np.float32), counts, size, lengths.astype(np.int32))

    def to_table(self) -> pa.Table:
        """One row per term: its collection count and postings as lists (the list offsets
        are ``offsets``)."""
        offsets = pa.array(self.offsets, pa.int64())

        def lists(values: np.ndarray) -> pa.LargeListArray:
            return pa.LargeListArray.from_arrays(offsets, pa.array(values))

        return pa.table({"term": self.terms, "count": pa.array(self.counts, pa.int64()),
                         "docs": lists(self.docs), "tf": lists(self.tf),
                         "impacts": lists(self.impacts),
                         "in_name": lists(self.in_name.view(np.uint8))})

    @classmethod
    def from_table(cls, table: pa.Table, size: int, lengths: np.ndarray | None = None,
                   ) -> Postings:
        docs, tf, impacts, in_name = (table.column(name).combine_chunks()
                                      for name in ("docs", "tf", "impacts", "in_name"))
        return cls(table.column("term").combine_chunks(),
                   numeric_view(docs.offsets, np.int64), numeric_view(docs.values, np.int32),
                   numeric_view(tf.values, np.int32),
                   numeric_view(in_name.values, np.uint8).view(bool),
                   numeric_view(impacts.values, np.float32),
                   numeric_view(table.column("count"), np.int64), size, lengths)

    def scores(self, query_terms: list[str], name_weight: float) -> np.ndarray:
        """BM25 score of every document (zero where no term matches), the name field's
        part weighted by ``name_weight``."""
        ids = [self.vocabulary[t] for t in query_terms if t in self.vocabulary]
        if not ids:
            return np.zeros(self.size, np.float32)
        spans = [slice(self.offsets[i], self.offsets[i + 1]) for i in ids]
        docs = np.concatenate([self.docs[s] for s in spans])
        impacts = np.concatenate([self.impacts[s] for s in spans])
        impacts[np.concatenate([self.in_name[s] for s in spans])] *= name_weight
        return np.bincount(docs, weights=impacts, minlength=self.size).astype(np.float32)

    def top(self, query_terms: list[str], limit: int, name_weight: float,
            ) -> tuple[np.ndarray, np.ndarray]:
        """Documents with a positive score, best first (at most ``limit``), and their scores."""
        scores = self.scores(query_terms, name_weight)
        matched = np.flatnonzero(scores > 0)
        if len(matched) > limit:
            matched = matched[np.argpartition(-scores[matched], limit - 1)[:limit]]
        best = matched[np.argsort(-scores[matched], kind="stable")]
        return best, scores[best]


def _tokens(column: pa.ChunkedArray | pa.Array,
            ) -> tuple[pa.Array, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One field's (words, word index, doc, term frequency) entries, one per distinct
    (word, doc), and each doc's length in terms."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    size = len(column)
    tokens = pc.split_pattern(pc.fill_null(column, ""), " ")
    words, parents = pc.list_flatten(tokens), pc.list_parent_indices(tokens)
    present = pc.not_equal(words, "")
    words, parents = words.filter(present), parents.filter(present)
    encoded = pc.dictionary_encode(words)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    word = encoded.indices.to_numpy().astype(np.int64)
    doc = parents.to_numpy().astype(np.int64)
    lengths = np.bincount(doc, minlength=size)
    pairs, tf = np.unique(word * max(size, 1) + doc, return_counts=True)
    return encoded.dictionary, pairs // max(size, 1), pairs % max(size, 1), tf, lengths


def _entries(fields: list[tuple[pa.Array, np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
             terms: pa.Array, first_doc: int,
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The (term, doc, tf, in_name) entries and (2, docs) lengths of tokenized body and
    name fields, with term ids into ``terms`` and docs numbered from ``first_doc``."""
    term, docs, tf, in_name = [], [], [], []
    for field, (words, word, doc, counts, _) in enumerate(fields):
        remap = pc.index_in(words, value_set=terms).to_numpy(zero_copy_only=False)
        term.append(remap[word].astype(np.int64))
        docs.append(doc + first_doc)
        tf.append(counts)
        in_name.append(np.full(len(word), bool(field)))
    lengths = np.stack([fields[0][4], fields[1][4]])
    return (np.concatenate(term), np.concatenate(docs), np.concatenate(tf),
            np.concatenate(in_name), lengths)
