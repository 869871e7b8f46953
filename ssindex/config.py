"""Typed build and search settings, loaded from TOML presets (``configs/``).

Every stage takes its own frozen config; ``BuildConfig`` bundles them. A key a
config file names that ssindex does not know is an error, never ignored.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ssindex.errors import ConfigError

if TYPE_CHECKING:
    from ssindex.backends.model import ModelSpec

Quantization = Literal["int8", "int4", "none"]
QUANTIZATIONS: tuple[str, ...] = ("int8", "int4", "none")
COMPILE_CHOICES: tuple[str, ...] = ("auto", "always", "never")
SearchMode = Literal["hybrid", "lexical", "semantic"]
SEARCH_MODES: tuple[str, ...] = ("hybrid", "lexical", "semantic")


@dataclass(frozen=True, slots=True)
class WalkConfig:
    max_file_bytes: int = 1_000_000
    extra_ignores: tuple[str, ...] = ()
    max_average_line_chars: int = 1000
    """Files whose lines average more are minified bundles, source maps or data on a
    line: one chunk each (chunks end on line ends), of no use to search. 0 keeps them.
    No file of the standard library or of this machine's installed packages' sources
    (~70k text files) that is not data averages over 1,000."""
    allow_secrets: bool = False
    """Index secret files and values as they are (``ssindex.text.secrets``), instead of
    skipping the files and redacting the values."""


@dataclass(frozen=True, slots=True)
class ChunkConfig:
    max_chars: int = 500
    """Budget of non-whitespace characters per chunk (cAST)."""
    max_depth: int = 256
    """AST depth past which a node is split by lines instead of recursed into."""


@dataclass(frozen=True, slots=True)
class DedupeConfig:
    near_threshold: float = 0.9
    num_perm: int = 128
    shingle_size: int = 3
    min_tokens: int = 8
    """Chunks with fewer tokens are deduplicated only when exactly equal."""


@dataclass(frozen=True, slots=True)
class EmbedConfig:
    model: str = ""
    """A local Hugging Face model directory; empty means the bundled all-MiniLM-L6-v2."""
    max_tokens: int = 0
    """Cap on a text's tokens; 0: the model's window (``max_seq_length``)."""
    dims: int = 0
    """Keep the first ``dims`` dimensions of each vector (Matryoshka models); 0: all."""
    trust_remote_code: bool = False
    """Let a model that ships its own Python code (``auto_map``) run it."""
    batch_tokens: int = 0
    """Token budget of one forward pass (length-sorted batches, little padding); 0: the
    backend's own (4,096 in bf16 on a CPU, 16,384 in fp32, sized from a GPU's memory)."""
    compile: str = "auto"
    """``torch.compile`` the bulk model: ``auto`` when a CPU build has at least
    ``pipeline.encoder.COMPILE_MIN_CHUNKS`` chunks to embed in bf16, ``always``, ``never``."""

    def model_spec(self) -> ModelSpec:
        """The model, checked against these settings (``ModelSpec.check``)."""
        from ssindex.backends.model import ModelSpec

        return ModelSpec.resolve(self.model, self.max_tokens, self.dims,
                                 self.trust_remote_code)


@dataclass(frozen=True, slots=True)
class CommitConfig:
    progressive: bool = True
    """A first build commits a lexical version before embedding, then partial versions
    (``pipeline.publication``); ``False`` commits once, at the end."""
    every_seconds: float = 60.0
    every_chunks: int = 20_000
    """A partial version is published when either much has passed since the last."""
    min_files: int = 50
    """A first build of fewer files commits once: it embeds in a minute at most."""


@dataclass(frozen=True, slots=True)
class CacheConfig:
    shared: bool = True
    """Take vectors from, and keep new ones in, this machine's shared vector cache
    (``ssindex.index.cache``): a second clone or worktree embeds only what is new."""
    max_mb: int = 2048
    """Its bound on disk; the least recently used vectors go first (float32: about
    1.5 KB each for the bundled model, so ~1.4M vectors)."""


@dataclass(frozen=True, slots=True)
class BuildConfig:
    walk: WalkConfig = field(default_factory=WalkConfig)
    chunk: ChunkConfig = field(default_factory=ChunkConfig)
    dedupe: DedupeConfig = field(default_factory=DedupeConfig)
    embed: EmbedConfig = field(default_factory=EmbedConfig)
    commit: CommitConfig = field(default_factory=CommitConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    quantization: Quantization = "int8"
    backends: tuple[tuple[str, str], ...] = ()
    """Explicit backend choices per phase, e.g. (("embed_bulk", "onnx-cpu"),)."""
    workers: int = 0
    """Processes that read, chunk and prepare files (``engines.pool``); 0 picks from the
    core count and the embed device. Any count builds the same index."""

    def with_overrides(self, **changes: Any) -> BuildConfig:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


_SECTIONS: dict[str, type] = {
    "walk": WalkConfig,
    "chunk": ChunkConfig,
    "dedupe": DedupeConfig,
    "embed": EmbedConfig,
    "commit": CommitConfig,
    "cache": CacheConfig,
}


_BOUNDS: dict[tuple[str, str], tuple[float, float]] = {
    ("walk", "max_file_bytes"): (1, 1 << 40),  # read whole: a file is read up to one past it
    ("walk", "max_average_line_chars"): (0, math.inf),
    ("chunk", "max_chars"): (1, math.inf),
    # the AST split recurses once a level, and Python allows 1,000 frames in all
    ("chunk", "max_depth"): (1, 512),
    # below 0.5, "near duplicates" would share less than half their shingles
    ("dedupe", "near_threshold"): (0.5, 1.0),
    ("dedupe", "num_perm"): (16, math.inf),  # LSH bands of up to 16 rows need as many
    ("dedupe", "shingle_size"): (1, math.inf),
    ("dedupe", "min_tokens"): (0, math.inf),
    ("embed", "max_tokens"): (0, math.inf),
    ("embed", "dims"): (0, math.inf),
    ("embed", "batch_tokens"): (0, math.inf),
    ("commit", "every_seconds"): (0.1, math.inf),
    ("commit", "every_chunks"): (1, math.inf),
    ("commit", "min_files"): (0, math.inf),
    ("cache", "max_mb"): (1, math.inf),
}
"""Inclusive bounds of numeric settings; outside them a build would fail or be useless."""


def _section(cls: type, values: Any, name: str) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"[{name}] must be a table of settings, got {values!r}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"unknown key(s) in [{name}]: {', '.join(unknown)}")
    converted = {}
    for key, value in values.items():
        default = getattr(cls(), key)
        if isinstance(default, tuple):
            value = _patterns(value, f"[{name}] {key}")
        elif (isinstance(default, bool) != isinstance(value, bool)
              or not isinstance(value, type(default))) and not (
                isinstance(default, float) and isinstance(value, int | float)
                and not isinstance(value, bool)):
                raise ConfigError(
                    f"[{name}] {key} must be {type(default).__name__}, got {value!r}"
                )
        low, high = _BOUNDS.get((name, key), (-math.inf, math.inf))
        if isinstance(value, int | float) and not low <= value <= high:
            bound = f"at least {low}" if high == math.inf else f"between {low} and {high}"
            raise ConfigError(f"[{name}] {key} must be {bound}, got {value!r}")
        converted[key] = value
    return cls(**converted)


def _patterns(value: Any, where: str) -> tuple[str, ...]:
    """A list of gitignore-style patterns, each one pathspec takes."""
    from ssindex.text.globs import glob_fault

    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{where} must be a list of strings, got {value!r}")
    for pattern in value:
        if fault := glob_fault(pattern):
            raise ConfigError(f"{where}: not a gitignore pattern: {pattern!r} ({fault})")
    return tuple(value)


def config_from_mapping(data: dict[str, Any]) -> BuildConfig:
    """Build a ``BuildConfig`` from parsed TOML, rejecting unknown keys and bad types."""
    unknown = sorted(set(data) - {*_SECTIONS, "quantization", "backends", "workers"})
    if unknown:
        raise ConfigError(f"unknown config section(s): {', '.join(unknown)}")
    parts = {name: _section(cls, data.get(name, {}), name) for name, cls in _SECTIONS.items()}
    if parts["embed"].compile not in COMPILE_CHOICES:
        raise ConfigError(f"[embed] compile must be one of {', '.join(COMPILE_CHOICES)}, "
                          f"got {parts['embed'].compile!r}")
    quantization = data.get("quantization", "int8")
    if quantization not in QUANTIZATIONS:
        raise ConfigError(f"quantization must be one of {', '.join(QUANTIZATIONS)}")
    backends = data.get("backends", {})
    if not isinstance(backends, dict) or not all(isinstance(v, str) for v in backends.values()):
        raise ConfigError('[backends] must be a table of phase = "backend"')
    if backends:  # phase and backend names live with the backends
        from ssindex.backends.names import parse_overrides

        backends = parse_overrides([f"{phase}={name}" for phase, name in backends.items()])
    workers = data.get("workers", 0)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ConfigError(f"workers must be a whole number, at least 0, got {workers!r}")
    return BuildConfig(
        **parts, quantization=quantization, backends=tuple(sorted(backends.items())),
        workers=workers,
    )


def load_config(path: Path | None) -> BuildConfig:
    """Read a TOML preset; ``None`` gives the defaults."""
    if path is None:
        return BuildConfig()
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    return config_from_mapping(data)


