"""What keeping secrets out costs: the walk with and without the secrets rules, in one run.

    python benchmarks/secrets_cost.py [--rounds 5] [--json]

Walks the whole standard library (``sysconfig``'s stdlib, without site-packages)
``--rounds`` times each way, alternating, with ``allow_secrets`` off (the default:
secret files skipped, values redacted) and on (the baseline: nothing scanned). The
CPU side it is measured against is the same files' walk, chunking and MinHash
signing (what a build does before embedding), timed once in the same run. Target
(issue #19, any CPU kind): the rules add at most 10% to that CPU side.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import STDLIB, report
from _machine import cpu_label

from ssindex.config import ChunkConfig, DedupeConfig, WalkConfig
from ssindex.stages.chunk import chunk_file
from ssindex.stages.signature import Signer
from ssindex.stages.walk import WalkStats, walk


def _walk(allow: bool) -> tuple[float, WalkStats, list]:
    stats = WalkStats()
    started = time.perf_counter()
    files = list(walk(STDLIB, WalkConfig(allow_secrets=allow), stats))
    return time.perf_counter() - started, stats, files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    _walk(True)  # warm the page cache
    guarded, plain = [], []
    for _ in range(args.rounds):
        guarded.append(_walk(False)[0])
        plain.append(_walk(True)[0])
    _, stats, files = _walk(False)
    started = time.perf_counter()
    sign = Signer(DedupeConfig())
    chunks = 0
    for source in files:
        texts = [chunk.text for chunk in chunk_file(source, ChunkConfig())[0]]
        sign(texts)
        chunks += len(texts)
    chunk_seconds = time.perf_counter() - started
    added = statistics.median(guarded) - statistics.median(plain)
    cpu_side = statistics.median(plain) + chunk_seconds
    report({
        "cpu": cpu_label(),
        "files": len(files), "chunks": chunks,
        "walk_s_secrets_rules (median)": round(statistics.median(guarded), 3),
        "walk_s_allow_secrets (median)": round(statistics.median(plain), 3),
        "chunk_and_sign_s": round(chunk_seconds, 3),
        "added_s": round(added, 3),
        "added_share_of_cpu_side": round(added / cpu_side, 4),
        "target": "<= 0.10 of the CPU side (walk + chunk + sign), any CPU kind",
        "files_skipped_secret": stats.skipped.get("secret", 0),
        "values_redacted": dict(stats.secrets_redacted),
    }, args.json)


if __name__ == "__main__":
    main()
