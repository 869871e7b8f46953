"""The live index's commands: ``serve`` (MCP, ``--watch``), ``watch``, ``mcp-config``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ssindex.cli.app import (
    DEBOUNCE_MS,
    BackendOpt,
    ConfigOpt,
    DebounceOpt,
    DimsOpt,
    IndexOpt,
    LocalIndexOpt,
    ModelOpt,
    NoCacheOpt,
    RootOpt,
    TrustOpt,
    app,
    err,
    index_for,
)
from ssindex.errors import ConfigError, SsindexError


@app.command()
def serve(index: IndexOpt = None, backend: BackendOpt = None,
          trust_remote_code: TrustOpt = False,
          watch: Annotated[bool, typer.Option(
              "--watch", help="Keep the index current as files change (ssindex watch on a "
              "thread of the server).")] = False,
          root: RootOpt = None, config: ConfigOpt = None,
          debounce: DebounceOpt = DEBOUNCE_MS,
          no_shared_cache: NoCacheOpt = False) -> None:
    """Serve an index to coding agents: an MCP server over stdio (needs ssindex[serve])."""
    from ssindex.backends.names import parse_overrides
    from ssindex.tools.serve import serve as run_server

    query_backend = parse_overrides(backend or []).get("embed_query")
    if not watch:
        if root is not None or config is not None or no_shared_cache:
            raise ConfigError("--root, --config and --no-shared-cache need --watch")
        run_server(index_for(index), query_backend, trust_remote_code)
        return
    from ssindex.tools.options import build_config

    tree = _watched_root(root, index)
    cfg = build_config(config, trust_remote_code=trust_remote_code,
                       no_shared_cache=no_shared_cache)
    run_server(index_for(index, tree), query_backend, trust_remote_code,
               (tree, cfg, debounce))


def _watched_root(root: Path | None, index: str | None) -> Path:
    """``--root``, else the root the index at ``--index`` was built from, else '.'."""
    if root is not None or index is None:
        return root or Path(".")
    from ssindex.index.layout import IndexDir

    try:
        return Path(IndexDir(index_for(index)).read_head().data["root"])
    except SsindexError as exc:
        raise ConfigError(f"--index {index} has no root to watch yet: give --root") from exc


@app.command()
def watch(
    path: Annotated[Path, typer.Argument(help="Directory to keep indexed.")] = Path("."),
    index: LocalIndexOpt = None, config: ConfigOpt = None, model: ModelOpt = None,
    dims: DimsOpt = None, trust_remote_code: TrustOpt = False, backend: BackendOpt = None,
    debounce: DebounceOpt = DEBOUNCE_MS,
    threads: Annotated[int | None, typer.Option(
        "--threads", min=1, help="Threads the model may use (default: half the cores).")] = None,
    nice: Annotated[int, typer.Option(
        "--nice", min=0, max=19, help="How much to lower this process's priority.")] = 10,
    no_shared_cache: NoCacheOpt = False,
) -> None:
    """Keep PATH's index current: an incremental build after each burst of file changes."""
    import signal

    from ssindex.backends.names import parse_overrides
    from ssindex.tools.options import build_config
    from ssindex.tools.watch import Watcher, default_threads, polite, say_on_stderr

    if index is not None and "://" in index:
        raise ConfigError("ssindex watch keeps a local index: build to object storage with "
                          "`ssindex build --index URI`")
    cfg = build_config(config, model=model, dims=dims, trust_remote_code=trust_remote_code,
                       no_shared_cache=no_shared_cache)
    cores = threads or default_threads()
    polite(cores, nice)
    watcher = Watcher(path, Path(index) if index else None, cfg, debounce,
                      parse_overrides(backend or []))
    terminated = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal terminated
        if not terminated:
            terminated = True
            watcher.stop()  # the watch ends after this build even if the interrupt is lost
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    say_on_stderr(f"watching {watcher.root} into {watcher.index} (debounce {debounce} ms, "
                  f"{cores} thread{'s' if cores > 1 else ''}, nice {nice}); Ctrl-C stops")
    code = 0
    try:
        watcher.run()
    except KeyboardInterrupt:
        code = 0 if terminated else 130
    say_on_stderr("stopped: searches see the last committed version")
    _leave(code)


def _leave(code: int) -> None:
    """Exit now, past the interpreter's teardown. After a build abandoned mid-batch, native
    thread pools (ONNX Runtime's, torch's, Lance's) torn down there can abort the process
    ("terminate called without an active exception": 1 SIGTERM in about 50 here) or hang.
    Nothing is left to finish: a commit is atomic, and the lock and shared cache are
    released by then."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@app.command(name="mcp-config")
def mcp_config(
    client: Annotated[str, typer.Option(
        "--client", help="claude, codex, cursor or generic.")] = "generic",
    root: Annotated[Path, typer.Option("--root", help="The repository to serve.")] = Path("."),
    index: LocalIndexOpt = None,
) -> None:
    """Print the snippet that registers `ssindex serve --watch` with a coding agent."""
    from ssindex.tools.clients import snippet

    if index is not None and "://" in index:
        raise ConfigError("serve --watch keeps a local index current: give a directory")
    found = snippet(client, root, Path(index) if index else None)
    sys.stdout.write(found.text)
    err.print(found.where, highlight=False, soft_wrap=True, markup=False)


