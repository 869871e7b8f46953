"""ssindex: a GPU-aware batch indexing pipeline for code search.

    from ssindex import build, Searcher
    stats = build("path/to/repo")
    hits = Searcher("path/to/repo/.ssindex").search("parse a config file")
    hits = Searcher(...).search("retry", filters=Filters.of(paths=["src/"], tests="exclude"))
"""

import os

os.environ.setdefault("LANCE_LOG", "error")
# LanceDB's Rust logger: real warnings stay, but not the notice that a first build's
# table "will be created", which every clean build would print into the user's terminal
os.environ.setdefault("LANCEDB_LOG", "warn,lance::dataset::write::insert=error")

from typing import Any

from ssindex.config import BuildConfig, load_config
from ssindex.errors import SsindexError

__all__ = ["BuildConfig", "Filters", "SearchResponse", "Searcher", "SsindexError", "Workspace",
           "build", "load_config"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """``build`` and the search API load on first use: a search process never imports
    the build pipeline (tree-sitter, the secret detectors), which would add to its start."""
    if name == "build":
        from ssindex.pipeline.build import build

        return build
    if name in ("Searcher", "SearchResponse"):
        from ssindex.query import searcher

        return getattr(searcher, name)
    if name == "Filters":
        from ssindex.query.filters import Filters

        return Filters
    if name == "Workspace":
        from ssindex.query.workspace import Workspace

        return Workspace
    raise AttributeError(f"module 'ssindex' has no attribute {name!r}")
