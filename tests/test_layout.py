"""The package's structure, held by tools rather than memory: the import-linter
contracts of ``pyproject.toml`` (layers, no cycles, query independent of the build),
the size limits that keep modules and functions readable, and the dependencies that a
plain install brings for every module the package imports."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PACKAGE = Path(__file__).resolve().parent.parent / "ssindex"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
OPTIONAL_IMPORTS = {"coremltools": "coreml", "ray": "ray"}
"""Modules only an extra brings, by the extra: imported where that feature runs alone."""


def test_import_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], capture_output=True, text=True,
                            cwd=PACKAGE.parent, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_modules_and_functions_stay_short() -> None:
    long_modules, long_functions = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        if len(source.splitlines()) > MAX_MODULE_LINES:
            long_modules.append(path.name)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(PACKAGE)}:{node.name} {length}")
    assert not long_modules and not long_functions, (long_modules, long_functions)


def test_a_plain_install_brings_every_module_the_package_imports() -> None:
    """README's first command installs the base dependencies alone: a module imported
    only through the ``dev`` extra (``lance``, once) passes every test and fails there."""
    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    base = _installed_by(project["dependencies"])
    providers = metadata.packages_distributions()
    missing = {}
    for module in _imported_modules():
        extra = OPTIONAL_IMPORTS.get(module)
        wanted = base if extra is None else _installed_by(
            project["optional-dependencies"][extra])
        if not {canonicalize_name(d) for d in providers.get(module, [])} & wanted:
            missing[module] = extra or "dependencies"
    assert not missing, missing


def _imported_modules() -> set[str]:
    """The third-party top-level modules that the package's code imports anywhere."""
    modules = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return modules - set(sys.stdlib_module_names) - {"ssindex"}


def _installed_by(requirements: list[str]) -> set[str]:
    """The distributions that installing ``requirements`` brings, theirs included."""
    found: set[str] = set()
    pending = [Requirement(text) for text in requirements]
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        if name in found:
            continue
        found.add(name)
        for text in metadata.requires(requirement.name) or []:
            needed = Requirement(text)
            if needed.marker is None or any(needed.marker.evaluate({"extra": extra})
                                            for extra in ("", *requirement.extras)):
                pending.append(needed)
    return found
