"""What both engines fill while they run: per-stage counts and the build manifest."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ssindex.pipeline.timing import StageClock
from ssindex.records import SourceFile
from ssindex.stages.chunk import ChunkStats
from ssindex.stages.dedupe import DedupeStats
from ssindex.stages.embed import EmbedStats
from ssindex.stages.walk import WalkStats


@dataclass
class RunStats:
    walk: WalkStats = field(default_factory=WalkStats)
    chunk: ChunkStats = field(default_factory=ChunkStats)
    dedupe: DedupeStats = field(default_factory=DedupeStats)
    embed: EmbedStats = field(default_factory=EmbedStats)
    clock: StageClock = field(default_factory=StageClock)
    manifest: list[dict[str, Any]] = field(default_factory=list)
    row_ids: set[str] = field(default_factory=set)
    """Every chunk id of the new index, written or unchanged."""


def manifest_entry(source: SourceFile, chunk_ids: list[str]) -> dict[str, Any]:
    """A file's row of the build manifest (``store.MANIFEST_SCHEMA``)."""
    return {"path": source.path, "size": source.size, "mtime_ns": source.mtime_ns,
            "content_hash": source.content_hash, "chunk_ids": chunk_ids,
            "ctime_ns": source.ctime_ns, "inode": source.inode,
            "secrets_redacted": source.secrets}
