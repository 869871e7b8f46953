"""Embedded, quantized chunks → Arrow record batches in the store's schema."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from ssindex.index.layout import CHUNK_SCHEMA, row_digest
from ssindex.records import Chunk, IndexedChunk
from ssindex.stages.embed import embed_key
from ssindex.text.lexical import analyze, exact_symbol_term


def name_terms(path: str, symbol: str) -> str:
    """What the lexical leg's name field indexes: the symbol, the path's parts, and the
    exact symbol name as one ``sym:`` token (see ``ssindex.text.lexical.exact_symbol_term``)."""
    words = analyze(f"{symbol} {path.replace('/', ' ').replace('.', ' ')}")
    return f"{words} {exact_symbol_term(symbol)}"


def lexical_terms(chunk: Chunk) -> tuple[str, str]:
    """What the lexical leg indexes of a chunk: its body's terms and its name's."""
    return analyze(chunk.text), name_terms(chunk.path, chunk.symbol)


def fixed_fields(row: IndexedChunk, model_key: str) -> dict[str, Any]:
    """The stored fields of a fresh chunk that it fixes alone (``FIXED_FIELDS``)."""
    chunk = row.chunk
    record = {
        "id": chunk.id, "path": chunk.path, "language": chunk.language,
        "start_line": chunk.start_line, "end_line": chunk.end_line,
        "symbol": chunk.symbol, "kind": chunk.kind, "text": chunk.text,
        "content_hash": chunk.content_hash, "file_hash": chunk.file_hash,
        "embed_key": row.key or embed_key(chunk, model_key), "minhash": row.signature,
    }
    record["lex_body"], record["lex_name"] = row.terms or lexical_terms(chunk)
    return record


def _record(row: IndexedChunk, code: bytes | None, scale: float | None, model_key: str,
            ) -> dict[str, Any]:
    if row.stored is None:
        record, fixed = fixed_fields(row, model_key), row.digest
    else:
        record, fixed = dict(row.stored), None
    record.update(dup_of=row.dup_of, vec_codes=code, vec_scale=scale)
    record["row_digest"] = row_digest(record, fixed)
    return record


def _unchanged(row: IndexedChunk, code: bytes | None, scale: float | None) -> bool:
    stored = row.stored
    return stored is not None and stored["dup_of"] == row.dup_of and (
        stored["vec_codes"] == code and stored["vec_scale"] == scale)


def to_record_batch(batch: list[IndexedChunk], codes: np.ndarray, scales: np.ndarray,
                    model_key: str) -> pa.RecordBatch | None:
    """The rows of ``batch`` that differ from the previous index (``None`` if none do).
    A NaN scale marks a row without a vector (``stages.quantize``): it stores null codes
    and scale."""
    records = []
    for row, code_row, scale in zip(batch, codes, scales, strict=True):
        code, value = (None, None) if np.isnan(scale) else (code_row.tobytes(), float(scale))
        if not _unchanged(row, code, value):
            records.append(_record(row, code, value, model_key))
    return pa.RecordBatch.from_pylist(records, schema=CHUNK_SCHEMA) if records else None
