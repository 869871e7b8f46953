"""The scheduled CI example: valid, and its ssindex steps run as written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

WORKFLOW = Path(__file__).resolve().parents[1] / "examples" / "ci" / "index-monorepo.yml"
BUILD = "ssindex build . --json --no-progress > build-stats.json"
FILES = {
    "app/cli.py": "import argparse\n\n\ndef main():\n"
                  "    parser = argparse.ArgumentParser(prog='app')\n"
                  "    parser.add_argument('path')\n    return parser.parse_args()\n",
    "app/store.py": "import sqlite3\n\n\ndef open_store(path):\n"
                    "    return sqlite3.connect(path)\n",
    "lib/retry.py": "import time\n\n\ndef retry(fn, attempts=3):\n    for i in range(attempts):\n"
                    "        try:\n            return fn()\n        except OSError:\n"
                    "            time.sleep(2 ** i)\n",
}


def _workflow() -> dict[Any, Any]:
    return dict(yaml.safe_load(WORKFLOW.read_text(encoding="utf-8")))


def _steps() -> list[dict[str, Any]]:
    jobs = _workflow()["jobs"]
    assert len(jobs) == 1
    return list(next(iter(jobs.values()))["steps"])


def _uses(step: dict[str, Any], action: str) -> bool:
    return str(step.get("uses", "")).split("@")[0] == action


def test_workflow_is_scheduled() -> None:
    workflow = _workflow()
    triggers: dict[str, Any] = workflow.get("on") or workflow[True]  # YAML 1.1: `on` is true
    crons = [entry["cron"] for entry in triggers["schedule"]]
    assert crons and all(len(cron.split()) == 5 for cron in crons)


def test_restores_builds_uploads_in_order() -> None:
    steps = _steps()
    cache = next(i for i, s in enumerate(steps) if _uses(s, "actions/cache"))
    build = next(i for i, s in enumerate(steps) if s.get("run") == BUILD)
    upload = next(i for i, s in enumerate(steps) if _uses(s, "actions/upload-artifact"))
    assert cache < build < upload
    assert ".ssindex" in steps[cache]["with"]["path"].split()
    assert steps[cache]["with"]["restore-keys"]
    assert "build-stats.json" in steps[upload]["with"]["path"].split()
    check = [s for s in steps if "ssindex build . --check" in s.get("run", "")]
    assert len(check) == 1 and check[0]["continue-on-error"] is True


def _run(script: str, cwd: Path, env: dict[str, str]) -> None:
    """A `run:` script as GitHub's default bash shell runs it."""
    result = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                            cwd=cwd, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, f"{script}\n{result.stdout}\n{result.stderr}"


def test_run_steps_work_on_a_checkout(tmp_path: Path) -> None:
    checkout = tmp_path / "repo"
    for name, text in FILES.items():
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text(text, encoding="utf-8")
    summary = tmp_path / "summary.md"
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(summary),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    # Everything but installing: cache and artifact steps are GitHub's (`uses:`).
    scripts = [s["run"] for s in _steps() if "run" in s and "pip install" not in s["run"]]
    assert any(BUILD in script for script in scripts)
    assert not [script for script in scripts if "${{" in script]
    for script in scripts:
        _run(script, checkout, env)

    stats = json.loads((checkout / "build-stats.json").read_text())
    assert stats["files_indexed"] == len(FILES) and stats["chunks_embedded"] > 0
    hits = json.loads((checkout / "search-smoke.json").read_text())["results"]
    assert hits and hits[0]["path"] == "app/cli.py"
    assert "reused" in summary.read_text()

    # The next scheduled run, nothing changed: the job's own outputs are ignored.
    _run(BUILD, checkout, env)
    again = json.loads((checkout / "build-stats.json").read_text())
    assert again["chunks_embedded"] == 0
    assert again["chunks_reused"] == again["chunks_total"] == stats["chunks_total"]
