"""ssindex: a GPU-aware batch indexing pipeline for code search.

    from ssindex import build, Searcher
    stats = build("path/to/repo")
    hits = Searcher("path/to/repo/.ssindex").search("parse a config file")
"""

import os

os.environ.setdefault("LANCE_LOG", "error")

from ssindex.config import BuildConfig, load_config
from ssindex.errors import SsindexError
from ssindex.pipeline.build import build
from ssindex.search import Searcher, SearchResponse

__all__ = ["BuildConfig", "SearchResponse", "Searcher", "SsindexError", "build", "load_config"]
__version__ = "0.1.0"
