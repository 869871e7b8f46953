from __future__ import annotations

from pathlib import Path

import pytest

from ssindex.config import BuildConfig, load_config
from ssindex.errors import ConfigError

PRESETS = sorted((Path(__file__).parents[1] / "configs").glob("*.toml"))


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_presets_load(preset: Path) -> None:
    assert isinstance(load_config(preset), BuildConfig)


def test_default_preset_matches_code_defaults() -> None:
    assert load_config(Path(__file__).parents[1] / "configs" / "default.toml") == BuildConfig()


@pytest.mark.parametrize("text", ["[chunk]\nmax_char = 3\n", "[nope]\n", "quantization='int3'\n",
                                  "[chunk]\nmax_chars = 'big'\n", "not toml ["])
def test_bad_configs_are_rejected(tmp_path: Path, text: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        load_config(path)
