"""Local engine against the Ray engine on the same standard-library slice, in one run,
with the per-actor figures a cluster projection is built from.

    python benchmarks/ray_scaling.py [--packages json,email | --all] [--actors N] [--json]

Both builds run in this process through the library API. The Ray build starts a
local cluster on this machine's CPUs first (not timed). Peak memory per stage is
sampled from the worker processes, which Ray titles ``ray::<task or actor>``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import copy_stdlib, report, without_shared_cache

from ssindex import build
from ssindex.config import DedupeConfig
from ssindex.index.layout import IndexDir
from ssindex.index.table import scan
from ssindex.pipeline.engines.ray_tasks import dedupe_keys
from ssindex.pipeline.plan import RayOptions
from ssindex.stages.signature import rows_per_band

_STAGES = {"chunk_block": "chunk", "dedupe": "dedupe", "EmbedActor": "embed",
           "copy_exemplar": "copy", "write_fragments": "write"}


class PeakMemory:
    """Peak resident memory (MiB) of Ray worker processes, by pipeline stage."""

    def __init__(self) -> None:
        self.peak: dict[str, float] = defaultdict(float)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            for proc in Path("/proc").iterdir():
                try:
                    title = (proc / "cmdline").read_bytes().decode(errors="replace")
                    status = (proc / "status").read_text() if "ray::" in title else ""
                except OSError:
                    continue
                stage = next((s for key, s in _STAGES.items() if key in title), None)
                rss = next((line.split()[1] for line in status.splitlines()
                            if line.startswith("VmRSS:")), None)
                if stage and rss:
                    self.peak[stage] = max(self.peak[stage], int(rss) / 1024)


def _shuffle_bytes_per_chunk(index: Path) -> float:
    """Bytes the dedupe shuffle moves per chunk: its key rows, measured on the real chunks."""
    rows = scan(IndexDir(index).open_table(), ["id", "content_hash", "minhash"])
    rows = rows.append_column("ordinal", pa.array(range(rows.num_rows), pa.int64()))
    cfg = DedupeConfig()
    keys = dedupe_keys(rows, rows_per_band(cfg.near_threshold, cfg.num_perm))
    return keys.nbytes / max(rows.num_rows, 1)


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", default="json,email")
    parser.add_argument("--all", action="store_true", help="the whole standard library")
    parser.add_argument("--actors", type=int, default=None, help="embedding actors")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    without_shared_cache()
    import ray

    with tempfile.TemporaryDirectory(prefix="ssindex-ray-") as tmp:
        root = Path(tmp) / "tree"
        copy_stdlib(root, args.packages, args.all)
        started = time.perf_counter()
        local = build(root, Path(tmp) / "local")
        local_s = time.perf_counter() - started
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
        try:
            with PeakMemory() as memory:
                started = time.perf_counter()
                distributed = build(root, Path(tmp) / "ray",
                                    ray=RayOptions(embed_actors=args.actors))
                ray_s = time.perf_counter() - started
        finally:
            ray.shutdown()
        shuffle = _shuffle_bytes_per_chunk(Path(tmp) / "ray")
        commit = _dir_bytes(Path(tmp) / "ray" / "db") / max(distributed["chunks_total"], 1)
        shutil.rmtree(root)
    chunks, files = local["chunks_total"], local["files_indexed"]
    actors = distributed["backends"]["embed_bulk"]["embed_actors"]
    embed_s = distributed["stage_seconds"]["embed"]
    per_actor = distributed["chunks_embedded"] / embed_s / actors if embed_s else 0.0
    result: dict[str, Any] = {
        "files": files, "chunks": chunks, "cpus": os.cpu_count(), "embed_actors": actors,
        "local_s": round(local_s, 1), "ray_s": round(ray_s, 1),
        "ray_overhead_ratio": round(ray_s / local_s, 2),
        "local_stage_s": local["stage_seconds"], "ray_stage_s": distributed["stage_seconds"],
        "local_embed_chunks_per_s": round(
            local["chunks_embedded"] / local["stage_seconds"]["embed"], 1),
        "ray_embed_chunks_per_s_per_actor": round(per_actor, 1),
        "peak_rss_mib_by_stage": {k: round(v) for k, v in sorted(memory.peak.items())},
        "shuffle_bytes_per_chunk": round(shuffle),
        "index_bytes_per_chunk": round(commit),
        "same_rows": local["chunks_total"] == distributed["chunks_total"]
        and local["chunks_deduplicated"] == distributed["chunks_deduplicated"],
    }
    result["projection_1m_files"] = _projection(chunks / files, per_actor, shuffle, commit)
    report(result, args.json)


def _projection(chunks_per_file: float, per_actor: float, shuffle: float,
                commit: float) -> dict[str, Any]:
    """1M files from the measured per-file and per-actor figures (embedding dominates;
    the shuffle and the commit grow linearly with chunks)."""
    chunks = 1_000_000 * chunks_per_file
    return {
        "chunks": round(chunks),
        "shuffle_gib": round(chunks * shuffle / 2**30, 1),
        "index_gib": round(chunks * commit / 2**30, 1),
        "embed_hours_by_cpu_actors": {n: round(chunks / (per_actor * n) / 3600, 1)
                                      for n in (1, 8, 64)} if per_actor else {},
    }


if __name__ == "__main__":
    main()
