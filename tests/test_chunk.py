from __future__ import annotations

import ast
import random

import pytest

from ssindex.config import ChunkConfig
from ssindex.records import SourceFile
from ssindex.stages.chunk import chunk_file
from ssindex.stages.walk import content_hash
from ssindex.text.languages import detect_language

from .conftest import STDLIB


def _source(path: str, text: str) -> SourceFile:
    return SourceFile(path, detect_language(path), text, len(text), 0, content_hash(text.encode()))


def _check_tiling(text: str, chunks: list) -> None:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    covered = []
    for c in chunks:
        assert c.text == "\n".join(lines[c.start_line - 1 : c.end_line])
        covered.extend(range(c.start_line, c.end_line + 1))
    assert covered == sorted(set(covered)), "chunks overlap or are out of order"


SAMPLES = {
    "python": ("m.py", "class Greeter:\n    def hello(self, name):\n        return f'hi {name}'\n"
               "\n\ndef top(x):\n    return x + 1\n", {"Greeter.hello", "top"}),
    "javascript": ("m.js", "class Greeter {\n  hello(name) {\n    return 'hi ' + name;\n  }\n}\n"
                   "function top(x) {\n  return x + 1;\n}\n", {"Greeter.hello", "top"}),
    "typescript": ("m.ts", "interface Shape { area(): number }\nfunction top(x: number): number "
                   "{\n  return x + 1;\n}\n", {"top", "Shape"}),
    "go": ("m.go", "package m\n\ntype Server struct{ port int }\n\nfunc (s *Server) Start() "
           "error {\n\treturn nil\n}\n\nfunc Top(x int) int {\n\treturn x + 1\n}\n",
           {"Start", "Top"}),
    "rust": ("m.rs", "struct Point { x: i32 }\nimpl Point {\n    fn norm(&self) -> i32 {\n"
             "        self.x\n    }\n}\nfn top(x: i32) -> i32 {\n    x + 1\n}\n",
             {"Point.norm", "top"}),
    "java": ("M.java", "class Greeter {\n  String hello(String n) {\n    return \"hi\" + n;\n"
             "  }\n}\n", {"Greeter.hello"}),
    "c": ("m.c", "int top(int x) {\n  return x + 1;\n}\nstruct point { int x; };\n", {"top"}),
    "cpp": ("m.cpp", "namespace ns {\nclass Box {\n public:\n  int size() { return 1; }\n};\n}\n",
            {"ns.Box.size"}),
    "csharp": ("M.cs", "class Greeter {\n  string Hello(string n) {\n    return n;\n  }\n}\n",
               {"Greeter.Hello"}),
    "ruby": ("m.rb", "class Greeter\n  def hello(name)\n    \"hi #{name}\"\n  end\nend\n",
             {"Greeter.hello"}),
    "php": ("m.php", "<?php\nclass Greeter {\n  function hello($n) {\n    return $n;\n  }\n}\n",
            {"Greeter.hello"}),
    "kotlin": ("m.kt", "class Greeter {\n  fun hello(n: String): String {\n    return n\n  }\n}\n",
               {"Greeter.hello"}),
    "swift": ("m.swift", "class Greeter {\n  func hello(n: String) -> String {\n    return n\n"
              "  }\n}\n", {"Greeter.hello"}),
    "scala": ("m.scala", "object Main {\n  def hello(n: String): String = {\n    n\n  }\n}\n",
              {"Main.hello"}),
    "bash": ("m.sh", "#!/bin/sh\nhello() {\n  echo hi\n}\nhello\n", {"hello"}),
}


@pytest.mark.parametrize("language", sorted(SAMPLES))
def test_ast_chunker_names_symbols(language: str) -> None:
    path, text, expected = SAMPLES[language]
    # A budget this small forces splitting down to individual definitions.
    chunks, chunker = chunk_file(_source(path, text), ChunkConfig(max_chars=25))
    assert chunker == "ast"
    _check_tiling(text, chunks)
    symbols = {c.symbol for c in chunks}
    assert expected <= symbols, symbols


def test_python_method_kinds_and_whole_file_coverage() -> None:
    text = (STDLIB / "json" / "decoder.py").read_text()
    chunks, chunker = chunk_file(_source("json/decoder.py", text), ChunkConfig())
    assert chunker == "ast"
    _check_tiling(text, chunks)
    assert chunks[0].start_line == 1 and chunks[-1].end_line == len(text.splitlines())
    kinds = {(c.symbol, c.kind) for c in chunks}
    assert ("JSONDecoder.raw_decode", "method") in kinds
    assert ("py_scanstring", "function") in kinds


