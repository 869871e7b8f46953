"""``ssindex watch``: keep an index current as files change.

File-system events (inotify on Linux, FSEvents on macOS, through watchfiles) start
incremental builds in one warm process: the encoders and the shared vector cache stay
open between builds (``pipeline.build.Warm``), so a one-file change costs a walk, that
file's chunks and a commit.

1. Listen: a thread collects events. Those that cannot change the index are dropped at
   once: the index directory, denied directories (``.git``, ``node_modules``...) and
   paths the ignore files exclude (``walk.Rules``). An edit to an ignore file counts, and
   the rules are read again.
2. Settle: a build starts once ``debounce`` ms pass without a new event, so an editor's
   save (a temp file, then a rename) or a ``git checkout`` of hundreds of files is one
   build. Events that arrive during a build wait for the next one.
3. Build: ``ssindex build``'s incremental path, which reads only the files whose stat
   changed. A build that fails (a full disk, a vanished file) is one line; the watcher
   goes on, and the next change retries.

It is polite by default: a lowered priority (``nice``) and half the cores at most
(``SSINDEX_THREADS``), so an editor beside it stays responsive.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ssindex.backends.inventory import THREADS_ENV
from ssindex.config import BuildConfig
from ssindex.errors import ConfigError
from ssindex.index.layout import default_index_path
from ssindex.pipeline.build import Warm, build
from ssindex.stages.walk import IGNORE_FILES, Rules, check_root

_MAX_GROUPING_MS = 5_000
"""watchfiles hands events over at the latest after this long, even while they keep coming."""
_STEP_MS = 20
"""How long watchfiles waits for another event before it hands a group over; the watcher's
``debounce`` comes on top."""


def polite(threads: int, nice: int) -> None:
    """Cap the threads backends run on and lower this process's priority."""
    os.environ[THREADS_ENV] = str(threads)
    os.environ["RAYON_NUM_THREADS"] = str(threads)  # the tokenizers' pool, if ever on
    if nice:
        with contextlib.suppress(OSError):  # not permitted: run at the priority given
            os.nice(nice)


