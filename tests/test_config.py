from __future__ import annotations

import tomllib
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest

from ssindex.config import BuildConfig, load_config
from ssindex.errors import ConfigError

PRESETS = sorted((Path(__file__).parents[1] / "configs").glob("*.toml"))


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_presets_load(preset: Path) -> None:
    assert isinstance(load_config(preset), BuildConfig)


DEFAULT = Path(__file__).parents[1] / "configs" / "default.toml"


def test_default_preset_matches_code_defaults() -> None:
    assert load_config(DEFAULT) == BuildConfig()


def test_default_preset_spells_out_every_key() -> None:
    preset = tomllib.loads(DEFAULT.read_text())
    defaults = BuildConfig()
    for option in fields(BuildConfig):
        section = getattr(defaults, option.name)
        if is_dataclass(section):
            assert set(preset[option.name]) == {key.name for key in fields(section)}, option.name
        elif option.name != "backends":  # its phases are left to auto, so commented out
            assert option.name in preset


@pytest.mark.parametrize("text", ["[chunk]\nmax_char = 3\n", "[nope]\n", "quantization='int3'\n",
                                  "[chunk]\nmax_chars = 'big'\n", "not toml [",
                                  "[backends]\nindex = 'torch-cpu'\n",
                                  "[backends]\nembed_bulk = 'warp'\n",
                                  "[backends]\nembed_bulk = 3\n", "workers = -1\n",
                                  "workers = 'all'\n", "workers = true\n", "walk = 5\n",
                                  "[walk]\nextra_ignores = 5\n",
                                  "[walk]\nextra_ignores = '*.py'\n",
                                  "[walk]\nextra_ignores = [1]\n",
                                  "[walk]\nextra_ignores = ['!']\n",
                                  "[walk]\nextra_ignores = ['[z-a]']\n",
                                  "[walk]\nmax_file_bytes = 9223372036854775807\n",
                                  "[chunk]\nmax_depth = 1000\n"])
def test_bad_configs_are_rejected(tmp_path: Path, text: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        load_config(path)


@pytest.mark.parametrize(("text", "message"), [
    ("[embed]\nmax_tokens = -5\n", "max_tokens must be at least 0, got -5"),
    ("[embed]\ndims = -1\n", "dims must be at least 0, got -1"),
    ("[embed]\nbatch_tokens = -1\n", "batch_tokens must be at least 0"),
    ("[embed]\ncompile = \"sometimes\"\n", "compile must be one of auto, always, never"),
    ("[dedupe]\nnum_perm = 8\n", "num_perm must be at least 16"),
    ("[dedupe]\nnear_threshold = 1.5\n", "near_threshold must be between 0.5 and 1.0"),
    ("[chunk]\nmax_chars = 0\n", "max_chars must be at least 1"),
    ("[walk]\nmax_average_line_chars = -1\n", "max_average_line_chars must be at least 0"),
])
def test_settings_out_of_bounds_are_rejected(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_settings_at_their_bounds_load(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[embed]\nmax_tokens = 3\nbatch_tokens = 1\n[dedupe]\nnum_perm = 16\n"
                    "near_threshold = 1.0\n[walk]\nmax_average_line_chars = 0\n")
    cfg = load_config(path)
    assert (cfg.embed.max_tokens, cfg.dedupe.num_perm, cfg.dedupe.near_threshold) == (3, 16, 1.0)
