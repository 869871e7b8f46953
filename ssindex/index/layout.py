"""The index on disk: a Lance ``chunks`` table through LanceDB, and a head file.

Layout of an index directory::

    HEAD.json        the committed state: table version, model, settings, stats
    db/chunks.lance  every row ever committed, versioned by Lance
    manifests/       per committed version, Arrow IPC files: the build manifest
                     and the search files (``ssindex.index.search_files``)
    lock             advisory builder lock (see ``ssindex.index.lock``)

A build commits to Lance as many times as it needs (rows, deletions,
compaction), writes that version's manifests, then replaces ``HEAD.json``
atomically. Readers open the files *of the version HEAD names* (a build, the
Lance table at that version; a search, its search files), so they see the
previous build or the new one, never a mix, and never wait for a builder. A build that dies before
replacing HEAD leaves it pointing at the old, intact version; the next build
restores that version before writing.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pyarrow as pa
import xxhash

from ssindex.errors import (
    IndexCorrupt,
    IndexNotFound,
    IndexNotWritable,
    map_exceptions,
    storage_faults,
)
from ssindex.index.abstention import Thresholds
from ssindex.index.activity import running_build
from ssindex.util.fsio import atomic_file, atomic_link, atomic_write_bytes

FORMAT_VERSION = 1
TABLE = "chunks"
_VERSIONED = re.compile(
    r"(?:v|terms-v|postings-v|search-v)(\d+)(?:-p\d+|-delta|-deleted)?\.arrow")
HEAD = "HEAD.json"
HEAD_KEYS = ("table_version", "manifest", "root", "built_at", "model", "quantization",
             "settings", "files", "chunks")
"""What every head has held since format 1 and readers rely on."""
FILE_KEYS = ("manifest", "snapshot", "postings", "delta_snapshot", "delta_postings", "deleted")
"""Keys of ``HEAD.json`` naming a file of ``manifests/`` (the search files: the last five)."""

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
    ("secrets_redacted", pa.int32()),
])


VERDICT_FIELDS = ("dup_of", "vec_codes", "vec_scale")
"""The stored fields a chunk does not fix alone: its dedupe verdict and its vector."""
FIXED_FIELDS = tuple(name for name in CHUNK_SCHEMA.names[:-1] if name not in VERDICT_FIELDS)


def fixed_digest(row: Mapping[str, Any]) -> bytes:
    """Hash of the stored fields a chunk fixes alone (``FIXED_FIELDS``): a worker process
    works it out, so that the driver hashes only the verdict and vector of each row."""
    digest = xxhash.xxh3_128()
    for name in FIXED_FIELDS:
        _hash_field(digest, row[name])
    return digest.digest()


def row_digest(row: Mapping[str, Any], fixed: bytes | None = None) -> str:
    """Hash of every stored field but the digest itself: unchanged rows are not rewritten.
    ``fixed``: the row's ``fixed_digest``, when known."""
    digest = xxhash.xxh3_64(fixed if fixed is not None else fixed_digest(row))
    for name in VERDICT_FIELDS:
        _hash_field(digest, row[name])
    return digest.hexdigest()


def _hash_field(digest: Any, value: Any) -> None:
    """A field's bytes, length-prefixed, or the ``repr`` of a number or ``None``, ended:
    the fields cannot run into each other. (Every field's ``repr`` made the digest of a
    row cost ~14 us, its text's and terms' two thirds of that.)"""
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogatepass")
    if isinstance(value, bytes):
        digest.update(b"%d:" % len(value))
        digest.update(value)
    else:
        digest.update(b"%s;" % repr(value).encode())


def _plain(name: str) -> bool:
    """A file name that stays in its folder: no separator, not ``.`` nor ``..``."""
    return name not in ("", ".", "..") and not any(c in name for c in "/\\\0")


