"""The Lance ``chunks`` table: commits of a build's rows as a diff, and scans."""

from __future__ import annotations

import contextlib
import itertools
import queue
import shutil
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from ssindex.errors import storage_faults
from ssindex.index.layout import CHUNK_SCHEMA, TABLE, Head, IndexDir

T = TypeVar("T")

LANCE_MAGIC = b"LANC"
"""The last bytes of every Lance file, manifests included."""


MAX_FRAGMENTS = 8
"""An incremental commit adds a fragment (and deletion files): compacting after every
one cost a one-file rebuild of the standard library ~0.7 s, so compaction waits until
the table has more fragments than this."""


class TableWriter:
    """Commits the rows of one build as a diff against the committed version."""

    def __init__(self, index: IndexDir, previous: Head | None, purge: bool = False) -> None:
        self.index = index
        self.previous = None if purge else previous
        self.purge = purge
        """Write the table anew and keep no older version or file (``cleanup``): the
        previous versions hold what must go (secrets a tightened rule now redacts)."""
        self.rows_written = 0
        self.rows_deleted = 0
        self.changes: tuple[pa.Table, set[str]] | None = None
        """After an incremental commit: the rows written and the ids deleted."""

    def write(self, batches: Iterable[pa.RecordBatch], previous_digests: dict[str, str],
              row_ids: set[str]) -> int:
        """Commit new and changed rows, delete rows not in ``row_ids`` (filled while
        ``batches`` is consumed); returns the new table version."""
        with storage_faults(f"the table (db/{TABLE}.lance)", self.index.path):
            return self._write(batches, previous_digests, row_ids)

    def _write(self, batches: Iterable[pa.RecordBatch], previous_digests: dict[str, str],
               row_ids: set[str]) -> int:
        changed = self._changed(batches, previous_digests)
        # LanceDB's import (~1.2 s) runs beside the stages' start: taken after the first
        # batch, in this thread, it held the stages back and a clean build's workers idle
        if "lancedb" not in sys.modules:
            threading.Thread(target=_import_lancedb, daemon=True,
                             name="ssindex-lancedb-import").start()
        first = next(changed, None)
        changed = itertools.chain([] if first is None else [first], changed)
        db = self.index.connect()
        if self.previous is None or TABLE not in db.table_names():
            _drop_if_unreadable(db, self.index)
            table = _stream_to(lambda reader: db.create_table(
                TABLE, data=reader, schema=CHUNK_SCHEMA, mode="overwrite"), changed)
            return int(table.version)
        table = db.open_table(TABLE)
        if table.version != self.previous.table_version:
            table.checkout(self.previous.table_version)
            table.restore()
        pending = list(changed)
        if pending:
            (table.merge_insert("id").when_matched_update_all()
             .when_not_matched_insert_all().execute(pa.Table.from_batches(pending)))
        gone = [row_id for row_id in previous_digests if row_id not in row_ids]
        for start in range(0, len(gone), 5000):
            ids = ", ".join(f"'{row_id}'" for row_id in gone[start : start + 5000])
            table.delete(f"id IN ({ids})")
        self.rows_deleted = len(gone)
        self.changes = (pa.Table.from_batches(pending, CHUNK_SCHEMA), set(gone))
        if (pending or gone) and table.stats()["fragment_stats"]["num_fragments"] > MAX_FRAGMENTS:
            table.optimize()
        return int(table.version)

    def commit_fragments(self, fragments: list[str]) -> int:
        """Commit Lance fragments written by workers (JSON metadata) as one new version
        that replaces the table; returns the new version."""
        import lance
        from lance.fragment import FragmentMetadata

        uri = str(table_path(self.index))
        operation = lance.LanceOperation.Overwrite(
            CHUNK_SCHEMA, [FragmentMetadata.from_json(f) for f in fragments])
        lance.LanceDataset.commit(uri, operation)
        return int(self.index.connect().open_table(TABLE).version)

    def _changed(self, batches: Iterable[pa.RecordBatch],
                 previous: dict[str, str]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            ids = batch.column("id").to_pylist()
            digests = batch.column("row_digest").to_pylist()
            keep = [previous.get(i) != d for i, d in zip(ids, digests, strict=True)]
            if any(keep):
                out = batch if all(keep) else batch.filter(pa.array(keep))
                self.rows_written += out.num_rows
                yield out

    def cleanup(self) -> None:
        """Drop versions older than an hour; readers pinned to recent ones are safe. A
        purge drops every older version now, and fails loudly if it cannot."""
        table = self.index.connect().open_table(TABLE)
        if self.purge:  # under the build lock: no other writer's files are in flight
            table.cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)
            return
        with contextlib.suppress(Exception):  # best effort; the committed build is intact
            table.cleanup_old_versions(older_than=timedelta(hours=1), delete_unverified=False)


