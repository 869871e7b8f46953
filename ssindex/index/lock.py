"""Advisory builder lock: one builder per index directory.

``fcntl.flock`` is released by the kernel when its holder dies, so a dead
builder can never block the next one. The lock file also records the
holder's pid: finding a pid there that is no longer alive means the last
build died, which is reported as a broken stale lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from ssindex.errors import IndexLocked, storage_faults


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class BuildLock:
    def __init__(self, index_path: Path, warn: Callable[[str], None] | None = None) -> None:
        self.path = Path(index_path) / "lock"
        self._warn = warn
        self._fd: int | None = None

    def __enter__(self) -> BuildLock:
        with storage_faults("the build lock", self.path.parent):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise IndexLocked(
                f"another build (pid {holder}) is writing {self.path.parent}; wait for it"
            ) from exc
        previous = os.pread(fd, 32, 0).decode(errors="replace").strip()
        stale = previous.isdigit() and int(previous) != os.getpid() and not _alive(int(previous))
        if stale and self._warn is not None:
            self._warn(f"broke stale lock of dead build (pid {previous}); resuming")
        try:
            with storage_faults("the build lock", self.path.parent):
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._fd is not None:
            # on a disk that turned read-only the pid stays: the flock is what counts
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