_TEXT, _COUNT, _NUMBER, _OBJECT = "a string", "a whole number >= 0", "a number", "an object"
_KINDS: dict[str, Callable[[Any], bool]] = {
    _TEXT: lambda v: isinstance(v, str),
    _COUNT: lambda v: type(v) is int and 0 <= v < 2**63,  # Lance's versions are u64
    _NUMBER: lambda v: type(v) in (int, float),
    _OBJECT: lambda v: isinstance(v, dict),
    "a whole number > 0": lambda v: type(v) is int and v > 0,
    "a share from 0 to 1": lambda v: type(v) in (int, float) and 0 <= v <= 1,
    "true or false": lambda v: type(v) is bool,
    "a string or null": lambda v: v is None or isinstance(v, str),
    "a plain file name": lambda v: isinstance(v, str) and _plain(v),
    "abstention thresholds": lambda v: isinstance(v, dict) and v.keys() <= {
        f.name for f in fields(Thresholds)},
    "a map of files in the index to checksums": lambda v: isinstance(v, dict) and all(
        isinstance(digest, str) and all(_plain(part) for part in name.split("/"))
        for name, digest in v.items()),
}
_FIELDS = {
    "table_version": _COUNT, "root": _TEXT, "built_at": _TEXT, "quantization": _TEXT,
    "files": _COUNT, "chunks": _COUNT, "walk_started_ns": _COUNT, "search_files": _COUNT,
    "dense_coverage": "a share from 0 to 1", "near_duplicates": "true or false",
    **dict.fromkeys(FILE_KEYS, "a plain file name"), "model": _OBJECT, "model.id": _TEXT,
    "model.path": _TEXT, "model.fingerprint": _TEXT, "model.dim": "a whole number > 0",
    "model.max_tokens": "a whole number > 0", "model.dims": _COUNT, "settings": _OBJECT,
    "settings.fingerprint": _TEXT, "settings.config": _OBJECT, "settings.config.walk": _OBJECT,
    "abstention": "abstention thresholds", "abstention.lexical": _NUMBER,
    "abstention.semantic": _NUMBER, "abstention.nearest": "a string or null",
    "abstention.nearest_cosine": _NUMBER, "stats": _OBJECT, "stats.files_skipped": _OBJECT,
    "checksums": "a map of files in the index to checksums",
}
"""What readers take each field of a head for, by its dotted path: an object before its
fields. Of an object that is there, the fields of ``_REQUIRED`` must be too (a head
older than abstention thresholds has none)."""
_REQUIRED = {"model.id", "model.path", "model.fingerprint", "model.dim", "model.max_tokens",
             "settings.fingerprint", "settings.config", "abstention.lexical",
             "abstention.semantic"}


