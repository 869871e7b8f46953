"""The index on disk: a Lance ``chunks`` table through LanceDB, and a head file.

Layout of an index directory::

    HEAD.json        the committed state: table version, model, settings, stats
    db/chunks.lance  every row ever committed, versioned by Lance
    manifests/       per committed version, Arrow IPC files: the build manifest
                     and the search files (``ssindex.snapshot``)
    lock             advisory builder lock (see ``ssindex.lock``)

A build commits to Lance as many times as it needs (rows, deletions,
compaction), writes that version's manifests, then replaces ``HEAD.json``
atomically. Readers open the files *of the version HEAD names* (a build, the
Lance table at that version; a search, its search files), so they see the
previous build or the new one, never a mix, and never wait for a builder. A build that dies before
replacing HEAD leaves it pointing at the old, intact version; the next build
restores that version before writing.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np
import pyarrow as pa
import xxhash

from ssindex.errors import IndexCorrupt, IndexNotFound, IndexNotWritable
from ssindex.stages.quantize import dequantize_matrix

T = TypeVar("T")

FORMAT_VERSION = 1
TABLE = "chunks"
_VERSIONED = re.compile(r"(?:v|terms-v|postings-v|search-v)(\d+)\.arrow")
HEAD = "HEAD.json"
HEAD_KEYS = ("table_version", "manifest", "root", "built_at", "model", "quantization",
             "settings", "files", "chunks")
"""What every head has held since format 1 and readers rely on."""

CHUNK_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("path", pa.string()),
    ("language", pa.string()),
    ("start_line", pa.int32()),
    ("end_line", pa.int32()),
    ("symbol", pa.string()),
    ("kind", pa.string()),
    ("text", pa.string()),
    ("dup_of", pa.string()),
    ("content_hash", pa.string()),
    ("file_hash", pa.string()),
    ("embed_key", pa.string()),
    ("minhash", pa.binary()),
    ("vec_codes", pa.binary()),
    ("vec_scale", pa.float32()),
    ("lex_body", pa.string()),
    ("lex_name", pa.string()),
    ("row_digest", pa.string()),
])
MANIFEST_SCHEMA = pa.schema([
    ("path", pa.string()),
    ("size", pa.int64()),
    ("mtime_ns", pa.int64()),
    ("content_hash", pa.string()),
    ("chunk_ids", pa.list_(pa.string())),
    ("ctime_ns", pa.int64()),
    ("inode", pa.int64()),
])


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a reader sees the old file or the new, never a part."""
    with atomic_file(path) as f:
        f.write(data)


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A file to write that appears at ``path`` whole, durably, once the block ends (and
    never, if it raises)."""
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as f:
        try:
            yield f  # type: ignore[misc]
            f.flush()
            os.fsync(f.fileno())
        except BaseException:
            f.close()
            os.unlink(f.name)
            raise
    os.replace(f.name, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def row_digest(row: dict[str, Any]) -> str:
    """Hash of every stored field but the digest itself: unchanged rows are not rewritten."""
    digest = xxhash.xxh3_64()
    for name in CHUNK_SCHEMA.names[:-1]:
        value = row[name]
        digest.update(value if isinstance(value, bytes) else repr(value).encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Head:
    """The committed state of an index, as ``HEAD.json`` records it."""

    data: dict[str, Any]

    @property
    def table_version(self) -> int:
        return int(self.data["table_version"])

    @property
    def quantization(self) -> str:
        return str(self.data["quantization"])

    @property
    def dim(self) -> int:
        return int(self.data["model"]["dim"])


class IndexDir:
    """Paths and head of one index directory."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @property
    def db_path(self) -> Path:
        return self.path / "db"

    def exists(self) -> bool:
        return (self.path / HEAD).is_file()

    def read_head(self) -> Head:
        file = self.path / HEAD
        if not file.is_file():
            raise IndexNotFound(f"no index at {self.path} (run `ssindex build` first)")
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise IndexCorrupt(f"cannot read {file}: {exc}") from exc
        if not isinstance(data, dict):
            raise IndexCorrupt(f"{file} is not an index head; rebuild the index")
        if data.get("format_version") != FORMAT_VERSION:
            raise IndexCorrupt(
                f"index format {data.get('format_version')} at {self.path} is not supported "
                f"(this ssindex reads format {FORMAT_VERSION}); rebuild it"
            )
        missing = [key for key in HEAD_KEYS if key not in data]
        if missing:
            raise IndexCorrupt(f"{file} lacks {', '.join(missing)}; rebuild the index")
        return Head(data)

    def write_head(self, data: dict[str, Any]) -> None:
        atomic_write_bytes(self.path / HEAD, json.dumps(data, indent=2).encode())

    def ensure_writable(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            (self.path / "manifests").mkdir(exist_ok=True)
            probe = self.path / f".write-probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise IndexNotWritable(f"cannot write index directory {self.path}: {exc}") from exc

    def connect(self) -> Any:
        import lancedb

        return lancedb.connect(str(self.db_path))

    def open_table(self, version: int | None = None) -> Any:
        """The chunks table, pinned at ``version`` (default: HEAD's)."""
        if version is None:
            version = self.read_head().table_version
        try:
            table = self.connect().open_table(TABLE)
            table.checkout(version)
        except Exception as exc:  # Lance raises plain ValueError/OSError variants
            raise IndexCorrupt(f"cannot open {TABLE} v{version} in {self.path}: {exc}") from exc
        return table

    def write_manifest(self, name: str, table: pa.Table) -> str:
        import pyarrow.ipc as ipc

        # written straight to the file: the search files of a 62k-chunk index are ~120 MB
        with atomic_file(self.path / "manifests" / name) as f, ipc.new_file(
                f, table.schema) as writer:
            writer.write_table(table)
        return name

    def prune_manifests(self, keep: set[str], min_age_s: float = 3600) -> None:
        """Delete per-version manifests not named in ``keep`` once they are older than
        ``min_age_s`` (as Lance keeps old versions an hour, for pinned readers)."""
        cutoff = time.time() - min_age_s
        for path in (self.path / "manifests").glob("*.arrow"):
            if (_VERSIONED.fullmatch(path.name) and path.name not in keep
                    and path.stat().st_mtime < cutoff):
                path.unlink(missing_ok=True)

    def read_manifest(self, name: str, mmap: bool = False) -> pa.Table:
        """A manifest, read into memory, or memory-mapped (pages load as they are used)."""
        import pyarrow.ipc as ipc

        path = str(self.path / "manifests" / name)
        try:
            if mmap:
                return ipc.open_file(pa.memory_map(path)).read_all()
            with ipc.open_file(path) as reader:
                return reader.read_all()
        except (OSError, pa.ArrowException) as exc:
            raise IndexCorrupt(f"cannot read {path} ({exc}): the index is damaged; "
                               "remove it and run `ssindex build`") from exc


MAX_FRAGMENTS = 8
"""An incremental commit adds a fragment (and deletion files): compacting after every
one cost a one-file rebuild of the standard library ~0.7 s, so compaction waits until
the table has more fragments than this."""


class TableWriter:
    """Commits the rows of one build as a diff against the committed version."""

    def __init__(self, index: IndexDir, previous: Head | None) -> None:
        self.index = index
        self.previous = previous
        self.rows_written = 0
        self.rows_deleted = 0
        self.changes: tuple[pa.Table, set[str]] | None = None
        """After an incremental commit: the rows written and the ids deleted."""

    def write(self, batches: Iterable[pa.RecordBatch], previous_digests: dict[str, str],
              row_ids: set[str]) -> int:
        """Commit new and changed rows, delete rows not in ``row_ids`` (filled while
        ``batches`` is consumed); returns the new table version."""
        db = self.index.connect()
        changed = self._changed(batches, previous_digests)
        if self.previous is None or TABLE not in db.table_names():
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
        that replaces the table; returns the version after the text indexes."""
        import lance
        from lance.fragment import FragmentMetadata

        uri = str(self.index.db_path / f"{TABLE}.lance")
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
        """Drop versions older than an hour; readers pinned to recent ones are safe."""
        with contextlib.suppress(Exception):  # best effort; the committed build is intact
            self.index.connect().open_table(TABLE).cleanup_old_versions(
                older_than=timedelta(hours=1), delete_unverified=False
            )


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


def binary_matrix(column: pa.Array) -> np.ndarray:
    """Equal-length binary values as one (rows, width) uint8 matrix, without copies per row."""
    if len(column) == 0:
        return np.zeros((0, 0), np.uint8)
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int32)[column.offset :][: len(column) + 1]
    width = int(offsets[1] - offsets[0])
    if not np.all(np.diff(offsets) == width):
        raise IndexCorrupt("stored vectors have mixed sizes")
    data = np.frombuffer(column.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
    return data.reshape(len(column), width)


def numeric_view(array: pa.Array | pa.ChunkedArray, dtype: type[np.generic]) -> np.ndarray:
    """A null-free, fixed-width Arrow array as a numpy view.

    Not ``to_numpy``: pyarrow's conversions import pandas where it is installed,
    ~0.5 s of a cold search that never needs it."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if len(array) == 0:
        return np.zeros(0, dtype)
    if array.null_count:
        raise IndexCorrupt(f"unexpected nulls in a stored {array.type} column")
    return np.frombuffer(array.buffers()[1], dtype)[array.offset : array.offset + len(array)]


def stored_vectors(rows: pa.Table, method: str, dim: int) -> np.ndarray:
    """The float32 vectors of rows with ``vec_codes`` and ``vec_scale`` columns."""
    return dequantize_matrix(binary_matrix(rows.column("vec_codes").combine_chunks()),
                             numeric_view(rows.column("vec_scale"), np.float32),
                             method, dim)  # type: ignore[arg-type]


def status_data(index_path: Path) -> dict[str, Any]:
    """What an index holds and how it was built (``ssindex status``, MCP ``status``)."""
    head = IndexDir(index_path).read_head().data
    return {
        "index": str(index_path), "files": head["files"], "chunks": head["chunks"],
        "model": head["model"]["id"], "quantization": head["quantization"],
        "index_version": FORMAT_VERSION, "table_version": head["table_version"],
        "built_at": head["built_at"], "root": head["root"],
    }


def default_index_path(root: Path) -> Path:
    return Path(root) / ".ssindex"


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
