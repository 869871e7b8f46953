"""``build``, ``search``, ``status``, ``repair``, ``eval``, ``calibrate``, ``doctor``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from ssindex.cli.app import (
    BackendOpt,
    ConfigOpt,
    DimsOpt,
    IndexOpt,
    JsonOpt,
    ModelOpt,
    NoCacheOpt,
    TrustOpt,
    app,
    emit,
    err,
    index_for,
)
from ssindex.errors import ConfigError


@app.command()
def build(
    path: Annotated[Path, typer.Argument(help="Directory to index.")],
    index: IndexOpt = None,
    config: ConfigOpt = None,
    model: ModelOpt = None,
    dims: DimsOpt = None,
    trust_remote_code: TrustOpt = False,
    quantize: Annotated[str | None, typer.Option(
        "--quantize", help="int8 (default), int4 or none.")] = None,
    backend: BackendOpt = None,
    as_json: JsonOpt = False,
    no_progress: Annotated[bool, typer.Option(
        "--no-progress", help="No live display on a terminal: a plain progress line every "
        "10 s instead, as in logs (SSINDEX_PROGRESS_SECONDS).")] = False,
    allow_secrets: Annotated[bool, typer.Option(
        "--allow-secrets", help="Index secret files and values as they are (default: skip "
        "key and credential files, redact tokens and passwords).")] = False,
    check: Annotated[bool, typer.Option(
        "--check", help="Build nothing: exit 1 if the index is stale, 0 if current.")] = False,
    no_embed: Annotated[bool, typer.Option("--no-embed", help="A lexical index, no model "
                                           "loaded; a later build embeds it.")] = False,
    no_shared_cache: NoCacheOpt = False,
    workers: Annotated[int | None, typer.Option(
        "--workers", min=1, help="Processes that read and chunk files (default: most cores "
        "when a GPU embeds, else 1).")] = None,
    engine: Annotated[str, typer.Option(
        "--engine", help="local (default) or ray (needs the ray extra).")] = "local",
    ray_address: Annotated[str | None, typer.Option(
        "--ray-address", help="Ray cluster to join (default: start a local one).")] = None,
    embed_actors: Annotated[int | None, typer.Option(
        "--embed-actors", min=1, help="Ray embedding actors (default: per GPU / 2 CPUs).")] = None,
    gpus_per_actor: Annotated[float | None, typer.Option(
        "--gpus-per-actor", min=0, help="GPUs per Ray actor (default: 1 if the cluster has GPUs).",
    )] = None,
) -> None:
    """Index PATH (default index dir: PATH/.ssindex)."""
    from ssindex.backends.names import parse_overrides
    from ssindex.pipeline.build import build as run_build
    from ssindex.pipeline.plan import RayOptions
    from ssindex.tools.options import build_config, engine_options
    from ssindex.tools.report import PlainProgress, RichProgress, summary_table

    cfg = build_config(config, quantize, model, allow_secrets, workers, dims, trust_remote_code,
                       no_shared_cache)
    ray = engine_options(engine, RayOptions(ray_address, embed_actors, gpus_per_actor), workers)
    if check:
        from ssindex.pipeline.build import check as check_index

        _report_staleness(check_index(path, index, cfg), as_json)
    live = err.is_terminal and not no_progress
    reporter: Any = RichProgress(err) if live else PlainProgress()
    try:
        with reporter:
            stats = run_build(path, index, cfg, parse_overrides(backend or []),
                              progress=reporter, ray=ray, no_embed=no_embed)
    except KeyboardInterrupt:
        err.print("interrupted: searches see the last committed build; the next build "
                  "reuses the batches embedded so far", highlight=False, soft_wrap=True)
        raise typer.Exit(130) from None
    emit(stats) if as_json else Console().print(summary_table(stats))


def _report_staleness(reasons: list[str], as_json: bool) -> None:
    """``build --check``: why the index is stale (exit 1), or that it is current (exit 0)."""
    if as_json:
        emit({"stale": bool(reasons), "reasons": reasons})
    else:
        Console().print("stale: " + "; ".join(reasons) if reasons else "current", markup=False)
    raise typer.Exit(1 if reasons else 0)


ValuesOpt = list[str] | None


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="Natural language or identifiers.")],
    index: Annotated[ValuesOpt, typer.Option(
        "--index", help="Index directory or object-store URI; repeat it to search several "
        "as one.")] = None,
    workspace: Annotated[Path | None, typer.Option(
        "--workspace", help="A TOML file listing indexes to search as one: indexes = [...]",
    )] = None,
    k: Annotated[int, typer.Option("-k", help="Number of results.")] = 10,
    mode: Annotated[str, typer.Option("--mode", help="hybrid, lexical or semantic.")] = "hybrid",
    path: Annotated[ValuesOpt, typer.Option(
        "--path", help="Only files a gitignore-style glob selects (repeatable: src/, *.go).",
    )] = None,
    exclude: Annotated[ValuesOpt, typer.Option(
        "--exclude", help="No files a gitignore-style glob selects (repeatable).")] = None,
    lang: Annotated[ValuesOpt, typer.Option(
        "--lang", help="Only these languages (repeatable or comma-separated: go,rust).")] = None,
    kind: Annotated[ValuesOpt, typer.Option(
        "--kind", help="Only these chunk kinds (function, method, class, module...).")] = None,
    symbol: Annotated[str | None, typer.Option(
        "--symbol", help="Only chunks of this symbol, whole or its last part; NAME* for a "
        "prefix.")] = None,
    tests: Annotated[str | None, typer.Option(
        "--tests", help="include (default), only or exclude test code.")] = None,
    fmt: Annotated[str | None, typer.Option(
        "--format", help="text (default), json, ndjson, vimgrep or files.")] = None,
    context: Annotated[int, typer.Option(
        "--context", "-C", min=0, help="Lines around each result (text and JSON).")] = 0,
    backend: BackendOpt = None,
    trust_remote_code: TrustOpt = False,
    no_abstain: Annotated[bool, typer.Option(
        "--no-abstain", help="Always answer, even when the index has nothing relevant.")] = False,
    explain: Annotated[bool, typer.Option(
        "--explain", help="Show each result's leg scores and every ranking factor.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="The same as --format json.")] = False,
) -> None:
    """Search an index."""
    from ssindex.backends.names import parse_overrides
    from ssindex.query.filters import Filters
    from ssindex.query.searcher import Searcher
    from ssindex.query.workspace import Workspace, workspace_indexes
    from ssindex.tools.listing import FORMATS

    shape = _format(fmt, as_json, FORMATS)
    filters = Filters.of(path, exclude, lang, kind, symbol, tests)
    query_backend = parse_overrides(backend or []).get("embed_query")
    indexes: list[str | None] = [*(index or []),
                                 *(workspace_indexes(workspace) if workspace else [])]
    searchers = [Searcher(index_for(one), query_backend, trust_remote_code)
                 for one in indexes or [None]]
    engine = searchers[0] if len(searchers) == 1 else Workspace(searchers)
    response = engine.search(query, k=k, mode=mode, abstain=not no_abstain, explain=explain,
                             filters=filters, context=context)
    _show(response.as_json(), shape, searchers[0].index.path)


def _show(data: dict[str, Any], shape: str, index: Path) -> None:
    """A search's answer in its format on stdout; notes on stderr."""
    from ssindex.tools.listing import coverage_note, lines, print_text

    if note := coverage_note(data, index):
        err.print(note, highlight=False, soft_wrap=True)
    if shape == "text":
        print_text(data, Console())
        return
    for line in lines(data, shape):
        sys.stdout.write(line + "\n")
    if shape != "json" and data["abstained"]:  # stdout stays the format's alone
        err.print("nothing relevant in this index (abstained; --no-abstain to answer anyway)",
                  highlight=False, soft_wrap=True)


