"""The ``ssindex`` application: the typer app, the options commands share, and the entry
point that turns errors into one line and an exit code."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from ssindex.errors import SsindexError

app = typer.Typer(
    name="ssindex", no_args_is_help=True, add_completion=False,
    help="Index a repository for code search, then search it.",
    pretty_exceptions_enable=False,
    # help texts are plain text: as rich markup, "ssindex[serve]" lost its "[serve]"
    rich_markup_mode=None,
)
err = Console(stderr=True)

IndexOpt = Annotated[str | None, typer.Option(
    "--index", help="Index directory, or an object-store URI (s3://bucket/prefix).")]
LocalIndexOpt = Annotated[str | None, typer.Option(
    "--index", help="Index directory, a local one (default: .ssindex in the tree).")]
BackendOpt = Annotated[list[str] | None, typer.Option(
    "--backend", help="PHASE=NAME, repeatable (phases: embed_bulk, embed_query).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object to stdout.")]
ModelOpt = Annotated[str | None, typer.Option("--model", help="Local HF model dir.")]
DimsOpt = Annotated[int | None, typer.Option(
    "--dims", min=1, help="Keep each vector's first N dimensions (Matryoshka models).")]
TrustOpt = Annotated[bool, typer.Option(
    "--trust-remote-code", help="Let a model that ships its own Python code run it.")]
NoCacheOpt = Annotated[bool, typer.Option(
    "--no-shared-cache", help="Neither take vectors from nor add them to this machine's "
    "shared vector cache.")]

DEBOUNCE_MS = 50
"""The default ``--debounce``: after watchfiles' own 20 ms of quiet (``tools.watch``), a build
waits 70 ms in all; an editor's save (a temp file renamed, or a truncate and a write) is over
in far less."""
DebounceOpt = Annotated[int, typer.Option(
    "--debounce", min=0, help="Quiet time in ms after the last change before a build.")]
RootOpt = Annotated[Path | None, typer.Option(
    "--root", help="The tree to watch (default: the index's recorded root, else '.').")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="TOML preset.")]


def emit(data: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(data, ensure_ascii=False) + "\n")


def index_for(index: str | None, fallback_root: Path = Path(".")) -> Path:
    """The local index to read: ``--index`` (a remote one pulled first), else the default."""
    from ssindex.index.layout import default_index_path
    from ssindex.index.remote import resolve_index

    return resolve_index(index) if index is not None else default_index_path(fallback_root)


def _version(value: bool) -> None:
    if value:
        from ssindex import __version__
        from ssindex.backends.model import ModelSpec

        print(f"ssindex {__version__}, model {ModelSpec.resolve(None).model_id}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True,
        help="Print the version and the bundled model's id, then exit.")] = False,
) -> None:
    """Index a repository for code search, then search it."""



def main() -> None:
    """Entry point. A usage error is one line and a hint (exit 2), an ``SsindexError`` one
    line with its own exit code; anything else is a bug and keeps its traceback."""
    # typer 0.28 vendors click: its exception classes live beside typer.BadParameter
    click = sys.modules[typer.BadParameter.__module__]
    try:
        code = app(standalone_mode=False)
    except SsindexError as exc:
        _error(str(exc))
        raise SystemExit(exc.exit_code) from None
    except click.NoArgsIsHelpError as exc:  # bare ``ssindex``: its message is the help
        print(exc.format_message())
        raise SystemExit(exc.exit_code) from None
    except click.UsageError as exc:
        _error(exc.format_message())
        if exc.ctx is not None:
            err.print(f"hint: see '{exc.ctx.command_path} --help'", markup=False,
                      highlight=False, soft_wrap=True)
        raise SystemExit(exc.exit_code) from None
    except click.ClickException as exc:
        _error(exc.format_message())
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        _error("aborted")
        raise SystemExit(1) from None
    raise SystemExit(code if isinstance(code, int) else 0)


def _error(message: str) -> None:
    err.print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