def _import_lancedb() -> None:
    """Import LanceDB ahead of the writer's first use; a failure is the writer's to raise
    when it imports it itself."""
    with contextlib.suppress(Exception):
        import lancedb  # noqa: F401


def table_path(index: IndexDir) -> Path:
    """The Lance dataset of the chunks table."""
    return index.db_path / f"{TABLE}.lance"


def _drop_if_unreadable(db: Any, index: IndexDir) -> None:
    """Remove a table Lance cannot open because a version manifest is cut short: writing
    it anew reads the latest one first, so every build would fail on it. Other failures
    (too many open files, a fault of the disk) pass, and writing reports them. The build
    that writes it holds the lock, and searches read the search files, not the table."""
    path = table_path(index)
    if path.exists():
        try:
            db.open_table(TABLE)
        except (ValueError, OSError, RuntimeError):  # how Lance reports damaged files
            if _manifests_cut(path):
                shutil.rmtree(path)


def _manifests_cut(table: Path) -> bool:
    """Whether a version manifest of ``table`` lacks the magic bytes Lance ends each
    with, or none is left."""
    manifests = list((table / "_versions").glob("*.manifest"))
    for manifest in manifests:
        with manifest.open("rb") as handle:
            handle.seek(max(manifest.stat().st_size - len(LANCE_MAGIC), 0))
            if handle.read() != LANCE_MAGIC:
                return True
    return not manifests


_END, _STOP = object(), object()


def _stream_to(write: Callable[[pa.RecordBatchReader], T],
               batches: Iterable[pa.RecordBatch]) -> T:
    """``write(reader)`` on a helper thread while ``batches`` are produced on this one.

    Lance pulls a reader's batches on a thread of its own. Handed the pipeline itself,
    it would run every stage, embedding included, on that thread: a Ctrl-C would stop
    only the thread waiting for Lance, the pipeline would run on, and the process
    would abort at exit ("terminate called without an active exception"). Here the
    pipeline stays on the calling thread, where interrupts and errors land; the write
    is then abandoned (nothing is committed) before they go on."""
    handoff: queue.Queue[Any] = queue.Queue(maxsize=2)
    written: list[T] = []
    failed: list[BaseException] = []

    def handed() -> Iterator[pa.RecordBatch]:
        while (item := handoff.get()) is not _END:
            if item is _STOP:
                raise RuntimeError("the build stopped before its last batch")
            yield item

    def run() -> None:
        try:
            written.append(write(pa.RecordBatchReader.from_batches(CHUNK_SCHEMA, handed())))
        except BaseException as exc:  # raised on the calling thread
            failed.append(exc)

    writer = threading.Thread(target=run, name="ssindex-lance-write")
    writer.start()

    def hand(item: Any) -> bool:
        """Queue ``item`` for the writer; False once it has stopped (it failed)."""
        while writer.is_alive():
            with contextlib.suppress(queue.Full):
                handoff.put(item, timeout=0.1)
                return True
        return False

    try:
        for batch in batches:
            if not hand(batch):
                break
        hand(_END)
    except BaseException:
        hand(_STOP)
        writer.join()
        raise
    writer.join()
    if failed:
        raise failed[0]
    return written[0]


def scan(table: Any, columns: list[str], where: str | None = None,
         with_row_id: bool = False) -> pa.Table:
    """Some columns of every row (matching ``where``) of a pinned table."""
    query = table.search().select(columns)
    if where:
        query = query.where(where)
    if with_row_id:
        query = query.with_row_id(True)
    return query.limit(None).to_arrow()
