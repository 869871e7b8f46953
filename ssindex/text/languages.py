"""File name → language, and the languages that get AST chunking."""

from __future__ import annotations

_BY_SUFFIX: dict[str, str] = {
    ".py": "python", ".pyi": "python", ".pyw": "python",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript",
    ".ts": "typescript", ".mts": "typescript", ".cts": "typescript", ".tsx": "tsx",
    ".go": "go", ".rs": "rust", ".java": "java",
    ".c": "c", ".h": "c",
    ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".hpp": "cpp", ".hh": "cpp", ".hxx": "cpp",
    ".cs": "csharp", ".rb": "ruby", ".php": "php",
    ".kt": "kotlin", ".kts": "kotlin", ".swift": "swift",
    ".scala": "scala", ".sc": "scala",
    ".sh": "bash", ".bash": "bash", ".zsh": "bash",
    ".md": "markdown", ".rst": "rst", ".txt": "text",
    ".toml": "toml", ".yaml": "yaml", ".yml": "yaml", ".json": "json",
    ".html": "html", ".css": "css", ".sql": "sql", ".lua": "lua",
}
_BY_NAME: dict[str, str] = {
    "Makefile": "make", "Dockerfile": "dockerfile", "CMakeLists.txt": "cmake",
    "Gemfile": "ruby", "Rakefile": "ruby",
}

LANGUAGES: frozenset[str] = frozenset({*_BY_SUFFIX.values(), *_BY_NAME.values()})
"""Every language a chunk can be marked with."""

AST_LANGUAGES: frozenset[str] = frozenset({
    "python", "javascript", "typescript", "tsx", "go", "rust", "java", "c", "cpp",
    "csharp", "ruby", "php", "kotlin", "swift", "scala", "bash",
})
"""Languages chunked along their syntax tree; all others use line windows."""


def detect_language(path: str) -> str | None:
    """The language of a file from its name alone, or ``None`` when unknown."""
    name = path.rpartition("/")[2]  # not PurePosixPath: this runs for every file of a walk
    if name in _BY_NAME:
        return _BY_NAME[name]
    dot = name.rfind(".")
    return _BY_SUFFIX.get(name[dot:].lower()) if 0 < dot < len(name) - 1 else None


def language_named(name: str) -> str | None:
    """The language a user names: its own name or a file suffix of it (``py``, ``.ts``),
    any case; ``None`` when no known language is meant."""
    name = name.strip().lower()
    if name in LANGUAGES:
        return name
    return _BY_SUFFIX.get(name if name.startswith(".") else f".{name}")
