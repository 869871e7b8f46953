"""Dedupe: exact (normalized content hash) and near duplicates (MinHash-LSH).

Chunks arrive in path order, so the first chunk of a duplicate group (the one
with the smallest path and line) becomes its exemplar; later members record
``dup_of`` and reuse the exemplar's vector instead of being embedded.

Near duplicates: MinHash signatures over word 3-shingles (``stages.signature``), then
LSH banding, each candidate confirmed by its estimated Jaccard similarity, so
a banding false positive never marks a chunk as a duplicate.

The banding is written here rather than taken from ``datasketch.MinHashLSH``
because it runs over *every* chunk on every build, incremental ones included
(stored signatures are fed back in path order, so an incremental build reaches
the same verdicts as a clean one). Band keys are computed for a whole batch in
one numpy expression, which makes a re-dedupe of 60k chunks take a fraction of
a second instead of seconds. At the default threshold, 16 bands of 8 rows (128
permutations) find pairs at Jaccard 0.9 with probability > 0.999.

State grows with the exemplars: one hash entry, 16 band keys (12 bytes each,
``Buckets``) and a 512-byte signature each; 1M chunks cost about 0.8 GiB.

An incremental build replays only what its changes can reach
(``dedupe_changes``): on the standard library (62k chunks) one edited file
reaches a handful of chunks, where replaying all of them took seconds.

Distributed engines split the same decision in two: ``bucket_pairs`` runs
where an LSH bucket's members meet (a group-by on band key across workers),
and ``resolve_duplicates`` replays the streaming verdicts over the sparse
candidate pairs in path order, so a cluster reaches the local engine's
verdicts exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ssindex.config import DedupeConfig
from ssindex.records import Chunk, IndexedChunk, StoredChunks
from ssindex.stages.signature import Signer, band_keys, rows_per_band
from ssindex.util.arrays import binary_matrix, whole


@dataclass(slots=True)
class DedupeStats:
    exact: int = 0
    near: int = 0



class Buckets:
    """LSH buckets: which exemplars (by position) have each band key.

    Keys live in sorted numpy runs (12 B per key), merged as in a log-structured merge
    tree: a batch's new exemplars make one run, which takes in the runs before it while
    they are at most twice its size, so there are O(log n) runs and a key is copied
    O(log n) times. A dict of lists held ~150 B per key; kept for a batch's keys alone,
    filling it one key at a time still took a third of dedupe's time."""

    def __init__(self) -> None:
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []

    def members(self, keys: np.ndarray) -> list[set[int]]:
        """For each row of ``keys`` (rows, bands), the exemplars that share one of its
        keys."""
        found: list[set[int]] = [set() for _ in range(len(keys))]
        # searched in sorted order: numpy's binary search then starts where the last one
        # ended (a batch's 4,096 keys in the standard library's 1.1M: 0.73 -> 0.25 ms)
        order = np.argsort(keys.ravel())
        flat, rows = keys.ravel()[order], order // keys.shape[1]
        for run_keys, run_members in self._runs:
            left = np.searchsorted(run_keys, flat, "left")
            # most keys are in no run: only those that are are searched for twice
            hits = np.flatnonzero(run_keys[np.minimum(left, len(run_keys) - 1)] == flat)
            right = np.searchsorted(run_keys, flat[hits], "right")
            for at, end in zip(hits.tolist(), right.tolist(), strict=True):
                found[rows[at]].update(run_members[left[at]:end].tolist())
        return found

    def add(self, keys: np.ndarray, members: np.ndarray) -> None:
        """Add the keys (rows, bands) of the exemplars ``members`` (one per row)."""
        run = keys.ravel(), np.repeat(members.astype(np.int32), keys.shape[1])
        while self._runs and len(self._runs[-1][0]) <= 2 * len(run[0]):
            before = self._runs.pop()
            run = np.concatenate([before[0], run[0]]), np.concatenate([before[1], run[1]])
        order = np.argsort(run[0], kind="stable")
        self._runs.append((run[0][order], run[1][order]))


def _shared_with_earlier(keys: np.ndarray) -> np.ndarray:
    """Which rows of ``keys`` (rows, bands) share a key with an earlier row."""
    rows = np.repeat(np.arange(len(keys)), keys.shape[1])
    order = np.argsort(keys.ravel(), kind="stable")  # rows ascend within equal keys
    ordered, owners = keys.ravel()[order], rows[order]
    later = (ordered[1:] == ordered[:-1]) & (owners[1:] != owners[:-1])
    shared = np.zeros(len(keys), bool)
    shared[owners[1:][later]] = True
    return shared


