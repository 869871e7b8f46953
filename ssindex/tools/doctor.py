"""``ssindex doctor``: what this machine has, what each phase would run on, and (for a
``--model``) what ssindex understood of the model and which backends run it."""

from __future__ import annotations

from typing import Any

from ssindex.backends.base import runtime_errors
from ssindex.backends.calibration import load_calibration
from ssindex.backends.inventory import Inventory, detect
from ssindex.backends.model import ModelSpec
from ssindex.backends.names import PHASES
from ssindex.backends.registry import create
from ssindex.backends.selector import probe, select
from ssindex.errors import SsindexError, first_line
from ssindex.tools.calibrate import runnable_backends


def diagnose(model: str | None = None, trust_remote_code: bool = False) -> dict[str, Any]:
    inventory = detect()
    spec = ModelSpec.resolve(model, trust_remote_code=trust_remote_code)
    runtimes = dict(inventory.runtimes)
    phases: dict[str, Any] = {}
    warnings: list[str] = []
    for phase in PHASES:
        selection = select(phase, spec, inventory=inventory, warn=warnings.append)
        phases[phase] = selection.as_json()
    report = {
        "hardware": inventory.as_json(),
        "runtimes": runtimes,
        "model": spec.model_id,
        "card": spec.card.as_json(),
        "phases": phases,
        "calibrated": load_calibration(inventory),
        "warnings": warnings,
    }
    if model:  # every backend here tried on the model: an export or a load takes seconds
        report["backends"] = {name: _runs(name, spec, inventory)
                              for name in runnable_backends(inventory)}
    return report


def _runs(name: str, spec: ModelSpec, inventory: Inventory) -> str:
    """``runs``, or why backend ``name`` cannot run ``spec`` here (one line)."""
    failures: tuple[type[Exception], ...] = (SsindexError, *runtime_errors())
    try:
        probe(create(name, spec, inventory))
    except failures as exc:
        return first_line(exc)
    return "runs"
