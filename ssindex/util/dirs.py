"""The user's directories: the cache (exported ONNX and Core ML models, the model
fingerprint) and the config (calibration), each overridable by an environment variable."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$SSINDEX_CACHE_DIR``, else ``$XDG_CACHE_HOME/ssindex``, else ``~/.cache/ssindex``."""
    return _user_dir("SSINDEX_CACHE_DIR", "XDG_CACHE_HOME", ".cache")


def config_dir() -> Path:
    """``$SSINDEX_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/ssindex``, else ``~/.config/ssindex``."""
    return _user_dir("SSINDEX_CONFIG_DIR", "XDG_CONFIG_HOME", ".config")


def _user_dir(explicit: str, xdg: str, home_default: str) -> Path:
    if os.environ.get(explicit):
        return Path(os.environ[explicit])
    base = os.environ.get(xdg) or os.path.join(Path.home(), home_default)
    return Path(base) / "ssindex"
