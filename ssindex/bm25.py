"""In-memory BM25 over the analyzed columns, for the lexical leg of warm searches.

Written here rather than queried from Lance's full-text index because of
latency: on 2 cores at 100,000 chunks a Lance multi-field FTS query took
~30 ms, while summing precomputed impacts with ``np.bincount`` takes ~1.5 ms,
and the whole search has a 10 ms budget. A build computes the postings once
per committed version (``to_table``, an Arrow manifest beside the index);
searches load them in milliseconds.

Scoring is the classic per-field BM25 (k1 = 1.2, b = 0.75, Lucene's idf),
summed over fields with the name field boosted ×2, as the FTS query asks of
Lance. The terms are the analyzer's (``ssindex.lexical``), split on spaces,
exactly what Lance's whitespace tokenizer indexes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

K1, B = 1.2, 0.75
FIELD_BOOSTS = (1.0, 2.0)
"""Body, then name: the same boosts the Lance FTS query uses."""


@dataclass(frozen=True)
class Postings:
    vocabulary: dict[str, int]
    offsets: np.ndarray
    """Term t's postings are ``docs[offsets[t]:offsets[t + 1]]``."""
    docs: np.ndarray
    impacts: np.ndarray
    """BM25 contribution of the term to the doc, boosts applied."""
    size: int

    @classmethod
    def build(cls, fields: list[pa.ChunkedArray | pa.Array]) -> Postings:
        """Postings of the documents (rows) of ``fields``, which are space-separated terms."""
        size = len(fields[0])
        parts = [_field_postings(column, size, boost)
                 for column, boost in zip(fields, FIELD_BOOSTS, strict=True)]
        vocabulary = pc.unique(pa.concat_arrays([words for words, *_ in parts]))
        terms, docs, impacts = [], [], []
        for words, term, doc, impact in parts:
            remap = pc.index_in(words, vocabulary).to_numpy(zero_copy_only=False)
            terms.append(remap[term])
            docs.append(doc)
            impacts.append(impact)
        term_ids = np.concatenate(terms)
        order = np.argsort(term_ids, kind="stable")
        offsets = np.zeros(len(vocabulary) + 1, np.int64)
        np.cumsum(np.bincount(term_ids, minlength=len(vocabulary)), out=offsets[1:])
        return cls({word: i for i, word in enumerate(vocabulary.to_pylist())}, offsets,
                   np.concatenate(docs)[order].astype(np.int32),
                   np.concatenate(impacts)[order].astype(np.float32), size)

    def to_table(self) -> pa.Table:
        """One row per term: its postings as lists (the list offsets are ``offsets``)."""
        offsets = pa.array(self.offsets, pa.int64())
        return pa.table({
            "term": pa.array(list(self.vocabulary), pa.string()),
            "docs": pa.LargeListArray.from_arrays(offsets, pa.array(self.docs)),
            "impacts": pa.LargeListArray.from_arrays(offsets, pa.array(self.impacts)),
        })

    @classmethod
    def from_table(cls, table: pa.Table, size: int) -> Postings:
        docs = table.column("docs").combine_chunks()
        impacts = table.column("impacts").combine_chunks()
        return cls({word: i for i, word in enumerate(table.column("term").to_pylist())},
                   docs.offsets.to_numpy(), docs.values.to_numpy(), impacts.values.to_numpy(),
                   size)

    def scores(self, query_terms: list[str]) -> np.ndarray:
        """BM25 score of every document (zero where no term matches)."""
        ids = [self.vocabulary[t] for t in query_terms if t in self.vocabulary]
        if not ids:
            return np.zeros(self.size, np.float32)
        spans = [slice(self.offsets[i], self.offsets[i + 1]) for i in ids]
        docs = np.concatenate([self.docs[s] for s in spans])
        impacts = np.concatenate([self.impacts[s] for s in spans])
        return np.bincount(docs, weights=impacts, minlength=self.size).astype(np.float32)

    def top(self, query_terms: list[str], limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Documents with a positive score, best first (at most ``limit``), and their scores."""
        scores = self.scores(query_terms)
        matched = np.flatnonzero(scores > 0)
        if len(matched) > limit:
            matched = matched[np.argpartition(-scores[matched], limit - 1)[:limit]]
        best = matched[np.argsort(-scores[matched], kind="stable")]
        return best, scores[best]


def _field_postings(column: pa.ChunkedArray | pa.Array, size: int, boost: float,
                    ) -> tuple[pa.Array, np.ndarray, np.ndarray, np.ndarray]:
    """(vocabulary, term index, doc, impact) of one field, one entry per (term, doc)."""
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
    impact = boost * idf[term] * tf * (K1 + 1) / (tf + norm)
    return encoded.dictionary, term, doc, impact
