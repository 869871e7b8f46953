"""What the conventions of code say about a file or a chunk, for the ranking stage: the
kinds a path is (tests, docs, examples, ... by each language's conventions), the words a
file's name holds, whether a chunk is a barrel of imports, the identifiers in a query, and
the lines that define a name."""

from __future__ import annotations

import functools
import re

from ssindex.text.roles import is_test

WORD_PREFIX = 4
"""A query word and a path word match when one starts the other and the shorter has at
least this many letters (``dependency``/``dependencies``, ``type``/``types``)."""
BARREL_SHARE = 0.7
"""A chunk whose code lines are at least this share of imports and re-exports is a
barrel (``__init__.py``, ``index.ts``, ``mod.rs``): it names the code, it is not it."""
ASKS = {  # a query that says one of these asks for that kind of file
    "test": re.compile(r"\b(tests?|testing|spec|specs|fixtures?|mocks?)\b", re.I),
    "docs": re.compile(r"\b(docs?|documentation|readme|guide|changelog|markdown)\b", re.I),
    "example": re.compile(r"\b(examples?|samples?|demos?|tutorials?)\b", re.I),
    "legacy": re.compile(r"\b(legacy|compat|compatibility|deprecated|old)\b", re.I),
    "stub": re.compile(r"\b(stubs?|typings?|declarations?)\b", re.I),
    "config": re.compile(r"\b(config\w*|settings?|manifests?|dependenc\w+|toml|ya?ml|json|xml|"
                         r"build|packag\w+)\b", re.I),
}
_DOC_SUFFIXES = {".md", ".rst", ".txt", ".adoc", ".markdown"}
_DOC_DIRS = {"docs", "doc", "documentation"}
_CONFIG_SUFFIXES = {".toml", ".json", ".yaml", ".yml", ".ini", ".cfg", ".xml", ".lock",
                    ".properties", ".plist"}
_EXAMPLE_DIRS = {"example", "examples", "sample", "samples", "demo", "demos"}
_LEGACY_DIRS = {"legacy", "compat", "deprecated", "old"}
_VENDORED_DIRS = {"vendor", "vendored", "third_party", "thirdparty", "node_modules",
                  "generated", "_generated", "external"}
VERSION_DIR = re.compile(r"v(\d+)")
VERSIONED = re.compile(r"(?:^|/)[vV]\d+/")
_CODE_LINE = r'^[ \t]*(?!#|//|""")(?=\S)'
"""A line that holds code: not blank, not a comment or docstring opener."""
_CODE_LINES = re.compile(_CODE_LINE, re.MULTILINE)
_REEXPORT_LINES = re.compile(
    _CODE_LINE + r"(?:import\s|from\s\S+\s+import\s|export\s+(?:\*|\{|type\s+\{)|"
    r"pub\s+(?:use|mod)\s|mod\s+\w+;|use\s|require|__all__|module\.exports|"
    r"[)}\]],?[ \t]*$|\w+,[ \t]*$)", re.MULTILINE)
"""A code line that imports or re-exports (or continues a list of names)."""
DEFINITION_KINDS = {"function", "method", "class", "struct", "interface", "enum", "trait",
                    "type", "impl", "object", "protocol"}
"""The chunk kinds that define their symbol."""
_IDENTIFIER = re.compile(
    r"[A-Za-z_][A-Za-z0-9_]*(?:(?:\.|::)[A-Za-z_][A-Za-z0-9_]*)+"  # a.b, A::B
    r"|[A-Za-z]*[a-z][A-Z][A-Za-z0-9]*|[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*"  # camelCase, CamelCase
    r"|[A-Za-z0-9]+_[A-Za-z0-9_]+")  # snake_case
_DEFINING = ("class|struct|interface|trait|enum|type|typedef|def|defp|defmodule|fn|func|"
             "function|fun|object|protocol|module|record|impl|val|const|let|var")
_WORD = re.compile(r"[a-z][a-z0-9]+")
STOP_WORDS = {"the", "and", "for", "how", "what", "where", "with", "from", "into", "that",
              "this", "are", "is", "does", "when", "which", "code", "function", "method",
              "class", "implementation", "works", "work", "handled", "handle", "used", "using"}
"""Query words that name no file."""