def _statement_bounds(text: str) -> tuple[set[int], set[int]]:
    starts, ends = set(), set()
    lines = text.split("\n")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.stmt):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            starts.add(first)
            ends.add(node.end_lineno or node.lineno)
            # blank, comment and decorator lines directly above a statement also count
            row = first - 1
            while row >= 1 and (not lines[row - 1].strip() or lines[row - 1].lstrip()
                                .startswith(("#", "@"))):
                starts.add(row)
                row -= 1
    return starts, ends


def test_chunks_align_with_statements_on_real_code() -> None:
    files = sorted(p for p in STDLIB.glob("*.py"))
    random.Random(7).shuffle(files)
    aligned = total = 0
    for path in files[:60]:
        text = path.read_text(encoding="utf-8", errors="strict")
        try:
            starts, ends = _statement_bounds(text)
        except SyntaxError:
            continue
        starts.add(1)
        ends.add(len(text.split("\n")) - (1 if text.endswith("\n") else 0))
        chunks, _ = chunk_file(_source(path.name, text), ChunkConfig())
        for c in chunks:
            total += 1
            aligned += c.start_line in starts and c.end_line in ends
    assert total > 1000
    assert aligned / total >= 0.95, f"{aligned}/{total} chunks statement-aligned"


def test_budget_respected_except_glued_headers_and_long_lines() -> None:
    text = (STDLIB / "argparse.py").read_text()
    cfg = ChunkConfig(max_chars=400)
    chunks, _ = chunk_file(_source("argparse.py", text), cfg)
    sizes = [sum(len(w) for w in c.text.split()) for c in chunks if c.start_line != c.end_line]
    # glued headers, continuation clauses and whole simple statements may run over,
    # but never past the atomic limit
    assert sum(s <= cfg.max_chars for s in sizes) / len(sizes) >= 0.6
    assert max(sizes) <= 4 * cfg.max_chars


def test_pathological_inputs_do_not_crash() -> None:
    deep = "x = " + "[" * 10_000 + "]" * 10_000 + "\n"
    chunks, _ = chunk_file(_source("deep.py", deep), ChunkConfig())
    assert chunks and chunks[0].text == deep.rstrip("\n")
    nested = "".join("    " * i + "if x:\n" for i in range(2_000)) + "    " * 2_000 + "pass\n"
    chunks, _ = chunk_file(_source("nested.py", nested), ChunkConfig())
    _check_tiling(nested, chunks)
    minified = "var a=" + ",".join(str(i) for i in range(50_000)) + ";\n"
    chunks, _ = chunk_file(_source("min.js", minified), ChunkConfig())
    assert len(chunks) == 1 and chunks[0].start_line == chunks[0].end_line == 1


def test_parse_errors_and_unknown_languages_use_line_windows() -> None:
    broken = "def f(:\n    return (\n" * 50
    chunks, chunker = chunk_file(_source("broken.py", broken), ChunkConfig(max_chars=100))
    assert chunker == "lines_parse_error" and len(chunks) > 1
    _check_tiling(broken, chunks)
    prose = "\n".join(f"line {i} of some notes" for i in range(200))
    chunks, chunker = chunk_file(_source("notes.txt", prose), ChunkConfig(max_chars=100))
    assert chunker == "lines" and len(chunks) > 5
    _check_tiling(prose, chunks)


@pytest.mark.parametrize("alphabet", [["ab", "x", "{", " ", "\t", "\x0b", "\x1c", "\r"],
                                      ["é", "中文", "x", "\u3000", "\xa0", "\x85", "\u2003", " "]])
def test_sizes_are_the_characters_str_split_keeps(alphabet: list[str]) -> None:
    """Line windows fill their budget with non-whitespace characters as ``str.split``
    sees them: ASCII separators and Unicode spaces too."""
    rng = random.Random(3)
    text = "".join("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) + "\n"
                   for _ in range(300))
    chunks, chunker = chunk_file(_source("notes.txt", text), ChunkConfig(max_chars=60))
    rows = text.split("\n")

    def size(first: int, last: int) -> int:
        return sum(len(word) for row in rows[first - 1:last] for word in row.split())

    assert chunker == "lines" and len(chunks) > 10
    for chunk in chunks[:-1]:
        assert size(chunk.start_line, chunk.end_line) <= 60 or chunk.start_line == chunk.end_line
        assert size(chunk.start_line, chunk.end_line + 1) > 60  # the next row did not fit