def default_threads() -> int:
    return max(1, (os.cpu_count() or 1) // 2)


@dataclass
class Freshness:
    """How current the index is, for ``ssindex serve --watch``'s tools."""

    watching: bool
    stale_files: int
    """Changed paths not yet in a committed version (waiting, or being built)."""
    building: bool
    builds: int
    last_error: str | None

    def as_json(self) -> dict[str, Any]:
        return {"watching": self.watching, "stale_files": self.stale_files,
                "building": self.building, "builds": self.builds,
                "last_error": self.last_error}


class _Notices:
    """A build's progress, reduced to its notices (a fallback, a broken stale lock)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say

    def advance(self, stage: str, amount: int = 1) -> None:
        pass

    def message(self, text: str) -> None:
        self._say(f"warning: {text}")

    def restart(self, text: str) -> None:
        self._say(text)


def say_on_stderr(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


class Watcher:
    """Builds ``root`` into ``index`` now, then again on every settled burst of changes,
    until ``stop``."""

    def __init__(self, root: Path, index: Path | None, cfg: BuildConfig | None,
                 debounce_ms: int, overrides: dict[str, str] | None = None,
                 say: Callable[[str], None] = say_on_stderr,
                 on_commit: Callable[[], None] | None = None) -> None:
        if debounce_ms < 0:
            raise ConfigError("--debounce must be at least 0 ms")
        self.root = check_root(Path(root))
        self.index = Path(index).resolve() if index else default_index_path(self.root)
        self.cfg = cfg or BuildConfig()
        self.debounce = debounce_ms / 1000
        self.overrides = overrides
        self.say = say
        self.on_commit = on_commit
        self.builds = 0
        self.last_error: str | None = None
        self._rules = Rules(self.root, self.cfg.walk)
        self._warm = Warm()
        self._changed = threading.Condition()
        self._pending: set[str] = set()
        self._building: set[str] = set()
        self._unbuilt: set[str] = set()
        """Paths of a failed build: stale until a later build commits."""
        self._last_event = 0.0
        self._stop = threading.Event()
        self._listener: threading.Thread | None = None
        self._failure: BaseException | None = None

    # -- public -------------------------------------------------------------------------
    def run(self) -> None:
        """Watch until ``stop`` (or a signal's exception in this thread)."""
        self._listener = threading.Thread(target=self._listen, daemon=True,
                                          name="ssindex-watch-events")
        self._listener.start()
        try:
            self._build(set())  # the index may be missing or stale
            while True:
                batch = self._settled()
                if batch is None:
                    break
                self._build(batch)
        finally:
            self._stop.set()
            self._listener.join(timeout=5)
            self._warm.close()
        if self._failure is not None:
            raise ConfigError(f"cannot watch {self.root}: {self._failure}")

    def stop(self) -> None:
        self._stop.set()
        with self._changed:
            self._changed.notify_all()

    def freshness(self) -> Freshness:
        with self._changed:
            stale = self._pending | self._building | self._unbuilt
            return Freshness(not self._stop.is_set(), len(stale), bool(self._building),
                             self.builds, self.last_error)

    # -- the three steps ----------------------------------------------------------------
    def _listen(self) -> None:
        """Step 1, on its own thread: hand each relevant change to ``_pending``."""
        try:
            import watchfiles  # a missing module fails the watch, not just this thread

            for changes in watchfiles.watch(self.root, watch_filter=None,
                                            debounce=_MAX_GROUPING_MS, step=_STEP_MS,
                                            stop_event=self._stop, raise_interrupt=False,
                                            ignore_permission_denied=True):
                relevant = {rel for rel in map(self._relative, (path for _, path in changes))
                            if rel is not None}
                if relevant:
                    with self._changed:
                        self._pending |= relevant
                        self._last_event = time.monotonic()
                        self._changed.notify_all()
        except Exception as exc:  # the watch itself broke (a file-watch limit, a lost root)
            self._failure = exc
            self.stop()

    def _relative(self, path: str) -> str | None:
        """``path`` relative to the root, if a change there can change the index."""
        if path == str(self.index) or path.startswith(f"{self.index}{os.sep}"):
            return None
        rel = os.path.relpath(path, self.root).replace(os.sep, "/")
        if rel.startswith("../") or rel in (".", ".."):
            return None
        if PurePosixPath(rel).name in IGNORE_FILES:
            self._rules.forget()
        return rel if self._rules.indexable(rel) else None

    def _settled(self) -> set[str] | None:
        """Step 2: the changes once ``debounce`` passed without another (``None``: stop)."""
        with self._changed:
            while not self._stop.is_set():
                if not self._pending:
                    self._changed.wait(0.5)
                    continue
                quiet = time.monotonic() - self._last_event
                if quiet >= self.debounce:
                    batch, self._pending = self._pending, set()
                    self._building = set(batch)
                    return batch
                self._changed.wait(self.debounce - quiet)
        return None

    def _build(self, batch: set[str]) -> None:
        """Step 3: one incremental build; a failure is one line, and the watch goes on."""
        started = time.monotonic()
        try:
            stats = build(self.root, self.index, self.cfg, self.overrides,
                          progress=_Notices(self.say), warm=self._warm,
                          committed=self._committed)
        except Exception as exc:  # a failed build must not end the watch: say it, go on
            if self._stop.is_set():  # stopped mid-build: abandoned, not failed
                self.say("build abandoned: the watch is stopping")
                return
            self.last_error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            with self._changed:
                self._unbuilt |= batch
                self._building = set()
            self.say(f"build failed ({self.last_error}); retrying on the next change")
            return
        with self._changed:
            self._unbuilt.clear()
            self._building = set()
            self.builds += 1
            self.last_error = None
        self.say(_summary(stats, time.monotonic() - started))

    def _committed(self) -> None:
        """A version was committed: ``on_commit`` runs now, not once the build has
        cleaned up (a server's reopen then starts with the version)."""
        if self.on_commit is None:
            return
        try:
            self.on_commit()
        except Exception as exc:  # the commit stands; searches reopen on their own
            self.say(f"warning: after the commit: {type(exc).__name__}: {exc}")


def _summary(stats: dict[str, Any], seconds: float) -> str:
    embedded = stats["chunks_embedded"]
    backend = stats["backends"]["embed_bulk"].get("backend") if embedded else None
    return (f"indexed: {stats['files_changed']} changed, {stats['files_new']} new, "
            f"{stats['files_removed']} removed; {embedded} chunks embedded"
            f"{f' ({backend})' if backend else ''}, {stats['chunks_total']} in all; "
            f"{seconds:.2f} s (version {stats['table_version']})")