def _format(fmt: str | None, as_json: bool, formats: tuple[str, ...]) -> str:
    """``--format``, checked (``--json`` is ``--format json``)."""
    if fmt is not None and fmt not in formats:
        raise ConfigError(f"--format must be one of {', '.join(formats)}")
    if as_json and fmt not in (None, "json"):
        raise ConfigError(f"--json and --format {fmt} ask for two formats")
    return "json" if as_json else fmt or "text"


@app.command()
def status(index: IndexOpt = None, as_json: JsonOpt = False) -> None:
    """What an index holds and how it was built."""
    from ssindex.index.layout import status_data
    from ssindex.tools.report import plain

    data = status_data(index_for(index))
    if as_json:
        emit(data)
    else:
        width = max(map(len, data)) + 2
        for key, value in data.items():
            Console().print(f"[bold]{key:<{width}}[/]{escape(plain(value))}")


@app.command()
def repair(index: IndexOpt = None, as_json: JsonOpt = False) -> None:
    """Verify every file of an index; rebuild damaged search files and manifests."""
    from ssindex.index.remote import RemoteIndex, is_remote
    from ssindex.tools.repair import repair as run_repair

    if index is not None and is_remote(index):  # repaired in the mirror, then committed
        remote = RemoteIndex(index)
        data = run_repair(remote.pull(for_commit=True))
        if data["repaired"]:
            remote.push()
        data["index"] = remote.uri
    else:
        data = run_repair(index_for(index))
    if as_json:
        emit(data)
    elif data["repaired"]:
        Console().print(f"repaired {escape(', '.join(data['repaired']))} in "
                        f"{escape(data['index'])} ({data['verified']} files verified)")
    else:
        Console().print(f"{escape(data['index'])}: intact ({data['verified']} files verified)")



