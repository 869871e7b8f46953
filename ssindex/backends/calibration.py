"""What ``ssindex calibrate`` stored for this machine: a winner per phase (a backend and
its figure), and where the attention kernel runs (``backends.attention``), the
attention that won for the model it was measured on (under ``attention``)."""

from __future__ import annotations

import json

from ssindex.backends.inventory import Inventory
from ssindex.util.dirs import config_dir

CALIBRATION_FILE = "calibration.json"


def machine_key(inventory: Inventory) -> str:
    """The machine a calibration was measured on: figures hold on the same one only."""
    gpus = ",".join(d["name"] for d in inventory.cuda_devices)
    return f"{inventory.cpu_model}|{inventory.cpu_count}|{gpus}|{inventory.system}"


def load_calibration(inventory: Inventory) -> dict[str, dict[str, str]]:
    """Calibrated winners for this machine, by phase (and ``attention``), each a
    ``backend`` and its ``figure``; ``{}`` for none. Entries of another shape (a file
    edited by hand, or written by another version) are left out, never a crash."""
    try:
        data = json.loads((config_dir() / CALIBRATION_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("machine") != machine_key(inventory):
        return {}
    phases = data.get("phases")
    if not isinstance(phases, dict):
        return {}
    return {phase: {key: str(value) for key, value in winner.items()}
            for phase, winner in phases.items()
            if isinstance(winner, dict) and isinstance(winner.get("backend"), str)}
