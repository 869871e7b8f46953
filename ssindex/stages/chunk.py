"""cAST chunking (arXiv:2506.15655): AST-shaped chunks under a size budget.

For each file, in four steps:

1. Parse with tree-sitter (languages in ``AST_LANGUAGES``); other files, and
   files whose tree has syntax errors, go to the line-window chunker.
2. Split: a node whose lines hold more non-whitespace characters than the
   budget is replaced by its children, recursively; a leaf that is still too
   large is cut into line windows. A definition's header (the children
   before its body) and comments are glued to what follows them, closing
   brackets and continuation clauses (``else``, ``except``) to what precedes
   them; simple statements up to four budgets stay whole.
3. Tile: children become whole-line spans that cover the parent without gaps
   or overlaps. Gap lines (blank lines, comments) join the span below them,
   so a comment or decorator stays with the code it describes.
4. Merge: adjacent sibling spans are merged greedily while the merged span
   fits the budget (a glued span always merges with its successor, so a
   chunk never ends on a ``def`` line or a comment). Only siblings merge, so
   a chunk never straddles two unrelated subtrees.

Sizes are non-whitespace characters, so indentation does not eat the budget; given
the model's ``Window``, the larger of that and a span's tokens (scaled so the window
is worth the budget), so the split cuts chunks to the window too. A chunk is whole
lines; one whose embedding text still overflows the window is cut into line windows
(``_fit``). Only a single line longer than the window stays whole (embedded window by window).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import PurePosixPath
from typing import Any

import xxhash

from ssindex.config import ChunkConfig
from ssindex.records import Chunk, IndexedChunk, SourceFile
from ssindex.stages.lines import Lines, Window
from ssindex.stages.symbols import definition, sole_definition
from ssindex.text.languages import AST_LANGUAGES

CHUNKER_VERSION = 3
"""Bumped whenever chunk boundaries or names change (3: cut to the model's window)."""

_CLOSERS = frozenset({
    "}", ")", "]", "end", "fi", "done", "esac",
    # continuation clauses: starting a chunk at `else:` would cut a statement in two
    "else_clause", "elif_clause", "except_clause", "except_group_clause", "finally_clause",
    "catch_clause",
})
_BODY_FIELDS = ("body", "consequence", "definition")
_ATOMIC_FACTOR = 4
"""Simple statements, strings and comments up to this many budgets stay whole rather
than be cut mid-statement (a big literal table, a long docstring)."""
_SIMPLE_STATEMENTS = frozenset({
    "expression_statement", "assignment", "augmented_assignment", "return_statement",
    "lexical_declaration", "variable_declaration", "const_declaration", "var_declaration",
    "short_var_declaration", "let_declaration", "field_declaration", "local_variable_declaration",
})


@dataclass(slots=True)
class ChunkStats:
    files: int = 0
    files_unchanged: int = 0
    """Files whose stored chunks were reused instead of parsing them again."""
    chunks: int = 0
    chunkers: Counter[str] = field(default_factory=Counter)
    """Files per chunker: ``ast``, ``lines``, ``lines_parse_error``."""

    def count(self, chunker: str, chunks: int) -> None:
        self.files += 1
        self.chunkers[chunker] += 1
        self.chunks += chunks


@dataclass(slots=True)
class _Span:
    start: int
    end: int
    """0-based inclusive rows."""
    symbol: str
    kind: str
    own: bool = False
    """The span is exactly one definition."""
    attach: str = ""
    """``next``: must merge with the span after it (a comment, a header above its
    body); ``prev``: with the span before it (a closing bracket or ``end``)."""


def chunk(files: Iterable[SourceFile], cfg: ChunkConfig, stats: ChunkStats,
          window: Window | None = None) -> Iterator[tuple[SourceFile, list[IndexedChunk]]]:
    """Yield each file with its chunks, in input order."""
    for source in files:
        chunks, chunker = chunk_file(source, cfg, window)
        stats.count(chunker, len(chunks))
        rows = [IndexedChunk(c) for c in chunks]
        yield source, rows


def chunk_file(source: SourceFile, cfg: ChunkConfig, window: Window | None = None,
               ) -> tuple[list[Chunk], str]:
    """The chunks of one file (each fitting ``window``, when given) and the name of the
    chunker that made them."""
    lines = Lines.of(source.text)
    if not lines.rows:
        return [], "lines"
    spans, chunker = _spans(source, lines, cfg)
    chunks = [_to_chunk(source, lines, s) for s in spans]
    if window is None:
        return chunks, chunker
    long = [s for s, fit in zip(spans, window.fits(chunks, lines.rows), strict=True) if not fit]
    if not long:
        return chunks, chunker
    # tokens are counted only in the rows of chunks too long (12% of the standard
    # library's): elsewhere the sizes, and so the chunks, stay as they were
    rows = sorted({row for span in long for row in range(span.start, span.end + 1)})
    lines = Lines.of(source.text, window, cfg.max_chars, rows)
    spans = _fit(source, lines, _spans(source, lines, cfg)[0], window)
    return [_to_chunk(source, lines, s) for s in spans], chunker


def replay(source: SourceFile, cuts: list[tuple[int, int, str, str]]) -> list[Chunk] | None:
    """The chunks of ``source`` at ``cuts`` (first and last line, symbol, kind), as
    ``chunk_file`` cut this text before; ``None`` when the cuts do not fit its lines."""
    lines = Lines.of(source.text)
    if any(not 0 < start <= end <= len(lines.rows) for start, end, _, _ in cuts):
        return None
    return [_to_chunk(source, lines, _Span(start - 1, end - 1, symbol, kind))
            for start, end, symbol, kind in cuts]


def _spans(source: SourceFile, lines: Lines, cfg: ChunkConfig) -> tuple[list[_Span], str]:
    """The file's non-empty spans, and the chunker that made them."""
    module = (PurePosixPath(source.path).stem, "module")
    spans: list[_Span] | None = None
    chunker = "lines"
    if source.language in AST_LANGUAGES:
        spans = _ast_spans(source, lines, cfg, module)
        chunker = "ast" if spans is not None else "lines_parse_error"
    if spans is None:
        spans = _line_windows(lines, 0, len(lines.rows) - 1, module, cfg.max_chars)
    return [s for s in spans if lines.size(s.start, s.end)], chunker


def _fit(source: SourceFile, lines: Lines, spans: list[_Span], window: Window,
         ) -> list[_Span]:
    """``spans`` with each one whose embedding text still overflows the window (a long
    statement kept whole, tokens across line ends) cut into line windows."""
    fits = window.fits([_to_chunk(source, lines, s) for s in spans], lines.rows)
    if all(fits):
        return spans
    cut: list[_Span] = []
    for span, fit in zip(spans, fits, strict=True):
        cut += [span] if fit else _token_windows(source, lines, span, window)
    return cut


def _token_windows(source: SourceFile, lines: Lines, span: _Span, window: Window,
                   ) -> list[_Span]:
    """``span`` cut into whole-line windows that fit ``window``: lines are added while
    their own token counts sum within the limit, and a window that still does not fit
    as a whole (tokens across line ends) gives up its last lines."""
    rows = range(span.start, span.end + 1)
    counts = window.line_tokens([lines.rows[row] for row in rows])
    pieces: list[_Span] = []
    first, total = span.start, 0
    for row, count in zip(rows, counts, strict=True):
        if row > first and total + count > window.limit:
            pieces.append(_Span(first, row - 1, span.symbol, span.kind))
            first, total = row, 0
        total += count
    pieces.append(_Span(first, span.end, span.symbol, span.kind))
    fitted: list[_Span] = []
    for piece in pieces:
        start = piece.start
        while start <= piece.end:
            end = piece.end
            while end > start and not window.fits(
                    [_to_chunk(source, lines, _Span(start, end, span.symbol, span.kind))])[0]:
                end -= 1
            fitted.append(_Span(start, end, span.symbol, span.kind))
            start = end + 1
    return fitted


@lru_cache(maxsize=1)
def _tree(language: str, text: str) -> Any:
    """The syntax tree of ``text``, kept for ``chunk_file``'s second pass over the file."""
    from tree_sitter_language_pack import get_parser

    return get_parser(language).parse(text.encode("utf-8"))  # type: ignore[arg-type]


def _ast_spans(
    source: SourceFile, lines: Lines, cfg: ChunkConfig, module: tuple[str, str]
) -> list[_Span] | None:
    try:
        tree = _tree(source.language or "", source.text)
    except Exception:  # a grammar that cannot load or parse: line windows instead
        return None
    root = tree.root_node
    if root.has_error:
        return None
    last = len(lines.rows) - 1
    spans = _split(root, module, 0, lines, cfg, is_root=True)
    sole = sole_definition(root, module)
    if sole is not None:
        for span in spans:
            if (span.symbol, span.kind) == module:
                span.symbol, span.kind = sole
    spans = _tile(spans, 0, last)
    return _merge(spans, lines, cfg.max_chars, module)


def _rows(node: Any) -> tuple[int, int]:
    start, end = node.start_point[0], node.end_point[0]
    if node.end_point[1] == 0 and end > start:
        end -= 1
    return start, end


def _split(node: Any, ctx: tuple[str, str], depth: int, lines: Lines, cfg: ChunkConfig,
           reserve: int = 0, is_root: bool = False) -> list[_Span]:
    """Spans of ``node``; the first one leaves ``reserve`` characters for a glued header."""
    start, end = _rows(node)
    end = min(end, len(lines.rows) - 1)
    defined = None if is_root else definition(node, ctx)
    node_ctx = defined or ctx
    size = lines.size(start, end)
    if size <= cfg.max_chars - reserve:
        return [_Span(start, end, *node_ctx, own=defined is not None)]
    children = node.children
    atomic = node.type in _SIMPLE_STATEMENTS or "string" in node.type or "comment" in node.type
    if atomic and size <= _ATOMIC_FACTOR * cfg.max_chars:
        return [_Span(start, end, *node_ctx)]
    if not children or depth >= cfg.max_depth:
        return _line_windows(lines, start, end, node_ctx, cfg.max_chars)
    body = next((b for f in _BODY_FIELDS if (b := node.child_by_field_name(f)) is not None), None)
    header = lines.size(start, body.start_point[0] - 1) if body is not None else 0
    in_header = body is not None
    pieces: list[_Span] = []
    for index, child in enumerate(children):
        if body is not None and in_header and child.id == body.id:
            in_header = False
            child_reserve = reserve + header
        else:
            child_reserve = reserve if index == 0 and body is None else 0
        parts = _split(child, node_ctx, depth + 1, lines, cfg, child_reserve)
        if in_header or "comment" in child.type:
            for part in parts:
                part.attach = "next"
        elif child.type in _CLOSERS and parts:
            parts[0].attach = "prev"
        pieces += parts
    merged = _merge(_tile(pieces, start, end), lines, cfg.max_chars, node_ctx, reserve)
    for span in merged:
        span.attach = ""
    return merged


def _tile(pieces: list[_Span], start: int, end: int) -> list[_Span]:
    """Make ``pieces`` cover rows start..end exactly, without overlap."""
    tiled: list[_Span] = []
    covered = start - 1
    for piece in pieces:
        if piece.end <= covered:
            continue
        piece.start = covered + 1
        tiled.append(piece)
        covered = piece.end
    if tiled:
        tiled[-1].end = max(tiled[-1].end, end)
    return tiled


def _merge(pieces: list[_Span], lines: Lines, budget: int, ctx: tuple[str, str],
           reserve: int = 0) -> list[_Span]:
    """Greedily merge adjacent sibling spans while the result fits the budget."""
    merged: list[_Span] = []
    group: list[_Span] = []
    for piece in pieces:
        limit = budget - reserve if not merged else budget
        glued = group and (group[-1].attach == "next" or piece.attach == "prev")
        if group and not glued and lines.size(group[0].start, piece.end) > limit:
            merged.append(_join(group, ctx))
            group = []
        group.append(piece)
    if group:
        merged.append(_join(group, ctx))
    return merged


def _join(group: list[_Span], ctx: tuple[str, str]) -> _Span:
    """One span for a merged group, named for the one symbol inside it (else the parent)."""
    if len(group) == 1:
        return group[0]
    inner = {(s.symbol, s.kind) for s in group if s.own or s.symbol != ctx[0]}
    if len(inner) == 1:
        symbol, kind = inner.pop()
        return _Span(group[0].start, group[-1].end, symbol, kind, own=True)
    return _Span(group[0].start, group[-1].end, *ctx)


def _line_windows(lines: Lines, start: int, end: int, ctx: tuple[str, str], budget: int,
                  ) -> list[_Span]:
    spans: list[_Span] = []
    first = start
    for row in range(start, end + 1):
        if row > first and lines.size(first, row) > budget:
            spans.append(_Span(first, row - 1, *ctx))
            first = row
    spans.append(_Span(first, end, *ctx))
    return spans


def normalized_hash(text: str) -> str:
    """Hash of the text with all whitespace runs collapsed: exact-duplicate key."""
    return xxhash.xxh3_128_hexdigest(" ".join(text.split()).encode("utf-8"))


def chunk_id(path: str, start_line: int, end_line: int, content_hash: str) -> str:
    return xxhash.xxh3_64_hexdigest(f"{path}\0{start_line}\0{end_line}\0{content_hash}".encode())


def _to_chunk(source: SourceFile, lines: Lines, span: _Span) -> Chunk:
    text = "\n".join(lines.rows[span.start : span.end + 1])
    digest = normalized_hash(text)
    start_line, end_line = span.start + 1, span.end + 1
    return Chunk(
        id=chunk_id(source.path, start_line, end_line, digest),
        path=source.path,
        language=source.language,
        start_line=start_line,
        end_line=end_line,
        symbol=span.symbol,
        kind=span.kind,
        text=text,
        content_hash=digest,
        file_hash=source.content_hash,
    )