class Deduper:
    """Streaming duplicate finder; feed batches in path order."""

    def __init__(self, cfg: DedupeConfig, near: bool = True) -> None:
        self._cfg = cfg
        self._near = near
        self.sign = Signer(cfg)
        self.rows_per_band = rows_per_band(cfg.near_threshold, cfg.num_perm)
        self._exact: dict[str, str] = {}
        self._buckets = Buckets()
        self._exemplar_ids: list[str] = []
        self._exemplar_signatures: list[np.ndarray] = []

    def classify(self, batch: list[IndexedChunk], stats: DedupeStats) -> None:
        """Set ``signature`` (when missing, and near duplicates are looked for) and
        ``dup_of`` on every row of ``batch``."""
        unsigned = [row for row in batch if row.signature is None and row.stored is None] \
            if self._near else []
        for row, signature in zip(unsigned, self.sign([row.chunk.text for row in unsigned]),
                                  strict=True):
            row.signature = signature
        signed = [i for i, row in enumerate(batch) if row.signature is not None]
        if not signed:
            for row in batch:
                row.dup_of = self._exact_verdict(row, stats)
            return
        keys = band_keys(np.stack([np.frombuffer(batch[i].signature or b"", np.uint32)
                                   for i in signed]), self.rows_per_band)
        key_row = dict(zip(signed, range(len(signed)), strict=True))
        earlier = self._buckets.members(keys)
        shared = _shared_with_earlier(keys)
        new: list[int] = []  # the key rows of this batch's exemplars, with positions after
        for index, row in enumerate(batch):
            at = key_row.get(index)
            row.dup_of = self._exact_verdict(row, stats)
            if row.dup_of is not None or at is None or row.signature is None:
                continue
            candidates = earlier[at]
            if shared[at] and new:
                kept = np.asarray(new)
                mine = np.isin(keys[kept], keys[at]).any(axis=1)
                first = len(self._exemplar_ids) - len(new)
                candidates = candidates | set((first + np.flatnonzero(mine)).tolist())
            row.dup_of = self._near_verdict(row.chunk, row.signature, candidates, stats)
            if row.dup_of is None:
                new.append(at)
        if new:
            first = len(self._exemplar_ids) - len(new)
            self._buckets.add(keys[new], np.arange(first, first + len(new)))

    def _exact_verdict(self, row: IndexedChunk, stats: DedupeStats) -> str | None:
        """The exemplar of the row's content hash; ``None`` for its first chunk."""
        chunk = row.chunk
        exemplar = self._exact.get(chunk.content_hash)
        if exemplar is not None:
            stats.exact += 1
            return exemplar
        self._exact[chunk.content_hash] = chunk.id
        return None

    def _near_verdict(self, chunk: Chunk, signed: bytes, candidates: set[int],
                      stats: DedupeStats) -> str | None:
        """The most similar of ``candidates`` at the threshold (the earliest on a tie);
        ``None`` makes the chunk an exemplar."""
        signature = np.frombuffer(signed, np.uint32)
        best: tuple[float, int] | None = None
        for candidate in candidates:
            similarity = float(np.mean(self._exemplar_signatures[candidate] == signature))
            if similarity >= self._cfg.near_threshold and (
                    best is None or (similarity, -candidate) > (best[0], -best[1])):
                best = (similarity, candidate)
        if best is not None:
            stats.near += 1
            exemplar = self._exemplar_ids[best[1]]
            self._exact[chunk.content_hash] = exemplar
            return exemplar
        self._exemplar_ids.append(chunk.id)
        self._exemplar_signatures.append(signature)
        return None


def dedupe(
    batches: Iterable[list[IndexedChunk]], cfg: DedupeConfig, stats: DedupeStats,
    near: bool = True,
) -> Iterator[list[IndexedChunk]]:
    """Mark each chunk's ``dup_of``; exemplars pass through with ``dup_of = None``.
    Without ``near``, only exact duplicates are found (rows carry no signature)."""
    deduper = Deduper(cfg, near)
    for batch in batches:
        deduper.classify(batch, stats)
        yield batch


