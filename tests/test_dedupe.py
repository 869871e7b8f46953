from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pytest

from ssindex.config import ChunkConfig, DedupeConfig, WalkConfig
from ssindex.records import Chunk, IndexedChunk, SourceFile
from ssindex.stages.chunk import chunk_file, chunk_id, normalized_hash
from ssindex.stages.dedupe import (
    Buckets,
    DedupeStats,
    bucket_pairs,
    dedupe,
    dedupe_changes,
    resolve_duplicates,
)
from ssindex.stages.signature import Signer, affine_permutations, band_keys, rows_per_band
from ssindex.stages.walk import WalkStats, walk

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


class _Stored:
    """A previous index's rows in memory (``ssindex.records.StoredChunks``)."""

    def __init__(self, chunks: pa.Table, source: list[Chunk]) -> None:
        self.chunks = chunks
        self.position = {c.id: i for i, c in enumerate(source)}
        self._rows = [IndexedChunk(c, stored={"dup_of": v}, signature=m) for c, v, m in zip(
            source, chunks.column("dup_of").to_pylist(), chunks.column("minhash").to_pylist(),
            strict=True)]

    def carried(self, source: SourceFile) -> list[str] | None:
        raise NotImplementedError  # dedupe never asks

    def materialize(self, positions: Sequence[int]) -> list[IndexedChunk]:
        return [self._rows[p] for p in positions]


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

    from ssindex.stages.signature import band_keys

    rng = np.random.default_rng(0)
    a = rng.integers(0, 2**32, size=128, dtype=np.uint64).astype(np.uint32)
    b = a.copy()
    b[:8] += 1  # first band differs, the other 15 agree
    keys = band_keys(np.stack([a, b]))
    assert keys.shape == (2, 16)
    assert keys[0, 0] != keys[1, 0] and np.array_equal(keys[0, 1:], keys[1, 1:])
    assert len(set(keys[0].tolist())) == 16


def _json_with_copies() -> list[Chunk]:
    """The chunks of the stdlib's ``json``, then a near copy of a near copy (the second
    must match the first exemplar, not chain), an exact copy of a near copy, and
    whitespace-only copies."""
    chunks = [c for source in walk(STDLIB / "json", WalkConfig(), WalkStats())
              for c in chunk_file(source, ChunkConfig())[0]]
    base = max(chunks, key=lambda c: len(c.text)).text
    near = base.replace("self", "this", 1)
    nearer = near.replace("self", "this", 1)
    return [*chunks, _chunk("z1.py", near), _chunk("z2.py", nearer),
            _chunk("z3.py", near + "\n"), _chunk("z4.py", base.replace("    ", "\t"))]


@pytest.mark.parametrize("size", [1, 7, 64])
def test_verdicts_do_not_depend_on_batch_boundaries(size: int) -> None:
    """Within a batch, exemplars are found among its earlier rows; across batches, in
    ``Buckets``' merged runs: either way a chunk meets the same earlier exemplars."""
    chunks = _json_with_copies()
    expected, stats = _verdicts(chunks)  # one batch
    batched = DedupeStats()
    batches = [[IndexedChunk(c) for c in chunks[i:i + size]] for i in range(0, len(chunks), size)]
    rows = [r for batch in dedupe(batches, DedupeConfig(), batched) for r in batch]
    assert [r.dup_of for r in rows] == expected
    assert (batched.exact, batched.near) == (stats.exact, stats.near) and stats.near >= 2


def test_buckets_find_every_member_of_a_key_across_runs() -> None:
    buckets = Buckets()
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 50, size=(300, 4)).astype(np.uint64)  # many shared keys
    for start in range(0, 300, 7):
        buckets.add(keys[start:start + 7], np.arange(start, min(start + 7, 300)))
    assert len(buckets._runs) < 12
    probe = rng.integers(0, 60, size=(20, 4)).astype(np.uint64)
    found = buckets.members(probe)
    for row, members in zip(probe, found, strict=True):
        assert members == {m for m in range(300) if np.isin(keys[m], row).any()}


def test_bucket_replay_reaches_the_streaming_verdicts() -> None:
    """The distributed form (LSH buckets anywhere, then a replay in path order) must
    equal the streaming deduper on real code with chains of near and exact copies."""
    cfg = DedupeConfig()
    chunks = _json_with_copies()
    expected, stats = _verdicts(chunks)

    sign = Signer(cfg)
    signatures = sign([c.text for c in chunks])
    first: dict[str, int] = {}
    exact = {}
    for ordinal, c in enumerate(chunks):
        earlier = first.setdefault(c.content_hash, ordinal)
        if earlier != ordinal:
            exact[ordinal] = (earlier, chunks[earlier].id)
    buckets: dict[int, list[int]] = {}
    signed = [i for i in first.values() if signatures[i] is not None]
    matrix = np.stack([np.frombuffer(signatures[i] or b"", np.uint32) for i in signed])
    for i, keys in zip(signed, band_keys(matrix, rows_per_band(cfg.near_threshold,
                                                                cfg.num_perm)), strict=True):
        for key in keys.tolist():
            buckets.setdefault(key, []).append(i)
    pairs = [pair for members in buckets.values() for pair in bucket_pairs(
        np.array(members[::-1]), [chunks[i].id for i in members[::-1]],
        np.stack([np.frombuffer(signatures[i] or b"", np.uint32) for i in members[::-1]]),
        cfg.near_threshold)]
    replay_stats = DedupeStats()
    verdicts = resolve_duplicates(exact, pairs, replay_stats)
    assert [verdicts.get(i) for i in range(len(chunks))] == expected
    assert (replay_stats.exact, replay_stats.near) == (stats.exact, stats.near)
    assert stats.near >= 2 and stats.exact >= 2


