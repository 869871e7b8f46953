"""What a search reads, written per committed version beside the Lance table.

A search process needs every vector, the BM25 postings, the term statistics
of abstention, and the metadata and text of its ``k`` hits. Reading those
through LanceDB costs a search process ~2.4 s of imports alone, against a
budget of 1.5 s for a whole cold ``ssindex search``; an Arrow IPC file is
memory-mapped in milliseconds with pyarrow, which ssindex imports anyway. So
builds write, under ``manifests/``, a version's rows in two segments:

    search-vB.arrow           the base: id, vectors, metadata, text, field lengths,
                              and each row's ``is_test`` mark (``ssindex.text.roles``)
    postings-vB.arrow         its BM25 postings (``ssindex.index.postings``)
    search-vN-delta.arrow     the rows written since the base (new or replaced)
    postings-vN-delta.arrow   their postings
    search-vN-deleted.arrow   the base rows no longer in version N, by position

A version's rows are the base's live rows, in order, then the delta's: the rows and
the order that rewriting every row would give. A clean build writes a base alone, in
the table's order. A rebuild that changes a few files writes a new delta and deletions
and keeps the base: rewriting the standard library's 130 MB of search files took a
one-file change ~0.4 s of its ~1 s. Once the delta and the deletions pass
``MERGE_SHARE`` of the base, the two merge into a new base.

The Lance table stays the index of record (builds diff and commit against
it); these files are derived from its versions and never change.
``SEARCH_FILES_VERSION`` in ``HEAD.json`` names their layout: a build rewrites
files of another layout even when no row changed.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa

from ssindex.index.layout import FILE_KEYS, IndexDir
from ssindex.index.postings import Lexicon, Postings, Segment
from ssindex.text.roles import is_test
from ssindex.util import heap
from ssindex.util.arrays import distinct, numeric_view, whole
from ssindex.util.cores import usable_cores

SEARCH_FILES_VERSION = 8
SEARCH_FILE_KEYS = FILE_KEYS[1:]
"""Keys of ``HEAD.json`` naming a version's search files (the last three: its delta)."""
MERGE_SHARE = 1 / 16
"""Delta and deleted rows, as a share of the base's, past which they merge into a new
base (at least ``MERGE_ROWS``): the delta a commit rewrites stays small."""
MERGE_ROWS = 2048
BLOCK_ROWS = 8192
"""Rows a clean version's search files are written in at a time."""
MAX_BUILDERS = 4
"""Threads at most that build a clean version's postings (``_builders``)."""
SNAPSHOT_COLUMNS = ["id", "path", "start_line", "end_line", "language", "symbol", "kind", "text",
                    "vec_codes", "vec_scale"]
_VECTORS = ("vec_codes", "vec_scale")
_LENGTHS = ["body_terms", "name_terms"]
"""Snapshot columns with each row's field lengths, which BM25 weighs."""

Made = tuple[dict[str, str], pa.Table, Lexicon]
"""Search files written: their names (keys of ``HEAD.json``), the version's rows, and
their BM25 postings."""


