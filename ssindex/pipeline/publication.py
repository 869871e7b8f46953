"""Partial versions of a progressive build: more rows dense-searchable every few seconds.

A progressive build first commits a lexical version (every row, BM25 postings,
no vector: ``build --no-embed``, but with exact duplicates alone marked: see
``BuildPlan.near_duplicates``), then embeds. While it embeds, the ``Publisher``
receives each checkpointed batch of vectors and, every ``commit.every_seconds``
or ``commit.every_chunks``, publishes a new version: the lexical version's rows
and postings with a new snapshot whose ``vec_codes`` hold every vector made so
far (duplicates take their exemplar's; a near duplicate shows its vector from the
finished version on), named ``search-vN-pK.arrow``, and a new
``HEAD.json`` naming it with its ``dense_coverage``. Only a snapshot is written:
the Lance table, the postings and the build manifest stay the lexical version's,
so a partial version costs one file write, and the build's last commit
(an ordinary one) equals a build that never published any.

A reader of a version with rows still to embed memory-maps all its files as it
opens (``Searcher``), so removing them cannot take them from a reader that
holds them, and one that read ``HEAD.json`` just before it moved opens the new
head instead. So partial snapshots before the last two are removed as the build
goes (the snapshot they are made from, read anew for each, stays), and the
finished build removes the rest with the lexical version's files and table
version: many versions do not grow the index.
"""

from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
import pyarrow as pa

from ssindex.codec import (
    code_width,
    embedded_mask,
    embedded_share,
    quantize_matrix,
    stored_codes,
)
from ssindex.index.integrity import checksums
from ssindex.index.layout import TABLE, IndexDir
from ssindex.pipeline.previous import PreviousIndex
from ssindex.pipeline.staging import Staging
from ssindex.util.arrays import binary_rows


class Publisher:
    """Publishes partial versions of the committed lexical version ``previous``."""

    def __init__(self, index: IndexDir, previous: PreviousIndex, every_seconds: float,
                 every_chunks: int) -> None:
        head = previous.head.data
        self.index, self.head = index, dict(head)
        self.every_seconds, self.every_chunks = every_seconds, every_chunks
        self._source = head["snapshot"]
        """The snapshot whose rows each partial version shows with the vectors so far."""
        rows = index.read_manifest(self._source, mmap=True)  # unmapped when done here
        ids = previous.chunks.column("id").to_pylist()
        key_of = dict(zip(ids, previous.chunks.column("embed_key").to_pylist(), strict=True))
        exemplar = dict(zip(ids, previous.chunks.column("dup_of").to_pylist(), strict=True))
        # the key whose vector each snapshot row shows: its own, or its exemplar's; codes
        # are kept once a key, in arrays (a dict of bytes took ~600 B a row)
        keys = np.array([key_of[exemplar[row_id] or row_id].encode()
                         for row_id in rows.column("id").to_pylist()])
        self._keys, self._slot = np.unique(keys, return_inverse=True)
        method, dim = head["quantization"], previous.head.dim
        self._codes = np.zeros((len(self._keys), code_width(method, dim)), np.uint8)
        self._scales = np.zeros(len(self._keys), np.float32)
        self._have = np.zeros(len(self._keys), bool)
        present = embedded_mask(rows)
        held = np.arange(len(keys)) if present is None else np.flatnonzero(present)
        if len(held):  # vectors the snapshot holds: a killed build's partial version
            codes, scales = stored_codes(rows, method, dim)
            self._store(self._slot[held], codes[held], scales[held])
        self.published: list[str] = []
        """This build's partial snapshots still on disk (the source stays to the end)."""
        self._pending = 0
        self._last = time.monotonic()
        earlier = index.path.glob(f"manifests/search-v{head['table_version']}-p*.arrow")
        self._number = max((int(path.stem.rsplit("-p", 1)[1]) for path in earlier), default=0)
        """The last partial version's number on this lexical version (a killed build's, too)."""
        self.commits = 0
        """Partial versions this build published."""

    def seed(self, staging: Staging) -> None:
        """Vectors a killed build checkpointed: the first partial version shows them."""
        found = staging.lookup([key.decode() for key in self._keys])
        if found:
            self.add(list(found), np.stack(list(found.values())), publish=False)

    def add(self, keys: list[str], vectors: np.ndarray, publish: bool = True) -> None:
        """Freshly embedded vectors; publishes a version when one is due."""
        codes, scales = quantize_matrix(vectors, self.head["quantization"])
        wanted = np.array([key.encode() for key in keys])
        slots = np.searchsorted(self._keys, wanted).clip(max=len(self._keys) - 1)
        shown = self._keys[slots] == wanted  # a key no snapshot row shows is not kept
        self._store(slots[shown], codes[shown], scales[shown])
        self._pending += len(keys)
        due = (time.monotonic() - self._last >= self.every_seconds
               or self._pending >= self.every_chunks)
        if publish and due:
            self.publish()

    def _store(self, slots: np.ndarray, codes: np.ndarray, scales: np.ndarray) -> None:
        self._codes[slots], self._scales[slots], self._have[slots] = codes, scales, True

    def publish(self) -> None:
        """Commit a partial version with every vector received so far. The source
        snapshot is read and written a record batch at a time: a pass over the whole
        mapped file kept its pages (~45 MB of the standard library's) resident to the
        build's end, beside every row's codes built at once."""
        self.commits += 1
        self._number += 1
        name = f"search-v{self.head['table_version']}-p{self._number:04d}.arrow"
        schema, _, blocks = self.index.manifest_batches(self._source)
        start = 0
        with self.index.manifest_writer(name, schema) as writer:
            for block in blocks:
                writer.write_batch(self._shown(block, start))
                start += block.num_rows
        coverage = embedded_share(int(self._have[self._slot].sum()), len(self._slot))
        recorded = {path: digest for path, digest in self.head["checksums"].items()
                    if path != f"manifests/{self.head['snapshot']}"}
        self.head.update(snapshot=name, dense_coverage=coverage,
                         checksums=recorded | checksums(self.index, [f"manifests/{name}"], {}))
        self.index.write_head(self.head)
        self.published.append(name)
        for old in self.published[:-2]:  # the one before stays for readers that hold it
            (self.index.path / "manifests" / old).unlink(missing_ok=True)
        self.published = self.published[-2:]
        self._pending, self._last = 0, time.monotonic()

    def _shown(self, block: pa.RecordBatch, start: int) -> pa.RecordBatch:
        """``block``, the source snapshot's rows from ``start`` on, with their vectors so
        far (null where none came yet)."""
        slot = self._slot[start : start + block.num_rows]
        present = self._have[slot]
        vectors = {"vec_codes": binary_rows(self._codes[slot[present]], present),
                   "vec_scale": pa.array(self._scales[slot], pa.float32(), mask=~present)}
        for column, values in vectors.items():
            at = block.schema.get_field_index(column)
            block = block.set_column(at, block.schema.field(at), values)
        return block

    def finish(self) -> None:
        """After the finished version's commit: remove the lexical and partial versions."""
        lexical = self.head["table_version"]
        for name in (*self.published, self._source, f"v{lexical}.arrow",
                     f"postings-v{lexical}.arrow", f"search-v{lexical}.arrow"):
            (self.index.path / "manifests" / name).unlink(missing_ok=True)
        # readers never open the table (their search files are beside it), and this build
        # holds the lock: no other writer's files are in flight
        self.index.connect().open_table(TABLE).cleanup_old_versions(
            older_than=timedelta(0), delete_unverified=True)
