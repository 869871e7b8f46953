"""A machine's shared cache of embedded vectors: a second clone, git worktree or branch of
the same code embeds only the chunks this machine has never embedded, and parses only the
files it has never chunked (their cuts are kept too, ``engines.pool.Preparer``).

Entries are addressed by embed key, which already names the model, its settings and the
exact text embedded (``stages.embed.embed_key``), so one cache serves every index and
model. Vectors are kept as float32, as embedded: any quantization starts from them, and
an index built from cached vectors quantizes exactly as one that embedded them.

It lives in one SQLite database (``<cache dir>/vectors-v1.sqlite3``). Written by hand it
would need atomic multi-writer commits, a crash-safe journal and an ordered index for
eviction; SQLite brings all three, and a Python standard-library module to reach it.
Each row holds its vector, an xxh3 checksum of key and vector, and when it was last
used; past ``max_mb`` the least recently used rows go. Nothing is pickled.

A cache never fails a build: an entry whose checksum fails is dropped and embedded
again; a database that cannot be read is set aside and started afresh; one that cannot
be written (read-only, full, locked past the timeout) is left alone for the rest of
the build, with one notice.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from ssindex.util.dirs import cache_dir

ENV_SWITCH = "SSINDEX_SHARED_CACHE"
"""``off`` (or ``0``, ``false``, ``no``) turns the shared cache off, as
``--no-shared-cache`` does."""
FILE_NAME = "vectors-v1.sqlite3"
"""Versioned: a cache of another layout is another file, never misread."""
_BATCH = 900
"""Keys per statement: under SQLite's oldest limit of 999 bound variables."""
_LOCK_TIMEOUT_S = 10.0
_EVICT_TO = 0.9
"""Eviction frees room down to this share of the bound, so it runs rarely."""
_SCHEMA = """
CREATE TABLE IF NOT EXISTS vectors (
    key TEXT NOT NULL UNIQUE,
    vector BLOB NOT NULL,
    checksum TEXT NOT NULL,
    used INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS vectors_by_use ON vectors (used);
CREATE TABLE IF NOT EXISTS fits (key TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cuts (
    key TEXT NOT NULL UNIQUE,
    cuts TEXT NOT NULL,
    checksum TEXT NOT NULL,
    used INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS cuts_by_use ON cuts (used);
"""
"""A rowid table on 8 KiB pages: 1.7 KB a 384-wide vector on disk. A ``WITHOUT ROWID``
table (rows in the key's B-tree) took 4.7 KB on 4 KiB pages and wrote 5x slower: its
rows overflow at this size. ``fits`` holds the keys whose text a build measured to fit
the model's window (``stages.embed.ModelWindow``), while their vector is cached. ``cuts``
holds where the chunker cut each file it chunked, by its text and settings
(``engines.pool.Preparer``), as JSON."""
_PAGE_SIZE = 8192


def enabled_by_environment() -> bool:
    """Whether ``SSINDEX_SHARED_CACHE`` leaves the shared cache on (the default)."""
    return os.environ.get(ENV_SWITCH, "").strip().lower() not in {"off", "0", "false", "no"}


def _batches(keys: list[str]) -> Iterator[tuple[list[str], str]]:
    """``keys`` in statement-sized parts, each with its ``?`` placeholders."""
    for start in range(0, len(keys), _BATCH):
        part = keys[start:start + _BATCH]
        yield part, ",".join("?" * len(part))


def _checksum(key: str, blob: bytes) -> str:
    return xxhash.xxh3_64_hexdigest(key.encode() + b"\0" + blob)


@dataclass(slots=True)
class CacheStats:
    hits: int = 0
    """Vectors taken from the cache."""
    stored: int = 0
    rejected: int = 0
    """Entries that failed their checksum (or had the wrong width): dropped, re-embedded."""
    evicted: int = 0
    replayed: int = 0
    """Files chunked by the cuts recorded for them, not parsed and fitted again."""


