"""Terminal front end of a build: live progress and the summary table.

On a terminal: a rich display per stage (count, rate, ETA). Elsewhere (CI
logs): one plain progress line every few seconds, never control characters.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from ssindex.backends.selector import BackendReport

_UNITS = {"walk": "files", "chunk": "chunks", "embed": "chunks"}
_SHOWN_AS = {"write": "embed"}
"""A pass that embeds nothing advances ``write``: shown on ``embed``'s line, named so."""


class RichProgress:
    """Live per-stage progress on stderr."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._progress = Progress(
            TextColumn("[bold]{task.description:<6}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[unit]}"), TextColumn("[cyan]{task.fields[rate]}"),
            TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False,
        )
        self._tasks: dict[str, TaskID] = {}
        self._counts: dict[str, int] = {}
        self._started = time.perf_counter()

    def __enter__(self) -> RichProgress:
        self._progress.start()
        for stage, unit in _UNITS.items():
            self._tasks[stage] = self._progress.add_task(stage, total=None, unit=unit, rate="")
            self._counts[stage] = 0
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.stop()

    def advance(self, stage: str, amount: int = 1) -> None:
        shown = _SHOWN_AS.get(stage, stage)
        if shown not in self._tasks:
            return
        self._counts[shown] += amount
        rate = self._counts[shown] / max(time.perf_counter() - self._started, 1e-6)
        self._progress.update(self._tasks[shown], advance=amount, rate=f"{rate:,.0f}/s",
                              description=stage)
        if stage == "chunk":
            self._progress.update(self._tasks["embed"], total=self._counts["chunk"])

    def message(self, text: str) -> None:
        self.console.print(f"[yellow]warning:[/] {escape(text)}")

    def restart(self, text: str) -> None:
        self.console.print(f"[green]{escape(text)}[/]")
        for stage, task in self._tasks.items():
            self._progress.reset(task, total=None, description=stage)
            self._counts[stage] = 0
        self._started = time.perf_counter()


class PlainProgress:
    """Periodic one-line progress for logs (no TTY)."""

    def __init__(self, every: float | None = None) -> None:
        self._every = every if every is not None else float(
            os.environ.get("SSINDEX_PROGRESS_SECONDS", "10"))
        self._counts = dict.fromkeys(_UNITS, 0)
        self._rows = "embed"
        """What the rows past the embed stage went through: ``embed`` or ``write``."""
        self._started = self._last = time.perf_counter()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: Any) -> None:
        if kind is None:
            self._line()

    def advance(self, stage: str, amount: int = 1) -> None:
        shown = _SHOWN_AS.get(stage, stage)
        if shown in self._counts:
            self._counts[shown] += amount
        if shown == "embed":
            self._rows = stage
        if time.perf_counter() - self._last >= self._every:
            self._line()

    def message(self, text: str) -> None:
        print(f"warning: {text}", file=sys.stderr, flush=True)

    def restart(self, text: str) -> None:
        self._line()
        print(text, file=sys.stderr, flush=True)
        self._counts = dict.fromkeys(_UNITS, 0)
        self._rows = "embed"
        self._started = self._last = time.perf_counter()

    def _line(self) -> None:
        self._last = time.perf_counter()
        elapsed = self._last - self._started
        c = self._counts
        rate = c["embed"] / elapsed if elapsed else 0.0
        files = "file" if c["walk"] == 1 else "files"
        print(f"progress: {elapsed:6.0f}s walk {c['walk']} {files} | chunk {c['chunk']} | "
              f"{self._rows} {c['embed']}/{c['chunk']} ({rate:.1f} chunks/s)", file=sys.stderr,
              flush=True)


def _backend_line(data: dict[str, Any]) -> str:
    report = BackendReport.from_json(data)
    if report.backend is None:  # a rebuild that reused every vector loads no model
        return f"none: {report.reason}"
    count = data.get("embed_actors")
    actors = "" if count is None else f", {count} Ray actor{'' if count == 1 else 's'}"
    return (f"{report.backend} ({report.dtype}{actors}): {report.reason}"
            + (f" [fallback: {report.fallback_reason}]" if report.fallback_reason else ""))


def _secrets_line(stats: dict[str, Any]) -> str:
    if stats["secrets_allowed"]:
        return "allowed (--allow-secrets): secret files and values are indexed as they are"
    files = stats["files_skipped"].get("secret", 0)
    now = ", ".join(f"{kind} {n}" for kind, n in stats["secrets_redacted_now"].items())
    return (f"{files} files skipped, {stats['secrets_redacted']} values redacted"
            + (f" (this build: {now})" if now else ""))


def _unfollowed(stats: dict[str, Any]) -> str:
    """What the walk could not look into or follow: unreadable directories (their files
    are not counted one by one) and ignore rules it skipped."""
    unreadable = stats.get("dirs_pruned", {}).get("unreadable", 0)
    rules = stats.get("ignore_skipped", {})
    return ((f"; {unreadable} unreadable director{'y' if unreadable == 1 else 'ies'}"
             if unreadable else "")
            + (f"; ignore rules not followed: {plain(rules)}" if rules else ""))


def summary_table(stats: dict[str, Any]) -> Table:
    skipped = plain(stats["files_skipped"]) + _unfollowed(stats)
    bulk = stats["backends"]["embed_bulk"]
    rows = [
        ("files", f"{stats['files_indexed']} indexed of {stats['files_seen']} seen; "
                  f"{stats['files_changed']} changed, {stats['files_new']} new, "
                  f"{stats['files_removed']} removed, {stats['files_read']} read"),
        ("skipped", skipped),
        ("secrets", _secrets_line(stats)),
        ("chunks", f"{stats['chunks_total']} total, {stats['chunks_embedded']} embedded, "
                   f"{stats['chunks_deduplicated']} duplicates, {stats['chunks_reused']} reused"
                   + (f" ({stats['chunks_from_cache']} from the shared vector cache)"
                      if stats.get("chunks_from_cache") else "")),
        ("truncated", f"{stats['chunks_truncated']} chunks cut off at the model's window, "
                      f"{stats.get('chunks_windowed', 0)} longer ones read window by window"),
        ("backend", _backend_line(bulk)),
        ("model", f"{stats['model']}, {stats['quantization']} "
                  f"({stats['vector_bytes_per_chunk']} B/vector)"),
        ("stages", "  ".join(f"{k} {v:.1f}s" for k, v in stats["stage_seconds"].items())),
        ("wall", f"{stats['wall_seconds']:.1f}s"),
        ("index", f"{stats['index']} (version {stats['table_version']})"),
    ]
    return _facts("ssindex build", rows)


def doctor_table(report: dict[str, Any]) -> Table:
    """``ssindex doctor``'s findings, one row per device, runtime and phase."""
    hardware = report["hardware"]
    rows = [
        ("CPU", f"{hardware['cpu_model']} x{hardware['cpu_count']}, features: "
                f"{' '.join(hardware['cpu_flags']) or 'none'}"),
        ("CUDA", ", ".join(device["name"] for device in hardware["cuda_devices"]) or "none"),
        ("Apple", f"MPS {hardware['mps']}, Neural Engine {hardware['neural_engine']}"),
        *((name, plain(info)) for name, info in report["runtimes"].items()),
        ("model", report["model"]),
        *_card_rows(report["card"]),
        *report.get("backends", {}).items(),
        *((phase, _backend_line(choice)) for phase, choice in report["phases"].items()),
        *(("calibrated", f"{phase}: {winner['backend']} ({winner.get('figure', '?')})")
          for phase, winner in report["calibrated"].items()),
        *(("warning", warning) for warning in report["warnings"]),
    ]
    return _facts("ssindex doctor", rows)


