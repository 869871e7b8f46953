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


class SsindexError(Exception):
    """Base class of every error ssindex reports to a user."""

    exit_code = 2


class ConfigError(SsindexError):
    """A config file, option value or input path is invalid."""


class IndexNotFound(SsindexError):
    """No index exists at the given location."""

    exit_code = 3


class IndexCorrupt(SsindexError):
    """The index head or its tables cannot be read."""

    exit_code = 3


class IndexLocked(SsindexError):
    """Another live process is building this index."""

    exit_code = 4


class IndexNotWritable(SsindexError):
    """The index directory cannot be created or written."""

    exit_code = 5


class BackendUnavailable(SsindexError):
    """A requested embedding backend cannot run on this machine."""

    exit_code = 6


class BackendExecutionError(SsindexError):
    """An embedding backend failed while encoding."""

    exit_code = 6


class EngineUnavailable(SsindexError):
    """The requested execution engine cannot run (not installed, cluster unreachable)."""

    exit_code = 7
