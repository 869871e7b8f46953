"""Embedded, quantized chunks → Arrow record batches in the store's schema."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ssindex.lexical import analyze
from ssindex.rows import IndexedChunk
from ssindex.stages.embed import embed_key
from ssindex.store import CHUNK_SCHEMA, row_digest


def name_terms(path: str, symbol: str) -> str:
    """What the lexical leg's name field indexes: the symbol and the path's parts."""
    return analyze(f"{symbol} {path.replace('/', ' ').replace('.', ' ')}")


def to_record_batch(
    batch: list[IndexedChunk], codes: np.ndarray, scales: np.ndarray, model_key: str
) -> pa.RecordBatch:
    rows = []
    for row, code, scale in zip(batch, codes, scales, strict=True):
        chunk = row.chunk
        record = {
            "id": chunk.id, "path": chunk.path, "language": chunk.language,
            "start_line": chunk.start_line, "end_line": chunk.end_line,
            "symbol": chunk.symbol, "kind": chunk.kind, "text": chunk.text,
            "dup_of": row.dup_of, "content_hash": chunk.content_hash,
            "file_hash": chunk.file_hash, "embed_key": embed_key(chunk, model_key),
            "vec_codes": code.tobytes(), "vec_scale": float(scale),
            "lex_body": analyze(chunk.text), "lex_name": name_terms(chunk.path, chunk.symbol),
        }
        record["row_digest"] = row_digest(record)
        rows.append(record)
    return pa.RecordBatch.from_pylist(rows, schema=CHUNK_SCHEMA)