def head_fault(data: Mapping[str, Any]) -> str | None:
    """The first field of a head that is not what readers take it for, or a file it names
    that it records no checksum of, named (``None``: none). A file name that left the
    index (a crafted ``../../x.py``) had ``ssindex repair`` overwrite that file."""
    for dotted, kind in _FIELDS.items():
        *parents, key = dotted.split(".")
        holder: Mapping[str, Any] | None = data
        for parent in parents:  # an object's fields count where the object is there
            holder = holder.get(parent) if holder is not None else None
        if holder is None:
            continue
        if key not in holder:
            if dotted in _REQUIRED:
                return f"it lacks {dotted}"
        elif not _KINDS[kind](holder[key]):
            return f"its {dotted} is not {kind}"
    recorded = data.get("checksums")
    if recorded is None:  # an index older than checksums
        return None
    return next((f"its {key} has no checksum" for key in FILE_KEYS
                 if key in data and f"manifests/{data[key]}" not in recorded), None)


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
        except (OSError, ValueError, RecursionError) as exc:
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
        fault = head_fault(data)
        if fault is not None:
            raise IndexCorrupt(f"{file} is damaged ({fault}): rebuild the index with "
                               "`ssindex build`")
        return Head(data)

    def write_head(self, data: dict[str, Any]) -> None:
        with storage_faults(HEAD, self.path, head=True):
            atomic_write_bytes(self.path / HEAD, json.dumps(data, indent=2).encode())

    def ensure_writable(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            (self.path / "manifests").mkdir(exist_ok=True)
            ignore = self.path / ".gitignore"
            if not ignore.exists():  # `git add -A` in the tree never takes the index in
                ignore.write_text("*\n", encoding="utf-8")
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
        # Lance reports a missing table or version, or damaged files, as plain
        # ValueError/OSError/RuntimeError variants
        with map_exceptions({(ValueError, OSError, RuntimeError): lambda exc: IndexCorrupt(
                f"cannot open {TABLE} v{version} in {self.path}: {exc}")}):
            table = self.connect().open_table(TABLE)
            table.checkout(version)
        return table

    def write_manifest(self, name: str, table: pa.Table) -> str:
        """Write an Arrow file of ``manifests/`` atomically: a version's build manifest,
        and its search files and postings alike (``prune_manifests`` keeps them)."""
        with self.manifest_writer(name, table.schema) as writer:
            writer.write_table(table)
        return name

    @contextmanager
    def manifest_writer(self, name: str, schema: pa.Schema) -> Iterator[Any]:
        """An Arrow file writer of ``manifests/``: the file appears, whole, when the block
        ends without an error (written straight to it: a 62k-chunk index's search files
        are ~120 MB)."""
        import pyarrow.ipc as ipc

        with storage_faults(f"manifests/{name}", self.path), atomic_file(
                self.path / "manifests" / name) as f, ipc.new_file(f, schema) as writer:
            yield writer

    def link_manifest(self, name: str, new_name: str) -> str:
        """Another name for manifest ``name`` (a later version's search file that did not
        change); manifests are never rewritten, so the two may share their bytes."""
        with storage_faults(f"manifests/{new_name}", self.path):
            atomic_link(self.path / "manifests" / name, self.path / "manifests" / new_name)
        return new_name

    def prune_manifests(self, keep: set[str], oldest: int | None = None,
                        min_age_s: float = 3600) -> None:
        """Delete per-version manifests not named in ``keep``: at once when their version
        is older than ``oldest`` (default: every kept one's; a reader maps a version's
        search files as it opens it, ``Searcher``, and the versions kept are the current
        and the previous), else once older than ``min_age_s``. Keeping every old version
        an hour let a watcher's commits pile up gigabytes of search files."""
        cutoff = time.time() - min_age_s
        if oldest is None:
            oldest = min((int(found.group(1)) for name in keep
                          if (found := _VERSIONED.fullmatch(name))), default=0)
        for path in (self.path / "manifests").glob("*.arrow"):
            found = _VERSIONED.fullmatch(path.name)
            if found is None or path.name in keep:
                continue
            if int(found.group(1)) < oldest or path.stat().st_mtime < cutoff:
                path.unlink(missing_ok=True)
        # half-written files of builds that were killed (this one holds the build lock)
        for path in (self.path / "manifests").glob(".*.arrow.*"):
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
            raise _unreadable(path, exc) from exc

    def manifest_batches(self, name: str) -> tuple[pa.Schema, int, Iterator[pa.RecordBatch]]:
        """A manifest's schema, row count and record batches, each read into memory as it
        is reached: the pages of a mapped file stay resident once touched, so a pass over
        a whole one (``read_manifest(mmap=True)``) holds its size to the end."""
        import pyarrow.ipc as ipc

        path = str(self.path / "manifests" / name)
        try:
            reader = ipc.open_file(path)
            rows = reader.count_rows()
        except (OSError, pa.ArrowException) as exc:
            raise _unreadable(path, exc) from exc

        def batches() -> Iterator[pa.RecordBatch]:
            with reader:
                for i in range(reader.num_record_batches):
                    try:
                        batch = reader.get_batch(i)
                    except (OSError, pa.ArrowException) as exc:
                        raise _unreadable(path, exc) from exc
                    yield batch

        return reader.schema, rows, batches()


def status_data(index_path: Path) -> dict[str, Any]:
    """What an index holds and how it was built (``ssindex status``, MCP ``status``): and
    the build running on it, if one is (``build``: null when none)."""
    index = IndexDir(index_path)
    build = running_build(index.path)
    if build is not None and not index.exists():  # the first build, before its commit
        return {"index": str(index_path), "searchable": False, "build": build}
    head = index.read_head().data
    stats = head.get("stats", {})
    return {
        "index": str(index_path), "files": head["files"], "chunks": head["chunks"],
        "files_skipped": stats.get("files_skipped", {}),
        "secrets": "allowed" if stats.get("secrets_allowed") else
        f"{stats.get('files_skipped', {}).get('secret', 0)} files skipped, "
        f"{stats.get('secrets_redacted', 0)} values redacted",
        "model": head["model"]["id"], "quantization": head["quantization"],
        "index_version": FORMAT_VERSION, "table_version": head["table_version"],
        "built_at": head["built_at"], "root": head["root"],
        "dense_coverage": round(float(head.get("dense_coverage", 1.0)), 4),
        "build": build,
    }


def default_index_path(root: Path) -> Path:
    return Path(root) / ".ssindex"


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _unreadable(path: str, exc: Exception) -> IndexCorrupt:
    return IndexCorrupt(f"cannot read {path} ({exc}): the index is damaged; "
                        "remove it and run `ssindex build`")