@pytest.mark.parametrize("change", ["exemplar deleted", "near copy sorts first",
                                    "exemplar rewritten"])
def test_incremental_replay_reaches_the_streaming_verdicts(change: str) -> None:
    """``dedupe_changes`` replays only the chunks a change reaches: its verdicts and
    counts must equal a full streaming dedupe of the new tree."""
    cfg = DedupeConfig()
    chunks = [c for source in walk(STDLIB / "json", WalkConfig(), WalkStats())
              for c in chunk_file(source, ChunkConfig())[0]]
    largest = max(chunks, key=lambda c: len(c.text))
    near = largest.text.replace("self", "this", 1)
    old = [*chunks, _chunk("z1.py", largest.text), _chunk("z2.py", near),
           _chunk("z3.py", near + "\n"), _chunk("z4.py", largest.text.replace("    ", "\t"))]
    old_verdicts, _ = _verdicts(old)
    sign = Signer(cfg)
    minhashes = sign([c.text for c in old])
    previous = _Stored(pa.table({"id": [c.id for c in old],
                                 "content_hash": [c.content_hash for c in old],
                                 "minhash": minhashes, "dup_of": old_verdicts}), old)
    stored = {c.id: v for c, v in zip(old, old_verdicts, strict=True)}
    if change == "exemplar deleted":  # z1 must take over as exemplar of its copies
        new = [c for c in old if c.path != largest.path]
    elif change == "near copy sorts first":
        new = [_chunk("a0.py", largest.text.replace("self", "me", 1)), *old]
    else:
        unrelated = (STDLIB / "json" / "tool.py").read_text()
        new = [_chunk(c.path, unrelated) if c.id == largest.id else c for c in old]
    expected, expected_stats = _verdicts(new)
    stats = DedupeStats()
    changes = dedupe_changes([IndexedChunk(c) for c in new if c.id not in stored],
                             [c.id for c in new], cfg, stats, previous)
    replayed = {r.chunk.id: r.dup_of for r in changes.rows}
    assert [r.chunk.id for r in changes.rows] == [c.id for c in new if c.id in replayed]
    assert len(replayed) < len(new) / 2  # only what the change reaches
    verdicts = [replayed[c.id] if c.id in replayed else stored[c.id] for c in new]
    assert verdicts == expected
    assert (stats.exact, stats.near) == (expected_stats.exact, expected_stats.near)
    assert changes.settled_exemplars == sum(
        1 for c in new if c.id not in replayed and stored[c.id] is None)
    carried = [v for c, v in zip(old, old_verdicts, strict=True) if c.id in {n.id for n in new}]
    assert [v for c, v in zip(new, expected, strict=True) if c.id in stored] != carried


def test_permutations_are_datasketchs() -> None:
    """The signer draws datasketch's affine32 permutations itself (importing datasketch
    costs every worker a third of a second): they must be datasketch's, bit for bit."""
    from datasketch import MinHash

    for num_perm in (1, 16, 128, 256):
        template = MinHash(num_perm=num_perm, scheme="affine32")
        drawn = affine_permutations(num_perm)
        for ours, theirs in zip(drawn, template.permutations, strict=True):
            assert ours.dtype == np.uint32 and np.array_equal(ours, theirs), num_perm


def test_signatures_are_datasketchs_minhashes() -> None:
    """The batched signer must give each text exactly the MinHash datasketch gives its
    shingles, whatever block boundaries fall between texts; short texts get none."""
    import xxhash
    from datasketch import MinHash

    cfg = DedupeConfig()
    texts = [c.text for source in walk(STDLIB / "json", WalkConfig(), WalkStats())
             for c in chunk_file(source, ChunkConfig())[0]]
    texts += ["x = 1", "", "ünïcode wörds ÄND MORE wörds " * 40]
    sign = Signer(cfg)
    sign.BLOCK = 64  # many blocks, and texts larger than one
    template = MinHash(num_perm=cfg.num_perm)
    expected: list[bytes | None] = []
    for text in texts:
        words = re.findall(r"\w+", text.lower())
        if len(words) < cfg.min_tokens:
            expected.append(None)
            continue
        minhash = MinHash(num_perm=cfg.num_perm, hashfunc=xxhash.xxh32_intdigest,
                          permutations=template.permutations, scheme=template.scheme)
        minhash.update_batch([" ".join(words[i:i + cfg.shingle_size]).encode()
                              for i in range(len(words) - cfg.shingle_size + 1)])
        expected.append(minhash.hashvalues.astype(np.uint32).tobytes())
    assert sum(e is None for e in expected) >= 2 and len(texts) > 50
    assert sign(texts) == expected
    assert [sign([text])[0] for text in texts[:20]] == expected[:20]
    few = DedupeConfig(min_tokens=1)  # fewer words than a shingle: datasketch's empty MinHash
    empty = template.hashvalues.astype(np.uint32).tobytes()
    assert Signer(few)(["two words", "one"]) == [empty, empty]