@app.command(name="eval")
def evaluate(
    directory: Annotated[Path, typer.Argument(help="BEIR layout: corpus.jsonl, queries.jsonl, "
                                                   "qrels.tsv.")],
    mode: Annotated[str, typer.Option("--mode", help="lexical, semantic, hybrid or all.")] = "all",
    quantize: Annotated[str | None, typer.Option("--quantize")] = None,
    workdir: Annotated[Path | None, typer.Option(
        "--workdir", help="Keep the tree and index here and reuse them next time.")] = None,
    suffix: Annotated[str, typer.Option("--suffix", help="File suffix of documents.")] = ".py",
    no_abstain: Annotated[bool, typer.Option("--no-abstain")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Retrieval quality (MRR@10, nDCG@10, recall, latency) through the real pipeline."""

    from ssindex.config import SEARCH_MODES
    from ssindex.tools.evaluate import evaluate as run_eval
    from ssindex.tools.options import build_config

    cfg = build_config(None, quantize)
    modes = list(SEARCH_MODES) if mode == "all" else [mode]
    report = run_eval(directory, modes, cfg, workdir, suffix, abstain=not no_abstain)
    if as_json:
        emit(report)
        return
    from rich.table import Table

    table = Table(title=escape(f"{report['dataset']} ({report['quantization']})"))
    columns = ["mrr@10", "ndcg@10", "recall@1", "recall@10", "recall@100", "identifier_top1",
               "latency_ms_p50", "abstained"]
    table.add_column("mode")
    for column in columns:
        table.add_column(column, justify="right")
    for name, scores in report["modes"].items():
        table.add_row(name, *(str(scores[c]) for c in columns))
    out = Console()
    out.print(table)
    if report["blank_queries"]:
        out.print(f"{report['blank_queries']} judged queries have no text: not searched, "
                  "scored as misses")


@app.command()
def calibrate(as_json: JsonOpt = False) -> None:
    """Time each runnable backend per phase here; store the winners in the user config."""
    from ssindex.tools.calibrate import calibrate as run_calibration

    record = run_calibration()
    if as_json:
        emit(record)
    else:
        from ssindex.tools.report import calibration_text

        Console().print(calibration_text(record))


@app.command()
def doctor(model: ModelOpt = None, trust_remote_code: TrustOpt = False,
           as_json: JsonOpt = False) -> None:
    """Hardware, runtimes, the backend chosen for each phase (probed), and what ssindex
    understood of the model (architecture, pooling, prompts, window, dimensions)."""
    from ssindex.tools.doctor import diagnose

    report = diagnose(model, trust_remote_code)
    if as_json:
        emit(report)
        return
    from ssindex.tools.report import doctor_table

    Console().print(doctor_table(report))