def file_kinds(path: str, newer_versions: dict[str, int]) -> list[str]:
    """The prior kinds that ``path`` is (``PRIORS``' keys). String operations only: a
    cold search runs this for every candidate file."""
    parts = path.split("/")
    name = parts[-1]
    dirs = {part.lower() for part in parts[:-1]}
    suffix = split_name(name)[1].lower()
    kinds = []
    if is_test(path):
        kinds.append("test")
    if suffix in _DOC_SUFFIXES or dirs & _DOC_DIRS:
        kinds.append("docs")
    if suffix in _CONFIG_SUFFIXES:
        kinds.append("config")
    if dirs & _EXAMPLE_DIRS:
        kinds.append("example")
    if dirs & _LEGACY_DIRS:
        kinds.append("legacy")
    if dirs & _VENDORED_DIRS or ".generated." in name or name.endswith(("_pb2.py", ".min.js")):
        kinds.append("vendored")
    if name.endswith((".d.ts", ".pyi")):
        kinds.append("stub")
    if newer_versions and VERSIONED.search(path):
        for depth, part in enumerate(parts[:-1]):
            match = VERSION_DIR.fullmatch(part.lower())
            if match and newer_versions.get("/".join(parts[:depth]), -1) > int(match.group(1)):
                kinds.append("older")
                break
    return kinds


def identifiers(query: str) -> list[str]:
    """Identifier-like names in ``query``, by their last part; a one-word query is taken
    as a name too."""
    found = [m.group(0) for m in _IDENTIFIER.finditer(query)]
    words = query.split()
    if not found and len(words) == 1 and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", words[0]):
        found = words
    return [last_part(name) for name in found]


def last_part(name: str) -> str:
    """The last part of a qualified name (``serve`` of ``HTTPServer.serve``, ``B`` of
    ``A::B``)."""
    return name.replace("::", ".").rsplit(".", 1)[-1]


def split_name(name: str) -> tuple[str, str]:
    """A file name's stem and suffix (``router``, ``.ts`` of ``router.ts``; a leading dot
    starts no suffix). String operations: this runs for every candidate file."""
    dot = name.rfind(".")
    return (name[:dot], name[dot:]) if dot > 0 else (name, "")


def newest_versions(paths: list[str]) -> dict[str, int]:
    """The newest version directory (``v2`` of ``v1/``, ``v2/``) under each parent, for
    ``file_kinds``' ``older`` kind."""
    newest: dict[str, int] = {}
    for path in paths:
        if not VERSIONED.search(path):
            continue
        parts = path.split("/")
        for depth, part in enumerate(parts[:-1]):
            if match := VERSION_DIR.fullmatch(part.lower()):
                parent = "/".join(parts[:depth])
                newest[parent] = max(newest.get(parent, -1), int(match.group(1)))
    return newest


@functools.lru_cache(maxsize=256)
def definition_pattern(names: tuple[str, ...]) -> re.Pattern[str]:
    """A line that defines one of ``names``: a definition keyword of a common language,
    optional modifiers and qualifiers, then the name, case-sensitive."""
    alternatives = "|".join(re.escape(name) for name in names)
    return re.compile(rf"^\s*(?:(?:export|pub|public|private|protected|internal|static|"
                      rf"abstract|final|open|sealed|data|case|async|default|declare)\s+)*"
                      rf"(?:{_DEFINING})\s+(?:[\w.:]+(?:\.|::))?(?:{alternatives})\b",
                      re.MULTILINE)


def words_of(text: str) -> set[str]:
    """The lower-cased words of ``text``, identifiers split (``VitestProject``,
    ``parse_addr``, ``format-inl``)."""
    return set(_WORD.findall(re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", text).lower()))


def is_barrel(text: str) -> bool:
    """Whether ``BARREL_SHARE`` of the code lines of ``text`` import or re-export (two
    scans in C: this runs for every module-level chunk)."""
    lines = sum(1 for _ in _CODE_LINES.finditer(text))
    reexports = sum(1 for _ in _REEXPORT_LINES.finditer(text))
    return lines > 0 and reexports >= BARREL_SHARE * lines


def prefixes(word: str) -> set[str]:
    """``word``'s prefixes of at least ``WORD_PREFIX`` letters, itself included."""
    return {word[:end] for end in range(WORD_PREFIX, len(word) + 1)}
