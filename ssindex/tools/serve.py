"""``ssindex serve``: an index as a Model Context Protocol server over stdio.

One ``Searcher`` is opened and warmed before the first request, so every
query pays only for itself. When a build commits a new ``HEAD.json`` the
searcher is reopened (and warmed) on the next call, so a long-lived server
never reads a version that a later build's cleanup may delete.

``--watch`` runs ``ssindex watch`` (``ssindex.tools.watch``) on a thread of the server:
each commit reopens the searcher there, off the request path, and both tools report
the index's version and how many changed files it does not hold yet.

stdout carries the protocol alone: while the index and model load, file
descriptor 1 points at stderr, and searches run with ``sys.stdout`` on stderr.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ssindex.errors import ConfigError, IndexNotFound, SsindexError
from ssindex.index.layout import HEAD, status_data
from ssindex.query.filters import Filters
from ssindex.query.searcher import Searcher

if TYPE_CHECKING:
    from ssindex.config import BuildConfig
    from ssindex.tools.watch import Watcher

INSTRUCTIONS = (
    "Code search over one indexed repository. `search` returns ranked chunks "
    "(path, start_line, end_line, symbol, kind, score, text); `status` says what "
    "the index holds and when it was built."
)
RESULT_FIELDS = ("path", "start_line", "end_line", "language", "symbol", "kind", "is_test",
                 "score", "text")


class WarmSearcher:
    """A warmed ``Searcher`` that follows the index's committed HEAD. With ``lazy``, an
    index not built yet is opened once its first version is committed."""

    def __init__(self, index_path: Path, backend: str | None = None,
                 trust_remote_code: bool = False, lazy: bool = False) -> None:
        self.index_path = index_path
        self.backend = backend
        self.trust_remote_code = trust_remote_code
        self._lock = threading.Lock()
        self._opening = threading.Lock()
        self._head_stamp = (0, 0)
        self._searcher: Searcher | None = None
        self.refresh(force=not lazy)

    def search(self, query: str, k: int = 10, mode: str = "hybrid",
               filters: Filters | None = None, context: int = 0) -> dict[str, Any]:
        self.refresh()
        with self._lock, contextlib.redirect_stdout(sys.stderr):
            if self._searcher is None:
                raise IndexNotFound(f"no index at {self.index_path} yet: its first build "
                                    "is running (see the status tool)")
            data = self._searcher.search(query, k=k, mode=mode, filters=filters,
                                         context=context).as_json()
            data["table_version"] = self._searcher.head.table_version
        if data.get("abstained"):
            return {**data, "results": []}
        kept = RESULT_FIELDS + (("context",) if context else ())
        data["results"] = [{key: hit.get(key) for key in kept} for hit in data["results"]]
        return data

    def refresh(self, force: bool = False) -> None:
        """Reopen (and warm) the searcher if a build committed since it was opened (or
        open it, with ``force``); the searcher it replaces serves searches meanwhile."""
        with self._opening:
            stamp = self._stamp()
            if not force and (stamp == self._head_stamp or stamp == (0, 0)):
                return
            with contextlib.redirect_stdout(sys.stderr):
                fresh = Searcher(self.index_path, self.backend, self.trust_remote_code)
                fresh.warm(self._searcher)
            with self._lock:
                self._searcher, self._head_stamp = fresh, stamp

    def _stamp(self) -> tuple[int, int]:
        try:
            info = os.stat(self.index_path / HEAD)
        except OSError:
            return (0, 0)
        return (info.st_mtime_ns, info.st_ino)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout, by Python or native code, to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _mcp_api() -> tuple[Any, type[Exception]]:
    """The server class and ``ToolError``: ``MCPServer`` (mcp 2.x) or ``FastMCP`` (mcp 1.x)."""
    for package, name in (("mcp.server.mcpserver", "MCPServer"), ("mcp.server.fastmcp", "FastMCP")):
        try:
            server = getattr(importlib.import_module(package), name)
            tool_error = importlib.import_module(f"{package}.exceptions").ToolError
        except ImportError:
            continue
        return server, tool_error
    raise ConfigError("`ssindex serve` needs the mcp package: pip install 'ssindex[serve]'")


def create_server(index_path: Path, backend: str | None = None,
                  trust_remote_code: bool = False, watcher: Watcher | None = None) -> Any:
    """The MCP server for ``index_path``, its searcher already open and warm; with a
    ``watcher``, whose commits it follows (the watcher is not started here)."""
    server_class, tool_error = _mcp_api()
    searcher = WarmSearcher(index_path, backend, trust_remote_code, lazy=watcher is not None)
    if watcher is not None:
        watcher.on_commit = searcher.refresh
    server = server_class("ssindex", instructions=INSTRUCTIONS, log_level="WARNING")

    def fresh(data: dict[str, Any]) -> dict[str, Any]:
        return data if watcher is None else {**data, "watch": watcher.freshness().as_json()}

    @server.tool()
    def search(query: str, k: int = 10, mode: str = "hybrid", path: list[str] | None = None,
               exclude: list[str] | None = None, lang: list[str] | None = None,
               kind: list[str] | None = None, symbol: str | None = None,
               tests: str = "include", context: int = 0) -> dict[str, Any]:
        """Search the code index; mode is hybrid, lexical or semantic.

        Filters, applied before ranking: `path` and `exclude` take gitignore-style globs
        (`src/`, `*.go`); `lang` languages (python, go...); `kind` chunk kinds (function,
        method, class, module...); `symbol` a name, or a prefix ending in `*`; `tests`
        include, only or exclude test code. `context` adds that many lines around each
        result. Returns the query, mode and `results`: ranked chunks, best first, each
        with path, start_line, end_line, language, symbol, kind, is_test, score and text;
        `table_version`, the index version searched, and under `serve --watch`, `watch`:
        `stale_files` (changed files not in that version yet) and `building`.
        """
        try:
            filters = Filters.of(path, exclude, lang, kind, symbol, tests)
            return fresh(searcher.search(query, k=k, mode=mode, filters=filters,
                                         context=context))
        except SsindexError as exc:  # the agent's to read and correct, e.g. a bad mode
            raise tool_error(str(exc)) from exc

    @server.tool()
    def status() -> dict[str, Any]:
        """What the index holds (files, chunks, model), its version and when it was built;
        under `serve --watch`, `watch`: how many changed files it does not hold yet."""
        try:
            return fresh(status_data(index_path))
        except IndexNotFound as exc:
            if watcher is None:
                raise tool_error(str(exc)) from exc
            return fresh({"index": str(index_path), "searchable": False, "build": None})
        except SsindexError as exc:
            raise tool_error(str(exc)) from exc

    return server


def serve(index_path: Path, backend: str | None = None, trust_remote_code: bool = False,
          watch: tuple[Path, BuildConfig, int] | None = None) -> None:
    """Serve ``index_path`` over stdio until the client closes the connection; ``watch``
    (root, build settings, debounce in ms) keeps it current as the root's files change."""
    watcher = None
    with stdout_to_stderr():
        if watch is not None:
            from ssindex.tools.watch import Watcher

            root, cfg, debounce = watch
            watcher = Watcher(root, index_path, cfg, debounce)
        server = create_server(index_path, backend, trust_remote_code, watcher)
        if watcher is not None:
            threading.Thread(target=watcher.run, daemon=True, name="ssindex-watch").start()
            what = f"watching {watcher.root}"
        else:
            info = status_data(index_path)
            what = f"{info['chunks']} chunks, {info['model']}"
        # stdout is the protocol's: the one line a person sees goes to stderr
        print(f"ssindex serve: {index_path} ({what}), MCP over stdio; Ctrl-C or closing "
              "stdin stops it", file=sys.stderr, flush=True)
    try:
        server.run("stdio")
    finally:
        if watcher is not None:
            watcher.stop()