def _card_rows(card: dict[str, Any]) -> list[tuple[str, str]]:
    """What ssindex understood of the model: how it embeds."""
    code = f", runs its own code ({card['remote_code']})" if card["remote_code"] else ""
    return [("architecture", f"{card['architecture']} ({card['model_type']}){code}"),
            ("pooling", " → ".join([card["pooling"], *card["modules"]])),
            ("prompts", f"query {card['query_prompt']!r}, document {card['document_prompt']!r}"),
            ("window", f"{card['window']} tokens, {card['dim']} dimensions")]


def calibration_text(record: dict[str, Any]) -> Text:
    """``ssindex calibrate``'s figures per backend, the winner per phase, and where they
    were stored."""
    text = Text()
    for name, figure in record["figures"].items():
        text.append(f"{name:<16}", style="bold")
        if "error" in figure:
            text.append(f"cannot run here: {figure['error']}\n", style="yellow")
        else:
            text.append(f"{figure['bulk_chunks_per_s']:>8} chunks/s in bulk "
                        f"{figure['query_ms_p50']:>8} ms a query\n")
    for phase, winner in record["phases"].items():
        text.append(phase, style="green").append(
            f" → {winner['backend']} ({winner['figure']})\n")
    if "attention_error" in record:
        text.append(f"attention kernel not compared: {record['attention_error']}\n",
                    style="yellow")
    return text.append(f"stored in {record['stored_at']}")


def _facts(title: str, rows: list[tuple[str, str]]) -> Table:
    """A two-column table of named facts. Values are plain text, never rich markup: a
    reason such as "[fallback: …]" or "[Errno 20]" would be read as a style tag."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, Text(value))
    return table


def plain(value: Any) -> str:
    """A reported value as a person reads it: a mapping as its pairs, a list as its items,
    nothing as ``none``."""
    if isinstance(value, dict):
        return ", ".join(f"{key} {plain(item)}" for key, item in value.items()) or "none"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return "none" if value is None else str(value)
