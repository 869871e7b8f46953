"""The model cache directory (exported ONNX and Core ML models, calibration)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$SSINDEX_CACHE_DIR``, else ``$XDG_CACHE_HOME/ssindex``, else ``~/.cache/ssindex``."""
    explicit = os.environ.get("SSINDEX_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "ssindex"


def config_dir() -> Path:
    """``$SSINDEX_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/ssindex``, else ``~/.config/ssindex``."""
    explicit = os.environ.get("SSINDEX_CONFIG_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(Path.home(), ".config")
    return Path(base) / "ssindex"
