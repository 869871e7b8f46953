"""``ssindex doctor``: what this machine has and what each phase would run on."""

from __future__ import annotations

from typing import Any

from ssindex.backends.inventory import detect
from ssindex.backends.model import ModelSpec
from ssindex.backends.names import PHASES
from ssindex.backends.selector import load_calibration, select


def diagnose(model: str | None = None) -> dict[str, Any]:
    inventory = detect()
    spec = ModelSpec.resolve(model)
    runtimes = dict(inventory.runtimes)
    phases: dict[str, Any] = {}
    warnings: list[str] = []
    for phase in PHASES:
        selection = select(phase, spec, inventory=inventory, warn=warnings.append)
        phases[phase] = selection.as_json()
    return {
        "hardware": inventory.as_json(),
        "runtimes": runtimes,
        "model": spec.model_id,
        "phases": phases,
        "calibrated": load_calibration(inventory),
        "warnings": warnings,
    }
