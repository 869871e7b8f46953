"""Shared fixtures: real corpora from the standard library, the real model, the CLI."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

STDLIB = Path(sysconfig.get_paths()["stdlib"])
CLI = str(Path(sys.executable).with_name("ssindex"))


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep exported models and calibration out of the user's home, shared across tests."""
    base = tmp_path_factory.mktemp("ssindex-home")
    os.environ.setdefault("SSINDEX_CACHE_DIR", str(base / "cache"))
    os.environ["SSINDEX_CONFIG_DIR"] = str(base / "config")
    # a test's build must not take vectors another test embedded: tests count what a
    # build embeds (tests/test_cache.py turns it on, with a cache of its own)
    os.environ.setdefault("SSINDEX_SHARED_CACHE", "off")


def run_cli(*args: str, check: bool = True, cwd: Path | None = None,
            ) -> subprocess.CompletedProcess[str]:
    """Run the installed ``ssindex`` console script."""
    result = subprocess.run([CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=1800,
                            env={**os.environ, "COLUMNS": "200"})
    if check and result.returncode != 0:
        raise AssertionError(f"ssindex {' '.join(args)} failed ({result.returncode}):\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


def run_tty(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run the installed ``ssindex`` console script with stdout and stderr on a
    pseudo-terminal, as a person at a terminal sees it; returns the exit code and the
    screen's text with the terminal's control sequences taken out."""
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen([CLI, *args], stdin=subprocess.DEVNULL, stdout=follower,
                            stderr=follower, env={**os.environ, "COLUMNS": "160",
                                                  "TERM": "xterm-256color", **(env or {})})
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    code = proc.wait(timeout=1800)
    return code, _ESCAPES.sub("", b"".join(chunks).decode("utf-8", "replace"))


def cli_json(*args: str, cwd: Path | None = None) -> Any:
    return json.loads(run_cli(*args, "--json", cwd=cwd).stdout)


def copy_stdlib(target: Path, *packages: str) -> Path:
    for name in packages:
        source = STDLIB / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns(
                "__pycache__", "test", "tests"))
        else:
            shutil.copy2(source, target / name)
    return target


@pytest.fixture(scope="session")
def stdlib_index(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A real index of copies of email, json, http and logging, built through the CLI."""
    root = copy_stdlib(tmp_path_factory.mktemp("stdlib"), "email", "json", "http", "logging")
    stats = cli_json("build", str(root), "--no-progress")
    return root, stats
