"""Search results in each output format (``ssindex search --format``):

    text     ranked chunks for a person
    json     one object: query, mode, filters, results, timings (``SearchResponse.as_json``)
    ndjson   one result per line, best first, for jq and agents that stream
    vimgrep  path:line:column:line, at each result's first non-blank line: the
             quickfix format Vim, Neovim, Emacs and VS Code read (as ripgrep's --vimgrep)
    files    each result's file once, in rank order

Paths in ``vimgrep`` and ``files`` are the ones an editor opened here can follow: the
indexed root's file relative to the working directory when it lies below it, absolute
otherwise. A path that holds a character that is not printable (a newline would end
its line) or starts with ``"`` is written as a JSON string, as git quotes such a path.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

FORMATS = ("text", "json", "ndjson", "vimgrep", "files")


def lines(data: dict[str, Any], fmt: str) -> Iterator[str]:
    """The lines of a machine-read format (all but ``text``) for a search's JSON."""
    if fmt == "json":
        yield json.dumps(data, ensure_ascii=False)
        return
    results = data["results"]
    if fmt == "ndjson":
        for rank, hit in enumerate(results, 1):
            yield json.dumps({"rank": rank, **hit}, ensure_ascii=False)
        return
    root = data.get("root")
    if fmt == "vimgrep":
        for hit in results:  # at the chunk's first line that holds something
            body = hit["text"].split("\n")[: hit["end_line"] - hit["start_line"] + 1]
            skip = next((i for i, line in enumerate(body) if line.strip()), 0)
            first = body[skip] if body else ""
            column = len(first) - len(first.lstrip()) + 1
            yield f"{_one_line(located(hit, root))}:{hit['start_line'] + skip}:{column}:{first}"
    elif fmt == "files":
        yield from dict.fromkeys(_one_line(located(hit, root)) for hit in results)


def _one_line(path: str) -> str:
    """``path`` as one line: a JSON string where it holds a character that is not
    printable (a newline, a line separator) or starts with a quote (it would read as
    quoted)."""
    return json.dumps(path) if path.startswith('"') or not path.isprintable() else path


def located(hit: dict[str, Any], root: str | None) -> str:
    """The path of ``hit``'s file that an editor opened here follows (``root``: the
    indexed directory, unless the hit names its own, as a workspace's do)."""
    base = hit.get("root") or root
    if base is None:
        return str(hit["path"])
    return os.fspath(_shown(base) / hit["path"])


@functools.lru_cache(maxsize=64)
def _shown(root: str) -> Path:
    """``root`` relative to the working directory when below it, else absolute."""
    base, here = Path(root).resolve(), Path.cwd().resolve()
    return base.relative_to(here) if base.is_relative_to(here) else base


def print_text(data: dict[str, Any], out: Console) -> None:
    """Ranked chunks for a person: location, kind and symbol, score, then the first
    lines (and the context lines, numbered, when asked)."""
    if data["abstained"]:
        out.print("nothing relevant in this index (abstained; --no-abstain to answer anyway)")
    elif not data["results"]:
        out.print("no results" + (" (the filters let no chunk through)"
                                  if data.get("filters", {}).get("rows") == 0 else ""))
    for rank, hit in enumerate(data["results"], 1):
        # paths and symbols are the repository's: escaped, so "[red]x.py" prints as named
        path = located(hit, None) if "index" in hit else hit["path"]  # a workspace's
        out.print(f"[bold]{rank:>2}. {escape(path)}:{hit['start_line']}-"
                  f"{hit['end_line']}[/] [cyan]{escape(hit['kind'])} {escape(hit['symbol'])}[/]"
                  f"  [dim]{hit['score']:.4f}[/]")
        if "explain" in hit:
            out.print(explanation(hit["explain"]), markup=False, highlight=False)
        if "context" in hit:
            out.print(numbered(hit), markup=False, highlight=False)
        else:
            out.print(snippet(hit["text"]), markup=False, highlight=False)
        out.print()


def coverage_note(data: dict[str, Any], index: Path) -> str | None:
    """The line that says a search that asked for the dense leg ran on an index with
    chunks still to embed."""
    from ssindex.index.activity import running_build

    coverage = data.get("dense_coverage", 1.0)
    if coverage >= 1.0 or data["mode"] == "lexical":
        return None
    state = ("build still running" if running_build(index) is not None
             else "`ssindex build` embeds the rest")
    return f"dense leg {coverage:.0%} embedded, {state}"


def explanation(data: dict[str, Any]) -> str:
    """``--explain``'s line: the legs' scores, the fused score, then each factor and
    added term in the order applied (the same-file decay last)."""
    legs = ", ".join(f"{leg} {data[leg]:.4f}" if data[leg] is not None else f"{leg} -"
                     for leg in ("dense", "lexical"))
    factors = dict(data["factors"])
    decay = factors.pop("same file", None)
    terms = [f"×{value:g} {name}" for name, value in factors.items()]
    terms += [f"+{value:.4f} {name}" for name, value in data["added"].items()]
    if decay is not None:
        terms.append(f"×{decay:g} same file")
    return f"    [{legs}; fused {data['fused']:.4f}{'; ' + ' '.join(terms) if terms else ''}]"


def snippet(text: str, lines: int = 6, width: int = 200) -> str:
    """A result's first lines, each cut at ``width`` (one line may hold a whole file)."""
    return "\n".join(_cut(line, width) for line in text.splitlines()[:lines])


def numbered(hit: dict[str, Any], lines: int = 6, width: int = 200) -> str:
    """A result's context lines, its first ``lines`` lines and the lines after it, each
    numbered; a chunk cut short ends in a ``…`` line."""
    before, after = hit["context"]["before"], hit["context"]["after"]
    body = hit["text"].split("\n")[: hit["end_line"] - hit["start_line"] + 1]
    first = hit["start_line"] - len(before)
    shown = [(first + i, " ", line) for i, line in enumerate(before)]
    shown += [(hit["start_line"] + i, "│", line) for i, line in enumerate(body[:lines])]
    out = [f"{number:>6}{mark} {_cut(line, width)}" for number, mark, line in shown]
    if len(body) > lines:
        out.append(f"{'':>6}│ …")
    out += [f"{hit['end_line'] + 1 + i:>6}  {_cut(line, width)}" for i, line in enumerate(after)]
    return "\n".join(out)


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 1] + "…"
