"""What ``ssindex calibrate`` stored for this machine: a winner per phase, and per
attention implementation where the AMX kernel runs (``backends.attention``)."""

from __future__ import annotations

import json
from typing import Any

from ssindex.backends.inventory import Inventory
from ssindex.util.dirs import config_dir

CALIBRATION_FILE = "calibration.json"


def machine_key(inventory: Inventory) -> str:
    """The machine a calibration was measured on: figures hold on the same one only."""
    gpus = ",".join(d["name"] for d in inventory.cuda_devices)
    return f"{inventory.cpu_model}|{inventory.cpu_count}|{gpus}|{inventory.system}"


def load_calibration(inventory: Inventory) -> dict[str, Any]:
    """Calibrated winners per phase for this machine, or ``{}``."""
    try:
        data = json.loads((config_dir() / CALIBRATION_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("machine") != machine_key(inventory):
        return {}
    return dict(data.get("phases", {}))