class VectorCache:
    """Float32 vectors by embed key, shared by every build on this machine."""

    def __init__(self, max_mb: int, path: Path | None = None,
                 warn: Callable[[str], None] = lambda message: None,
                 readonly: bool = False) -> None:
        """``readonly``: a reader of a cache the build's own process keeps (a worker
        process); it never changes the file, nor sets a damaged one aside."""
        self.path = path or cache_dir() / FILE_NAME
        self._readonly = readonly
        self.max_bytes = max_mb * 1024 * 1024
        self.stats = CacheStats()
        self._warn = warn
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._broken = False

    # -- public -------------------------------------------------------------------------
    def lookup(self, keys: list[str], dim: int, touch: bool = True) -> dict[str, np.ndarray]:
        """The cached vectors of ``keys`` that are whole and ``dim`` wide; with ``touch``,
        marks them used and counts them as hits (a survey's look does neither)."""
        found: dict[str, np.ndarray] = {}
        bad: list[str] = []
        with self._session("read") as db:
            if db is None:
                return {}
            for part, marks in _batches(keys):
                rows = db.execute(
                    f"SELECT key, vector, checksum FROM vectors WHERE key IN ({marks})",
                    part).fetchall()
                for key, blob, checksum in rows:
                    if len(blob) != 4 * dim or _checksum(key, blob) != checksum:
                        bad.append(key)
                    else:
                        found[key] = np.frombuffer(blob, dtype=np.float32).copy()
            now = time.time_ns()
            hit = list(found) if touch else []
            for part, marks in _batches(hit):
                db.execute(f"UPDATE vectors SET used = ? WHERE key IN ({marks})", [now, *part])
            db.executemany("DELETE FROM vectors WHERE key = ?", [(key,) for key in bad])
        self.stats.hits += len(found) if touch else 0
        self.stats.rejected += len(bad)
        return found

    def store(self, keys: list[str], vectors: np.ndarray) -> None:
        """Keep ``vectors`` (one row per key) for later builds; evict past the bound."""
        if not keys:
            return
        now = time.time_ns()
        rows = []
        for key, vector in zip(keys, np.asarray(vectors, dtype=np.float32), strict=True):
            blob = vector.tobytes()
            rows.append((key, blob, _checksum(key, blob), now))
        with self._session("write") as db:
            if db is None:
                return
            db.executemany("INSERT OR REPLACE INTO vectors (key, vector, checksum, used) "
                           "VALUES (?, ?, ?, ?)", rows)
            self.stats.stored += len(rows)
            self._evict(db)

    def fitting(self, keys: list[str]) -> set[str]:
        """Those of ``keys`` whose text a build measured to fit the model's window."""
        found: set[str] = set()
        with self._session("read") as db:
            if db is None:
                return found
            for part, marks in _batches(keys):
                found.update(key for (key,) in db.execute(
                    f"SELECT key FROM fits WHERE key IN ({marks})", part))
        return found

    def store_fits(self, keys: list[str]) -> None:
        """Remember that the texts of ``keys`` fit the model's window."""
        if not keys:
            return
        with self._session("write") as db:
            if db is not None:
                db.executemany("INSERT OR IGNORE INTO fits (key) VALUES (?)",
                               [(key,) for key in keys])

    def cuts(self, key: str) -> str | None:
        """The cuts recorded under ``key`` when whole (a failed checksum reads as none:
        the file is chunked again and its cuts recorded anew)."""
        with self._session("read") as db:
            row = None if db is None else db.execute(
                "SELECT cuts, checksum FROM cuts WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        if _checksum(key, row[0].encode()) != row[1]:
            self.stats.rejected += 1
            return None
        return str(row[0])

    def store_cuts(self, cuts: dict[str, str | None]) -> None:
        """Record files' cuts by key; ``None`` for cuts replayed from here (marked used)."""
        now = time.time_ns()
        replayed = [key for key, value in cuts.items() if value is None]
        with self._session("write") as db:
            if db is None:
                return
            db.executemany("INSERT OR REPLACE INTO cuts (key, cuts, checksum, used) "
                           "VALUES (?, ?, ?, ?)",
                           [(key, value, _checksum(key, value.encode()), now)
                            for key, value in cuts.items() if value is not None])
            for part, marks in _batches(replayed):
                db.execute(f"UPDATE cuts SET used = ? WHERE key IN ({marks})", [now, *part])
        self.stats.replayed += len(replayed)

    def ready(self) -> None:
        """Open the database now, creating its tables, before worker processes read it."""
        with self._session("open"):
            pass

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    # -- internals ----------------------------------------------------------------------
    @contextlib.contextmanager
    def _session(self, doing: str) -> Iterator[sqlite3.Connection | None]:
        """One transaction on the database, or ``None`` once the cache is out of use."""
        with self._lock:
            db = self._connection()
            if db is None:
                yield None
                return
            try:
                with db:  # commits, or rolls back on any error
                    yield db
            except sqlite3.DatabaseError as exc:
                self._give_up(f"could not {doing} it: {exc}")

    def _connection(self) -> sqlite3.Connection | None:
        if self._broken:
            return None
        if self._db is None:
            try:
                self._db = self._open()
            except sqlite3.DatabaseError as exc:
                if self._readonly:
                    self._give_up(f"could not open it: {exc}")
                    return None
                # not a database, or a damaged one: start afresh
                self._set_aside()
                try:
                    self._db = self._open()
                except (sqlite3.Error, OSError) as exc:
                    self._give_up(f"could not open it: {exc}")
            except (sqlite3.Error, OSError) as exc:
                self._give_up(f"could not open it: {exc}")
        return self._db

    def _open(self) -> sqlite3.Connection:
        if self._readonly:
            return sqlite3.connect(f"{self.path.as_uri()}?mode=ro", uri=True,
                                   timeout=_LOCK_TIMEOUT_S, check_same_thread=False)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=_LOCK_TIMEOUT_S, isolation_level=None,
                             check_same_thread=False)
        try:
            db.execute(f"PRAGMA page_size = {_PAGE_SIZE}")  # these two take on a new file
            db.execute("PRAGMA auto_vacuum = INCREMENTAL")
            db.execute("PRAGMA journal_mode = WAL")  # readers never wait for a writer
            db.execute("PRAGMA synchronous = NORMAL")  # a crash loses a batch, never the file
            db.executescript(_SCHEMA)
            db.execute("SELECT count(*) FROM vectors").fetchone()  # a damaged file fails here
        except BaseException:
            db.close()
            raise
        db.isolation_level = "DEFERRED"  # ``with db`` now opens and commits transactions
        return db

    def _set_aside(self) -> None:
        """Move a database that cannot be read out of the way (kept for a post-mortem)."""
        self._warn(f"shared vector cache {self.path} is damaged: starting a new one")
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                os.replace(f"{self.path}{suffix}", f"{self.path}.damaged{suffix}")

    def _give_up(self, why: str) -> None:
        if not self._broken:
            self._warn(f"shared vector cache {self.path} not used for the rest of this "
                       f"build: {why}")
        self._broken = True
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = None

    def _evict(self, db: sqlite3.Connection) -> None:
        """Drop the least recently used rows once the live pages pass ``max_bytes``."""
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
        used = (pages - free) * page_size
        if used <= self.max_bytes:
            return
        count = db.execute("SELECT count(*) FROM vectors").fetchone()[0]
        drop = count - int(count * _EVICT_TO * self.max_bytes / used)
        db.execute("DELETE FROM vectors WHERE rowid IN (SELECT rowid FROM vectors "
                   "ORDER BY used LIMIT ?)", (drop,))
        db.execute("DELETE FROM fits WHERE key NOT IN (SELECT key FROM vectors)")
        cuts = db.execute("SELECT count(*) FROM cuts").fetchone()[0]
        db.execute("DELETE FROM cuts WHERE rowid IN (SELECT rowid FROM cuts ORDER BY used "
                   "LIMIT ?)", (cuts - int(cuts * _EVICT_TO * self.max_bytes / used),))
        # the pragma frees one page per step, and only ``executescript`` steps it to the
        # end (it commits the transaction first, evictions included)
        db.executescript("PRAGMA incremental_vacuum;")
        self.stats.evicted += drop