@dataclass(frozen=True)
class SearchFiles:
    """A version's search files, memory-mapped: a base, and the delta since."""

    base: pa.Table
    base_postings: pa.Table
    delta: pa.Table | None = None
    delta_postings: pa.Table | None = None
    deleted: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Positions of the base rows that are not in the version, sorted."""

    @classmethod
    def read(cls, index: IndexDir, head: Mapping[str, Any]) -> SearchFiles:
        """The files ``head`` (``HEAD.json``'s data) names, mapped now."""
        tables = {key: index.read_manifest(head[key], mmap=True)
                  for key in SEARCH_FILE_KEYS if key in head}
        deleted = (numeric_view(tables["deleted"].column("row"), np.int64)
                   if "deleted" in tables else np.zeros(0, np.int64))
        return cls(tables["snapshot"], tables["postings"], tables.get("delta_snapshot"),
                   tables.get("delta_postings"), deleted)

    @cached_property
    def base_rows(self) -> np.ndarray | None:
        """Each base row's position in the version (-1: deleted); ``None``: unchanged."""
        if not len(self.deleted):
            return None
        live = np.ones(len(self.base), bool)
        live[self.deleted] = False
        return np.where(live, np.cumsum(live) - 1, -1)

    @cached_property
    def rows(self) -> pa.Table:
        """The version's rows: the base's live ones (slices of the mapped file, not
        copies), then the delta's."""
        parts = [self.base]
        if self.base_rows is not None:
            edges = np.flatnonzero(np.diff(np.concatenate(
                [[0], (self.base_rows >= 0).astype(np.int8), [0]])))
            parts = [self.base.slice(start, stop - start)
                     for start, stop in zip(edges[0::2].tolist(), edges[1::2].tolist(),
                                            strict=True)] or [self.base.slice(0, 0)]
        if self.delta is not None:
            parts.append(self.delta)
        return parts[0] if len(parts) == 1 else pa.concat_tables(parts)

    def lexicon(self) -> Lexicon:
        base = Postings.from_table(self.base_postings, _lengths(self.base))
        delta = None if self.delta is None or self.delta_postings is None else \
            Postings.from_table(self.delta_postings, _lengths(self.delta))
        return _lexicon(base, self.base_rows, delta)


def _lexicon(base: Postings, base_rows: np.ndarray | None, delta: Postings | None) -> Lexicon:
    segments = [Segment(base, base_rows)]
    if delta is not None:
        live = base.size if base_rows is None else int(np.sum(base_rows >= 0))
        segments.append(Segment(delta, live + np.arange(delta.size)))
    return Lexicon(segments)


def _lengths(rows: pa.Table) -> np.ndarray:
    return np.stack([numeric_view(rows.column(c), np.int32) for c in _LENGTHS]) if len(rows) \
        else np.zeros((2, 0), np.int32)


def write_search_files(index: IndexDir, version: int) -> Made:
    """Write the search files of ``version`` from its table: a base alone. Rows stream
    in blocks of ``BLOCK_ROWS``, their snapshot rows written as they come and their
    postings built on threads meanwhile, then concatenated: tokenizing every row at
    once took the standard library's lexical commit ~0.77 GB at its peak, for 85 MB of
    files. The heap is trimmed after each block (``util.heap``): what tokenizing a block
    freed stayed in the allocators, and the standard library's 9 blocks peaked ~560 MB
    above the commit's start, against ~380 MB trimmed, in the same ~1 s."""
    dataset = index.open_table(version).to_lance()
    columns = ["lex_body", "lex_name", *SNAPSHOT_COLUMNS]
    blocks = dataset.to_batches(columns=columns, batch_size=BLOCK_ROWS, scan_in_order=True)
    first = next(blocks, None) or pa.RecordBatch.from_pylist(
        [], schema=pa.schema([dataset.schema.field(c) for c in columns]))
    parts: list[Postings] = []
    name = f"search-v{version}.arrow"
    threads = _builders()
    with ThreadPoolExecutor(threads, thread_name_prefix="ssindex-postings") as builder:
        built = _built_ahead(itertools.chain([first], blocks), builder, threads)
        block, postings = next(built)
        parts.append(postings)
        marked = _marked(pa.table(block).select(SNAPSHOT_COLUMNS), postings)
        with index.manifest_writer(name, marked.schema) as writer:
            writer.write_table(marked)
            heap.trim()
            for block, postings in built:
                parts.append(postings)
                writer.write_table(_marked(pa.table(block).select(SNAPSHOT_COLUMNS), postings))
                heap.trim()
    whole_postings = Postings.concatenate(parts)
    names = {"postings": index.write_manifest(f"postings-v{version}.arrow",
                                              whole_postings.to_table()),
             "snapshot": name}
    return names, index.read_manifest(name, mmap=True), _lexicon(whole_postings, None, None)


def _builders() -> int:
    """Threads that build blocks' postings: their Arrow and numpy kernels leave the GIL,
    and a commit runs after the workers are done, so the cores are free (the standard
    library's 9 blocks: 0.90 s on one thread, 0.51 s on two). The reading thread keeps
    ahead of ~4 (a block is read in ~30 ms and built in ~100)."""
    return min(MAX_BUILDERS, usable_cores())


def _built_ahead(blocks: Iterator[pa.RecordBatch], builder: Executor, ahead: int,
                 ) -> Iterator[tuple[pa.RecordBatch, Postings]]:
    """Each block with its postings, those of up to ``ahead`` blocks after it built on
    ``builder`` meanwhile."""
    pending: deque[tuple[pa.RecordBatch, Future[Postings]]] = deque()
    for block in blocks:
        pending.append((block, builder.submit(Postings.build, block.column("lex_body"),
                                              block.column("lex_name"))))
        if len(pending) > ahead:
            done, future = pending.popleft()
            yield done, future.result()
    while pending:
        done, future = pending.popleft()
        yield done, future.result()


def revectored_search_files(index: IndexDir, version: int, previous: Mapping[str, Any],
                            ) -> Made | None:
    """``write_search_files`` for a version whose rows are those of the version whose
    search files ``previous`` names (a base alone), in the same order, but for their
    vectors: a progressive build's finished version over its lexical one. The snapshot
    takes the new vectors and the postings are linked, not rebuilt: building them over
    every row took the standard library's finished commit ~0.8 GB at its peak. ``None``
    when a row may differ (a file changed between the passes).

    The rows are the same when both versions' build manifests list the same files with
    the same contents and chunk ids: chunking is a function of a file's text and the
    settings, which one build shares. So only ids and vectors stream from the table,
    block by block with the previous snapshot's rows (read a block at a time, not
    mapped): streaming every column through Lance's read-ahead took the standard
    library's finished commit ~140 MB more at its peak, and passing over the whole
    mapped snapshot and every new vector at once ~110 MB more."""
    if "delta_snapshot" in previous:
        return None
    snapshot = previous["snapshot"]
    head = index.read_head().data  # a progressive build's partial versions replaced it
    if head.get("table_version") == previous.get("table_version"):  # (same rows)
        snapshot = head["snapshot"]
    if not _same_files(index.read_manifest(f"v{version}.arrow"),
                       index.read_manifest(previous["manifest"])):
        return None
    schema, count, before = index.manifest_batches(snapshot)
    dataset = index.open_table(version).to_lance()
    if dataset.count_rows() != count:
        return None
    vectors = _Rows(dataset.to_batches(columns=["id", *_VECTORS], batch_size=BLOCK_ROWS))
    name = f"search-v{version}.arrow"
    try:
        with index.manifest_writer(name, schema) as writer:
            for block in before:
                new = vectors.take(block.num_rows)
                if not new.column("id").equals(pa.chunked_array([block.column("id")])):
                    raise _RowsDiffer
                for column in _VECTORS:
                    block = block.set_column(schema.get_field_index(column), schema.field(column),
                                             whole(new.column(column)))
                writer.write_batch(block)
    except _RowsDiffer:
        return None
    rows = index.read_manifest(name, mmap=True)
    postings = Postings.from_table(index.read_manifest(previous["postings"], mmap=True),
                                   _lengths(rows))
    names = {"postings": index.link_manifest(previous["postings"], f"postings-v{version}.arrow"),
             "snapshot": name}
    return names, rows, _lexicon(postings, None, None)


class _RowsDiffer(Exception):
    """A version's rows are not the previous version's (``revectored_search_files``)."""


class _Rows:
    """Rows of a stream of record batches, taken in blocks of any size."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._batches = batches
        self._held: list[pa.RecordBatch] = []
        self._count = 0

    def take(self, count: int) -> pa.Table:
        """The next ``count`` rows, fewer where the stream ends (``_RowsDiffer`` past it)."""
        while self._count < count and (batch := next(self._batches, None)) is not None:
            self._held.append(batch)
            self._count += batch.num_rows
        if not self._held:
            raise _RowsDiffer
        held = pa.Table.from_batches(self._held)
        taken, rest = held.slice(0, count), held.slice(count)
        self._held, self._count = rest.to_batches(), rest.num_rows
        return taken


def _same_files(manifest: pa.Table, other: pa.Table) -> bool:
    """Whether two build manifests list the same files, contents and chunk ids, in order."""
    columns = ["path", "content_hash", "chunk_ids"]
    return manifest.select(columns).equals(other.select(columns))


def update_search_files(index: IndexDir, version: int, previous: Mapping[str, Any],
                        written: pa.Table, removed: set[str]) -> Made:
    """``write_search_files`` for a version that differs from the one whose search files
    ``previous`` names by rows ``written`` (new or replaced) and ids ``removed``: its
    rows are the previous ones, in order, without those, then the written ones, and
    only the written ones are tokenized. The base is kept, with a new delta and new
    deletions, until they pass ``MERGE_SHARE`` of it; then the two are merged (their
    postings too, without tokenizing) into a new base."""
    import pyarrow.compute as pc  # here, not above: searches import this module

    files = SearchFiles.read(index, previous)
    gone = pa.array(sorted(removed | set(written.column("id").to_pylist())), pa.string())
    deleted = np.union1d(files.deleted, np.flatnonzero(np.asarray(
        pc.is_in(files.base.column("id"), value_set=gone), bool)))
    added = Postings.build(written.column("lex_body"), written.column("lex_name"))
    delta = _marked(written.select(SNAPSHOT_COLUMNS), added).cast(files.base.schema)
    if files.delta is not None and files.delta_postings is not None:
        keep = ~np.asarray(pc.is_in(files.delta.column("id"), value_set=gone), bool)
        added = Postings.from_table(files.delta_postings, _lengths(files.delta)).merge(
            keep, added)
        delta = pa.concat_tables([files.delta.filter(pa.array(keep)), delta])
    base = Postings.from_table(files.base_postings, _lengths(files.base))
    merged = SearchFiles(files.base, files.base_postings, delta, None, deleted)
    if len(deleted) + len(delta) > max(MERGE_ROWS, MERGE_SHARE * len(files.base)):
        live = np.ones(len(files.base), bool)
        live[deleted] = False
        return _write_base(index, version, merged.rows, base.merge(live, added))
    names = {"snapshot": previous["snapshot"], "postings": previous["postings"],
             "delta_snapshot": index.write_manifest(f"search-v{version}-delta.arrow", delta),
             "delta_postings": index.write_manifest(f"postings-v{version}-delta.arrow",
                                                    added.to_table()),
             "deleted": index.write_manifest(f"search-v{version}-deleted.arrow",
                                             pa.table({"row": pa.array(deleted, pa.int64())}))}
    return names, merged.rows, _lexicon(base, merged.base_rows, added)


def test_marks(paths: pa.ChunkedArray) -> pa.Array:
    """Whether each row's file is test code, judged once per distinct path."""
    files, rows = distinct(paths)
    return pa.array(np.array([is_test(path) for path in files.to_pylist()], bool)[rows])


def _marked(rows: pa.Table, postings: Postings) -> pa.Table:
    """Snapshot rows with their field lengths (from their ``postings``) and test marks."""
    for name, lengths in zip(_LENGTHS, postings.lengths, strict=True):
        rows = rows.append_column(name, pa.array(lengths, pa.int32()))
    return rows.append_column("is_test", test_marks(rows.column("path")))


def _write_base(index: IndexDir, version: int, rows: pa.Table, postings: Postings) -> Made:
    names = {
        "postings": index.write_manifest(f"postings-v{version}.arrow", postings.to_table()),
        "snapshot": index.write_manifest(f"search-v{version}.arrow", rows),
    }
    return names, rows, _lexicon(postings, None, None)
