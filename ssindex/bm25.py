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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ssindex.store import numeric_view

K1, B = 1.2, 0.75
NAME_WEIGHT_NATURAL = 0.25
NAME_WEIGHT_IDENTIFIER = 2.0


@dataclass(frozen=True)
class Postings:
    vocabulary: dict[str, int]
    offsets: np.ndarray
    """Term t's postings are ``docs[offsets[t]:offsets[t + 1]]``."""
    docs: np.ndarray
    impacts: np.ndarray
    """BM25 contribution of the term to the doc within one field."""
    in_name: np.ndarray
    """Whether the posting is the name field's (else the body's)."""
    counts: np.ndarray
    """Collection frequency of each term over both fields (for ``ssindex.abstain``)."""
    size: int

    @classmethod
    def build(cls, body: pa.ChunkedArray | pa.Array, name: pa.ChunkedArray | pa.Array,
              ) -> Postings:
        """Postings of the documents (rows) of two fields of space-separated terms."""
        size = len(body)
        parts = [_field_postings(column, size) for column in (body, name)]
        vocabulary = pc.unique(pa.concat_arrays([words for words, *_ in parts]))
        terms, docs, impacts, tfs = [], [], [], []
        for words, term, doc, impact, tf in parts:
            remap = pc.index_in(words, vocabulary).to_numpy(zero_copy_only=False)
            terms.append(remap[term])
            docs.append(doc)
            impacts.append(impact)
            tfs.append(tf)
        term_ids = np.concatenate(terms)
        order = np.argsort(term_ids, kind="stable")
        offsets = np.zeros(len(vocabulary) + 1, np.int64)
        np.cumsum(np.bincount(term_ids, minlength=len(vocabulary)), out=offsets[1:])
        in_name = np.concatenate([np.zeros(len(terms[0]), bool), np.ones(len(terms[1]), bool)])
        return cls({word: i for i, word in enumerate(vocabulary.to_pylist())}, offsets,
                   np.concatenate(docs)[order].astype(np.int32),
                   np.concatenate(impacts)[order].astype(np.float32), in_name[order],
                   np.bincount(term_ids, weights=np.concatenate(tfs),
                               minlength=len(vocabulary)).astype(np.int64), size)

    def to_table(self) -> pa.Table:
        """One row per term: its collection count and postings as lists (the list offsets
        are ``offsets``)."""
        offsets = pa.array(self.offsets, pa.int64())

        def lists(values: np.ndarray) -> pa.LargeListArray:
            return pa.LargeListArray.from_arrays(offsets, pa.array(values))

        return pa.table({"term": pa.array(list(self.vocabulary), pa.string()),
                         "count": pa.array(self.counts, pa.int64()),
                         "docs": lists(self.docs), "impacts": lists(self.impacts),
                         "in_name": lists(self.in_name.view(np.uint8))})

    @classmethod
    def from_table(cls, table: pa.Table, size: int) -> Postings:
        docs, impacts, in_name = (table.column(name).combine_chunks()
                                  for name in ("docs", "impacts", "in_name"))
        return cls({word: i for i, word in enumerate(table.column("term").to_pylist())},
                   numeric_view(docs.offsets, np.int64), numeric_view(docs.values, np.int32),
                   numeric_view(impacts.values, np.float32),
                   numeric_view(in_name.values, np.uint8).view(bool),
                   numeric_view(table.column("count"), np.int64), size)

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


def _field_postings(column: pa.ChunkedArray | pa.Array, size: int,
                    ) -> tuple[pa.Array, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(vocabulary, term index, doc, impact, term frequency) of one field, one entry per
    (term, doc)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    tokens = pc.split_pattern(pc.fill_null(column, ""), " ")
    words, parents = pc.list_flatten(tokens), pc.list_parent_indices(tokens)
    present = pc.not_equal(words, "")
    words, parents = words.filter(present), parents.filter(present)
    encoded = pc.dictionary_encode(words).combine_chunks() if isinstance(
        words, pa.ChunkedArray) else pc.dictionary_encode(words)
    term = encoded.indices.to_numpy().astype(np.int64)
    doc = parents.to_numpy().astype(np.int64)
    lengths = np.bincount(doc, minlength=size).astype(np.float64)
    pairs, tf = np.unique(term * size + doc, return_counts=True)
    term, doc = pairs // size, pairs % size
    df = np.bincount(term, minlength=len(encoded.dictionary))
    idf = np.log1p((size - df + 0.5) / (df + 0.5))
    average = max(float(lengths.mean()), 1e-9) if size else 1.0
    norm = K1 * (1 - B + B * lengths[doc] / average)
    impact = idf[term] * tf * (K1 + 1) / (tf + norm)
    return encoded.dictionary, term, doc, impact, tf
