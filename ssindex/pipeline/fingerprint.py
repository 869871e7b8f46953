"""The settings fingerprint: what, changed, invalidates an index's chunks or vectors."""

from __future__ import annotations

import dataclasses
from typing import Any

import xxhash

from ssindex.backends.model import ModelSpec
from ssindex.config import BuildConfig
from ssindex.index.layout import FORMAT_VERSION


def settings_fingerprint_fields(cfg: BuildConfig) -> dict[str, Any]:
    """The settings whose change invalidates chunks or vectors in an index."""
    from ssindex.stages.chunk import CHUNKER_VERSION
    from ssindex.text.lexical import ANALYZER_VERSION
    from ssindex.text.secrets import SECRETS_VERSION

    return {
        "code": (CHUNKER_VERSION, ANALYZER_VERSION),
        "chunk": dataclasses.asdict(cfg.chunk),
        "dedupe": dataclasses.asdict(cfg.dedupe),
        "max_tokens": cfg.embed.max_tokens,
        "quantization": cfg.quantization,
        # stored chunks hold the text as redacted (or not) by the secrets rules
        "secrets": "allowed" if cfg.walk.allow_secrets else SECRETS_VERSION,
    }


def settings_fingerprint(cfg: BuildConfig, model: ModelSpec) -> str:
    fields = {"format": FORMAT_VERSION, "model": model.key,
              **settings_fingerprint_fields(cfg)}
    return xxhash.xxh3_64_hexdigest(repr(sorted(fields.items())).encode())