class Changes(NamedTuple):
    rows: list[IndexedChunk]
    """The chunks whose verdict was replayed, in path order."""
    settled_exemplars: int
    """Stored exemplars whose verdict stands (nothing downstream sees them)."""


def dedupe_changes(fresh: list[IndexedChunk], order: list[str], cfg: DedupeConfig,
                   stats: DedupeStats, previous: StoredChunks) -> Changes:
    """``dedupe`` for an incremental build, replaying only the chunks a change can reach.

    ``fresh`` are the chunks of new and changed files; ``order`` lists every chunk
    id of the new index in path order, the others being stored chunks of unchanged
    files. A chunk's verdict depends on the earlier chunks sharing its content hash
    or an LSH band key, and on their verdicts. So only chunks linked, through chains
    of shared keys, to a fresh chunk or to a stored one that is gone can change
    verdict. That linked set is closed under sharing a key: replaying the streaming
    ``Deduper`` over it alone, in path order, gives the verdicts of a full replay.
    Every other stored chunk keeps its verdict, and is never made into an object."""
    deduper = Deduper(cfg)
    unsigned = [row for row in fresh if row.signature is None]
    for row, signature in zip(unsigned, deduper.sign([row.chunk.text for row in unsigned]),
                              strict=True):
        row.signature = signature
    by_id = {row.chunk.id: row for row in fresh}
    is_fresh = np.fromiter((i in by_id for i in order), bool, len(order))
    fresh = [by_id[i] for i in order if i in by_id]
    stored = np.array([previous.position[i] for i in order if i not in by_id], np.int64)
    table = previous.chunks
    slot = np.full(len(table), -1, np.int64)  # a stored row's place in ``order``; -1: gone
    slot[stored] = np.flatnonzero(~is_fresh)
    stored_owner, stored_key = _link_keys(table.column("content_hash"), table.column("minhash"),
                                          deduper.rows_per_band)
    fresh_owner, fresh_key = _link_keys(
        pa.array([row.chunk.content_hash for row in fresh], pa.string()),
        pa.array([row.signature for row in fresh], pa.binary()), deduper.rows_per_band)
    carried = slot[stored_owner] >= 0
    owner = np.concatenate([slot[stored_owner[carried]], np.flatnonzero(is_fresh)[fresh_owner]])
    key = np.concatenate([stored_key[carried], fresh_key])
    reached = _linked(owner, key, is_fresh, stored_key[~carried])
    replayed = iter(previous.materialize(stored[reached[~is_fresh]].tolist()))
    fresh_rows = iter(fresh)
    rows = [next(fresh_rows) if new else next(replayed)
            for new, hit in zip(is_fresh, reached, strict=True) if hit]
    deduper.classify(rows, stats)
    settled = ~reached[~is_fresh]
    settled_dups = pc.is_valid(table.column("dup_of").take(pa.array(stored[settled]))).to_numpy(
        zero_copy_only=False)
    # counted as the streaming deduper counts them: exact when the content came earlier
    content = np.empty(len(order), np.uint64)  # _link_keys puts content keys first
    content[~is_fresh] = stored_key[:len(table)][stored]
    content[is_fresh] = fresh_key[:len(fresh)]
    _, first, inverse = np.unique(content, return_index=True, return_inverse=True)
    repeated = (first[inverse] < np.arange(len(order)))[~is_fresh][settled]
    stats.exact += int(np.sum(settled_dups & repeated))
    stats.near += int(np.sum(settled_dups & ~repeated))
    return Changes(rows, int(np.sum(~settled_dups)))


def _link_keys(hashes: pa.Array | pa.ChunkedArray, signatures: pa.Array | pa.ChunkedArray,
               rows_per_band: int) -> tuple[np.ndarray, np.ndarray]:
    """What links chunks for dedupe, as (owner, key) pairs: first each chunk's position
    with a key for its content hash, then one pair per LSH band of each signature.
    Read from Arrow buffers: this runs over every stored chunk of an incremental build."""
    hashes, signatures = whole(hashes), whole(signatures)
    count = len(hashes)
    if not count:
        return np.zeros(0, np.int64), np.zeros(0, np.uint64)
    # content hashes are hex xxh3 digests: their first 16 digits are a fine 64-bit key
    digits = binary_matrix(hashes.cast(pa.binary()))[:, :16].astype(np.uint64)
    digits -= np.where(digits >= ord("a"), ord("a") - 10, ord("0")).astype(np.uint64)
    exact = (digits << np.arange(60, -1, -4, dtype=np.uint64)).sum(axis=1, dtype=np.uint64)
    owners, keys = [np.arange(count)], [exact]
    signed = np.flatnonzero(pc.is_valid(signatures).to_numpy(zero_copy_only=False))
    if len(signed):
        matrix = binary_matrix(signatures.filter(pc.is_valid(signatures))).view(np.uint32)
        bands = band_keys(matrix, rows_per_band)
        owners.append(np.repeat(signed, bands.shape[1]))
        keys.append(bands.ravel())
    return np.concatenate(owners), np.concatenate(keys)


