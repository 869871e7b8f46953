"""Chunks cut to the model's window, on the whole standard library: how many chunks are
longer than the bundled model's window (code before #24 cut their tails off; this code
leaves only single lines that long, and embeds them window by window), how many chunks
there are, and the index size, for this code and (``--baseline SRC``, a checkout of
earlier code) the code before it.

Both indexes are built with ``--no-embed`` (the chunks are the same as a full build's;
embedding the standard library takes an hour on a 2-core AVX2 machine), and each stored
chunk's embedding text is tokenized as the embed stage would. The size of a full index
adds each chunk's int8 vector (388 bytes for the bundled model).

    python benchmarks/window_fit.py --workdir /tmp/fit --baseline /tmp/before [--json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _corpus import copy_stdlib, report, without_shared_cache
from _machine import cpu_label

from ssindex.backends.model import ModelSpec
from ssindex.index.layout import IndexDir
from ssindex.records import Chunk
from ssindex.stages.embed import ModelWindow

VECTOR_BYTES = 388
"""An int8 vector of the bundled model: 384 codes and a float32 scale."""


def build(tree: Path, index: Path, source: Path | None) -> float:
    """Seconds to build a lexical index of ``tree`` with the code at ``source`` (this
    checkout when ``None``)."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(source)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ssindex", "build", str(tree), "--index", str(index),
                    "--no-embed", "--no-progress", "--json"], check=True, env=env,
                   stdout=subprocess.DEVNULL, cwd=source or Path.cwd())
    return time.perf_counter() - started


def measure(index: Path) -> dict[str, Any]:
    """Chunks, chunks longer than the bundled model's window, and bytes on disk of ``index``."""
    head = IndexDir(index).read_head()
    rows = IndexDir(index).read_manifest(head.data["snapshot"])
    window = ModelWindow(ModelSpec.resolve(None))
    names = ["id", "path", "language", "start_line", "end_line", "symbol", "kind", "text"]
    columns = {name: rows.column(name).to_pylist() for name in names}
    chunks = [Chunk(**dict(zip(names, values, strict=True)), content_hash="", file_hash="")
              for values in zip(*columns.values(), strict=True)]
    longer = sum(t.truncated for i in range(0, len(chunks), 2048)
                 for t in window.measure(chunks[i:i + 2048]))
    size = sum(f.stat().st_size for f in index.rglob("*") if f.is_file())
    return {"chunks": len(chunks), "longer_than_window": longer, "lexical_bytes": size,
            "full_index_bytes": size + VECTOR_BYTES * len(chunks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--baseline", type=Path, help="a checkout of the code to compare with")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    without_shared_cache()
    tree = args.workdir / "stdlib"
    if not tree.exists():
        copy_stdlib(tree, "", everything=True)
    result: dict[str, Any] = {"cpu": cpu_label()}
    runs = {"window": None, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    for name, source in runs.items():
        index = args.workdir / f"index-{name}"
        shutil.rmtree(index, ignore_errors=True)  # a clean build each time
        seconds = build(tree, index, source)
        result |= {f"{name}_{key}": value for key, value in measure(index).items()}
        result[f"{name}_build_seconds"] = round(seconds, 1)
    if args.baseline:
        for key in ("chunks", "full_index_bytes", "build_seconds"):
            result[f"ratio_{key}"] = round(result[f"window_{key}"] / result[f"baseline_{key}"], 3)
    report(result, args.json)


if __name__ == "__main__":
    main()
