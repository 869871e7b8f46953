"""A fixed, real corpus for benchmarks: standard-library chunks from our own chunker."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

from ssindex.backends.model import ModelSpec
from ssindex.config import ChunkConfig, WalkConfig
from ssindex.index.cache import ENV_SWITCH
from ssindex.stages.chunk import chunk_file
from ssindex.stages.embed import ModelWindow, embedding_text
from ssindex.stages.walk import WalkStats, walk

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def without_shared_cache() -> None:
    """Turn this machine's shared vector cache off here and in child processes, so each
    build embeds what it measures instead of reusing an earlier build's vectors."""
    os.environ[ENV_SWITCH] = "off"


def stdlib_chunk_texts(count: int, seed: int = 0) -> list[str]:
    """``count`` embedding texts sampled (fixed seed) from chunks of the standard library,
    cut to the bundled model's window as a build cuts them: each fits the window, so a
    reference that truncates at the window reads the same tokens."""
    window = ModelWindow(ModelSpec.resolve(None))
    texts: list[str] = []
    for source in walk(STDLIB, WalkConfig(), WalkStats()):
        if source.language == "python":
            chunks, _ = chunk_file(source, ChunkConfig(), window)
            texts.extend(embedding_text(c) for c in chunks)
    return random.Random(seed).sample(texts, min(count, len(texts)))


def copy_stdlib(root: Path, packages: str, everything: bool) -> None:
    """Copy the whole standard library, or the comma-separated ``packages``, to ``root``;
    never installed packages, which some Pythons keep inside it (``site-packages``)."""
    ignore = shutil.ignore_patterns("__pycache__", "site-packages", "dist-packages")
    if everything:
        shutil.copytree(STDLIB, root, ignore=ignore)
        return
    for name in packages.split(","):
        shutil.copytree(STDLIB / name, root / name, ignore=ignore)


def child_stdout(command: list[str], **options: Any) -> str:
    """The stdout of a benchmark's child process; where it fails, exit with its stderr,
    which ``subprocess.CalledProcessError`` alone would leave unseen."""
    done = subprocess.run(command, capture_output=True, text=True, **options)
    if done.returncode:
        raise SystemExit(f"{Path(command[0]).name} exited {done.returncode}:\n{done.stderr}")
    return done.stdout


def report(result: dict[str, Any], as_json: bool) -> None:
    """One JSON object, or an aligned two-column table."""
    if as_json:
        print(json.dumps(result))
        return
    width = max(len(key) for key in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")


NO_FORWARD = '''
import numpy as np
from ssindex.backends import registry


class NoForward:
    """A backend without a model: one unit vector per batch row, picked by its ids."""
    name, device, dtype, batch_tokens = "no-forward", "cpu", "fp32", 16384

    def __init__(self, dim):
        self._dim = dim

    def forward(self, input_ids, attention_mask):
        out = np.zeros((len(input_ids), self._dim), np.float32)
        out[np.arange(len(input_ids)), (input_ids * attention_mask).sum(1) % self._dim] = 1
        return out


registry.FACTORIES["torch-cpu-fp32"] = lambda model, inventory, calibrated: NoForward(model.dim)
BACKENDS = {"embed_bulk": "torch-cpu-fp32"}
'''
"""Code for a benchmark's build process: the ``torch-cpu-fp32`` backend without its forward
pass, so that the build measures everything else (pass ``BACKENDS`` to ``build``)."""