def _linked(owner: np.ndarray, key: np.ndarray, seeds: np.ndarray,
            seed_keys: np.ndarray) -> np.ndarray:
    """Mask of the chunks sharing a key, directly or through other chunks, with a
    ``seeds`` chunk (a mask) or one of ``seed_keys``."""
    # only keys held twice, or also by a seed key, link anything: the walk below then
    # runs over a few thousand pairs instead of a million
    ordered = np.sort(key)
    linking = np.unique(np.concatenate([ordered[1:][ordered[1:] == ordered[:-1]], seed_keys]))
    reached = seeds.copy()
    if not len(linking):
        return reached
    useful = _members(key, linking)
    owner, key = owner[useful], key[useful]
    frontier = np.union1d(key[reached[owner]], seed_keys)
    while len(frontier):
        linked = np.unique(owner[np.isin(key, frontier)])
        linked = linked[~reached[linked]]
        reached[linked] = True
        frontier = np.unique(key[np.isin(owner, linked)])
    return reached


def _members(values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Mask of the ``values`` in ``keys`` (sorted, uniformly spread 64-bit keys). A bitmap
    of low bits screens the values first: binary-searching each of the million keys of
    the standard library's chunks took ~0.1 s."""
    low = np.uint64((1 << 22) - 1)
    bitmap = np.zeros(1 << 22, bool)
    bitmap[keys & low] = True
    maybe = np.flatnonzero(bitmap[values & low])
    found = np.minimum(np.searchsorted(keys, values[maybe]), len(keys) - 1)
    mask = np.zeros(len(values), bool)
    mask[maybe[keys[found] == values[maybe]]] = True
    return mask


class Candidate(NamedTuple):
    """An earlier chunk (by path order) that a later one may duplicate."""

    later: int
    earlier: int
    earlier_id: str
    similarity: float


def bucket_pairs(ordinals: np.ndarray, ids: list[str], signatures: np.ndarray,
                 threshold: float) -> list[Candidate]:
    """The pairs of one LSH bucket whose estimated Jaccard similarity reaches ``threshold``."""
    order = np.argsort(ordinals, kind="stable")
    pairs: list[Candidate] = []
    for rank in range(1, len(order)):
        later = order[rank]
        earlier = order[:rank]
        similarity = np.mean(signatures[earlier] == signatures[later], axis=1)
        for index in np.flatnonzero(similarity >= threshold):
            pairs.append(Candidate(int(ordinals[later]), int(ordinals[earlier[index]]),
                                   ids[earlier[index]], float(similarity[index])))
    return pairs


def resolve_duplicates(exact: dict[int, tuple[int, str]], candidates: Iterable[Candidate],
                       stats: DedupeStats) -> dict[int, str]:
    """``dup_of`` by chunk ordinal, as the streaming ``Deduper`` decides it.

    ``exact`` maps a chunk to the first chunk with its normalized hash (the only
    one of the group that took part in LSH); ``candidates`` are the LSH pairs of
    those first chunks. A chunk duplicates its most similar earlier candidate that
    is itself an exemplar (ties: the earliest), so verdicts are replayed in order."""
    by_later: dict[int, dict[int, tuple[float, str]]] = {}
    for pair in candidates:
        by_later.setdefault(pair.later, {})[pair.earlier] = (pair.similarity, pair.earlier_id)
    dup_of: dict[int, str] = {}
    for later in sorted(by_later):
        exemplars = [(similarity, -earlier, earlier_id) for earlier, (similarity, earlier_id)
                     in by_later[later].items() if earlier not in dup_of]
        if exemplars:
            dup_of[later] = max(exemplars)[2]
            stats.near += 1
    for later, (first, first_id) in exact.items():
        dup_of[later] = dup_of.get(first, first_id)
        stats.exact += 1
    return dup_of
