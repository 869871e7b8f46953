"""The ssindex exception tree.

The CLI catches ``SsindexError`` alone: it prints one line and exits non-zero.
Anything else is a bug and keeps its traceback.

    SsindexError
    ├── ConfigError            bad config file, option value or path
    ├── IndexNotFound          no index where one was expected
    ├── IndexCorrupt           an index whose head or tables cannot be read
    ├── IndexLocked            another live builder holds the index lock
    ├── IndexNotWritable       the index directory cannot be written
    ├── BackendUnavailable     an explicitly requested backend cannot run here
    ├── BackendExecutionError  a backend started but failed while encoding
    └── EngineUnavailable      the Ray engine cannot start (extra missing, cluster unreachable)
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Callable, Iterator
from typing import Any, ClassVar


class SsindexError(Exception):
    """Base class of every error ssindex reports to a user; ``exit_code`` is the CLI's,
    given as a class keyword: ``class IndexLocked(SsindexError, exit_code=4)``."""

    exit_code: ClassVar[int] = 2

    def __init_subclass__(cls, exit_code: int | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if exit_code is not None:
            cls.exit_code = exit_code


class ConfigError(SsindexError):
    """A config file, option value or input path is invalid."""


class IndexNotFound(SsindexError, exit_code=3):
    """No index exists at the given location."""


class IndexCorrupt(SsindexError, exit_code=3):
    """The index head or its tables cannot be read."""


class IndexLocked(SsindexError, exit_code=4):
    """Another live process is building this index."""


class IndexNotWritable(SsindexError, exit_code=5):
    """The index directory cannot be created or written."""


class BackendUnavailable(SsindexError, exit_code=6):
    """A requested embedding backend cannot run on this machine."""


class BackendExecutionError(SsindexError, exit_code=6):
    """An embedding backend failed while encoding."""


class EngineUnavailable(SsindexError, exit_code=7):
    """The requested execution engine cannot run (not installed, cluster unreachable)."""


class WorkerLost(SsindexError, exit_code=7):
    """A worker process of the build died (killed, out of memory, crashed) mid-task."""


_KINDS: list[type[SsindexError]] = [SsindexError, *SsindexError.__subclasses__()]
ERRORS = {kind.__name__: kind for kind in _KINDS}
"""Every error by class name: how an error reported as data (by a Ray task) is raised again."""


_STORAGE_FAULTS = {
    errno.ENOSPC: ("the disk is full", "free space, then build again"),
    errno.EDQUOT: ("the disk quota is used up", "free space, then build again"),
    errno.EROFS: ("the file system turned read-only",
                  "make it writable (or pass --index elsewhere), then build again"),
    errno.EACCES: ("permission was denied", "make the index directory writable"),
    errno.EISDIR: ("a directory stands where the index keeps a file", "remove that directory"),
}
_STORAGE_MESSAGES = {"no space left on device": errno.ENOSPC, "quota exceeded": errno.EDQUOT,
                     "read-only file system": errno.EROFS}


@contextlib.contextmanager
def storage_faults(what: str, where: object, *, head: bool = False) -> Iterator[None]:
    """A full, read-only or forbidden disk while writing ``what`` as one line that names
    the fix. A commit is the last write of a build (``HEAD.json``), so any of these
    leaves the previous index as it was, except a directory standing at the head
    itself (``head``): that hides every version. Lance reports the same faults as
    ``OSError`` or ``RuntimeError``, at times with the reason in its message alone."""
    try:
        yield
    except SsindexError:
        raise
    except (OSError, RuntimeError) as exc:
        code = getattr(exc, "errno", None)
        if code not in _STORAGE_FAULTS:
            text = str(exc).lower()
            code = next((c for message, c in _STORAGE_MESSAGES.items() if message in text),
                        None)
        if code is None:
            raise
        reason, fix = _STORAGE_FAULTS[code]
        after = "the previous index is intact and still answers searches"
        # a rename names the directory second, an open first
        if code == errno.EISDIR and (name := getattr(exc, "filename2", None)
                                     or getattr(exc, "filename", None)):
            fix = f"remove the directory {name}"
            if head:
                after = "until then no version of the index answers searches"
        raise IndexNotWritable(f"{reason} while writing {what} in {where}: {fix}; "
                               f"{after}") from exc


@contextlib.contextmanager
def map_exceptions(mapping: dict[type[BaseException] | tuple[type[BaseException], ...],
                                 Callable[[BaseException], SsindexError]]) -> Iterator[None]:
    """Turn a dependency's exceptions into ssindex errors at one boundary, in the style of
    httpx's ``map_exceptions``: ``mapping`` names the foreign kinds and builds the error
    for each. An ssindex error passes through; anything unmapped is a bug and keeps
    its traceback."""
    try:
        yield
    except SsindexError:
        raise
    except Exception as exc:
        for kinds, make in mapping.items():
            if isinstance(exc, kinds):
                raise make(exc) from exc
        raise


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (or its class's name, when empty)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
