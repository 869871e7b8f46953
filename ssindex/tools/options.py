"""Command-line options that override a build's settings, checked."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ssindex.config import QUANTIZATIONS, BuildConfig, load_config
from ssindex.errors import ConfigError
from ssindex.pipeline.plan import RayOptions


def build_config(config: Path | None, quantize: str | None = None, model: str | None = None,
                 allow_secrets: bool = False, workers: int | None = None,
                 dims: int | None = None, trust_remote_code: bool = False,
                 no_shared_cache: bool = False) -> BuildConfig:
    """The preset at ``config`` (or the defaults) with the options given."""
    cfg = load_config(config)
    if quantize is not None:
        if quantize not in QUANTIZATIONS:
            raise ConfigError(f"--quantize must be one of {', '.join(QUANTIZATIONS)}")
        cfg = replace(cfg, quantization=quantize)  # type: ignore[arg-type]
    embed = cfg.embed
    if model is not None:
        embed = replace(embed, model=model)
    if dims is not None:
        embed = replace(embed, dims=dims)
    if trust_remote_code:
        embed = replace(embed, trust_remote_code=True)
    cfg = replace(cfg, embed=embed)
    if allow_secrets:
        cfg = replace(cfg, walk=replace(cfg.walk, allow_secrets=True))
    if no_shared_cache:
        cfg = replace(cfg, cache=replace(cfg.cache, shared=False))
    return cfg if workers is None else replace(cfg, workers=workers)


def engine_options(engine: str, ray: RayOptions, workers: int | None) -> RayOptions | None:
    """The Ray options of a Ray build (``None`` for a local one), checked against the
    engine's other options."""
    if engine not in ("local", "ray"):
        raise ConfigError("--engine must be local or ray")
    if engine == "local" and (ray.address or ray.embed_actors or ray.gpus_per_actor is not None):
        raise ConfigError("--ray-address, --embed-actors and --gpus-per-actor need --engine ray")
    if engine == "ray" and workers is not None:
        raise ConfigError("--workers is the local engine's; Ray schedules its own tasks")
    return ray if engine == "ray" else None
