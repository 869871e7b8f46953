"""The ``ssindex`` command line: a thin layer over the library API, split by command group
(``commands``: indexing and searching; ``live``: serving and watching).

Only ``SsindexError`` is caught: it becomes one line on stderr and a
non-zero exit code. Anything else is a bug and keeps its traceback.
"""

from ssindex.cli import commands, live  # noqa: F401 (each registers its commands on ``app``)
from ssindex.cli.app import app, main

__all__ = ["app", "main"]
