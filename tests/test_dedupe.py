from __future__ import annotations

from ssindex.config import DedupeConfig
from ssindex.rows import Chunk, IndexedChunk
from ssindex.stages.chunk import chunk_id, normalized_hash
from ssindex.stages.dedupe import DedupeStats, dedupe

from .conftest import STDLIB


def _chunk(path: str, text: str) -> Chunk:
    digest = normalized_hash(text)
    return Chunk(chunk_id(path, 1, text.count("\n") + 1, digest), path, "python", 1,
                 text.count("\n") + 1, "m", "module", text, digest, "f")


def _verdicts(chunks: list[Chunk], **cfg: object) -> tuple[list[str | None], DedupeStats]:
    stats = DedupeStats()
    batches = [[IndexedChunk(c) for c in chunks]]
    rows = [r for batch in dedupe(batches, DedupeConfig(**cfg), stats) for r in batch]  # type: ignore[arg-type]
    return [r.dup_of for r in rows], stats


def test_exact_duplicates_ignore_whitespace() -> None:
    text = (STDLIB / "json" / "decoder.py").read_text()[:2000]
    a, b = _chunk("a.py", text), _chunk("b.py", text.replace("    ", "\t"))
    verdicts, stats = _verdicts([a, b])
    assert verdicts == [None, a.id] and stats.exact == 1


def test_near_duplicates_found_and_distinct_code_kept() -> None:
    text = (STDLIB / "json" / "decoder.py").read_text()[:3000]
    edited = text.replace("JSONDecodeError", "JSONDecodeErr", 1)
    other = (STDLIB / "json" / "encoder.py").read_text()[:3000]
    a, b, c = _chunk("a.py", text), _chunk("b.py", edited), _chunk("c.py", other)
    verdicts, stats = _verdicts([a, b, c])
    assert verdicts == [None, a.id, None] and stats.near == 1


def test_threshold_is_respected() -> None:
    words = [f"token{i}" for i in range(200)]
    base = " ".join(words)
    half = " ".join(words[:100] + [f"other{i}" for i in range(100)])
    a, b = _chunk("a.py", base), _chunk("b.py", half)
    assert _verdicts([a, b])[0] == [None, None]
    assert _verdicts([a, b], near_threshold=0.2)[0] == [None, a.id]


def test_band_keys_match_only_equal_bands() -> None:
    import numpy as np

    from ssindex.stages.dedupe import band_keys

    rng = np.random.default_rng(0)
    a = rng.integers(0, 2**32, size=128, dtype=np.uint64).astype(np.uint32)
    b = a.copy()
    b[:8] += 1  # first band differs, the other 15 agree
    keys = band_keys(np.stack([a, b]))
    assert keys.shape == (2, 16)
    assert keys[0, 0] != keys[1, 0] and np.array_equal(keys[0, 1:], keys[1, 1:])
    assert len(set(keys[0].tolist())) == 16
