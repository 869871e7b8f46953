"""A damaged or crafted ``HEAD.json`` is one line naming the damage (exit 3), never a
traceback, and never a write outside the index; ``ssindex repair`` rebuilds what it can."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import cli_json, run_cli

Edit = Callable[[dict[str, Any]], object]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tree of two files and its index (``.ssindex``), built without vectors."""
    root = tmp_path_factory.mktemp("tree")
    (root / "m1.py").write_text("def alpha():\n    return 1\n")
    (root / "m2.py").write_text("def func_3(x):\n    return x * 3\n")
    run_cli("build", str(root), "--no-embed", "--no-progress")
    return root


@pytest.fixture
def tree(built: Path, tmp_path: Path) -> Path:
    """A copy of ``built`` for one test to damage."""
    return Path(shutil.copytree(built, tmp_path / "tree", symlinks=True))


def _edit(index: Path, edit: Edit) -> None:
    head = json.loads((index / "HEAD.json").read_text())
    edit(head)
    (index / "HEAD.json").write_text(json.dumps(head))


def _error(result: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a command that found the index damaged (exit 3)."""
    assert result.returncode == 3 and "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def _fails(index: Path, *command: str) -> str:
    return _error(run_cli(*command, "--index", str(index), check=False))


@pytest.mark.parametrize(("key", "name"), [
    ("manifest", "../../m1.py"), ("postings", "../../m1.py"), ("snapshot", "/etc/hostname"),
    ("checksums", "../m1.py"), ("checksums", "manifests/../../m1.py")])
def test_a_head_naming_a_file_outside_the_index_writes_nothing(tree: Path, key: str,
                                                                name: str) -> None:
    index, source = tree / ".ssindex", (tree / "m1.py").read_bytes()

    def craft(head: dict[str, Any]) -> None:
        if key == "checksums":
            head["checksums"][name] = "0" * 16
        else:
            head[key] = name
            head["checksums"][f"manifests/{name}"] = "0" * 16

    _edit(index, craft)
    head = (index / "HEAD.json").read_bytes()
    assert "repair HEAD.json" in _fails(index, "repair")
    for command in (["status"], ["search", "alpha"]):
        assert "is damaged" in _fails(index, *command)
    assert (tree / "m1.py").read_bytes() == source
    assert (index / "HEAD.json").read_bytes() == head


BAD_FIELDS: list[tuple[str, Edit]] = [
    ("its model is not", lambda head: head.update(model=None)),
    ("its model is not", lambda head: head.update(model=[])),
    ("its model.dim is not", lambda head: head["model"].update(dim="384")),
    ("it lacks model.path", lambda head: head["model"].pop("path")),
    ("its abstention is not", lambda head: head.update(abstention="x")),
    ("its abstention.lexical is not", lambda head: head["abstention"].update(lexical="x")),
    ("its postings is not", lambda head: head.update(postings=5)),
    ("its root is not", lambda head: head.update(root=5)),
    ("its dense_coverage is not", lambda head: head.update(dense_coverage="x")),
    ("its stats is not", lambda head: head.update(stats=None)),
    ("its table_version is not", lambda head: head.update(table_version=-1)),
    ("its table_version is not", lambda head: head.update(table_version=10**30)),
    ("its table_version is not", lambda head: head.update(table_version=True)),
    ("its manifest is not", lambda head: head.update(manifest=None)),
    ("its settings is not", lambda head: head.update(settings=None)),
    ("its settings.config.walk is not",
     lambda head: head["settings"]["config"].update(walk=5)),
    ("its checksums is not", lambda head: head.update(checksums=[1])),
    ("its snapshot has no checksum", lambda head: head.update(snapshot="search-v9.arrow")),
]


@pytest.mark.parametrize(("fault", "edit"), BAD_FIELDS)
def test_a_head_field_of_the_wrong_kind_is_named(tree: Path, fault: str, edit: Edit) -> None:
    index = tree / ".ssindex"
    _edit(index, edit)
    for command in (["status"], ["search", "alpha"]):
        line = _fails(index, *command)
        assert fault in line and "ssindex build" in line
    line = _fails(index, "repair")
    assert "cannot repair HEAD.json" in line and fault in line


def test_a_head_nested_too_deep_for_the_parser_is_damage(tree: Path) -> None:
    index = tree / ".ssindex"
    (index / "HEAD.json").write_text("[" * 100_000 + "]" * 100_000)
    for command in (["status"], ["search", "alpha"], ["repair"]):
        assert "HEAD.json" in _fails(index, *command)


def test_a_build_over_a_damaged_head_rebuilds_from_scratch(tree: Path) -> None:
    index = tree / ".ssindex"
    _edit(index, lambda head: head.update(snapshot="search-v9.arrow", postings=5))
    result = run_cli("build", str(tree), "--no-embed", "--no-progress")
    assert "rebuilding from scratch" in result.stderr
    found = cli_json("search", "alpha", "--index", str(index))["results"]
    assert found[0]["path"] == "m1.py"


def test_repair_writes_a_deleted_manifests_folder_again(tree: Path) -> None:
    index = tree / ".ssindex"
    shutil.rmtree(index / "manifests")
    report = cli_json("repair", "--index", str(index))
    assert sorted(report["repaired"]) == sorted(
        name for name in json.loads((index / "HEAD.json").read_text())["checksums"]
        if name.startswith("manifests/"))
    assert cli_json("repair", "--index", str(index))["damaged"] == []
    assert cli_json("search", "alpha", "--index", str(index))["results"][0]["path"] == "m1.py"


@pytest.mark.parametrize(("name", "code"), [("lock", 5), ("manifests/search-v1.arrow", 3)])
def test_repair_names_a_directory_where_a_file_should_be(tree: Path, name: str,
                                                         code: int) -> None:
    index = tree / ".ssindex"
    (index / name).unlink()
    (index / name).mkdir()
    head = (index / "HEAD.json").read_bytes()
    result = run_cli("repair", "--index", str(index), check=False)
    assert result.returncode == code and "Traceback" not in result.stderr, result.stderr
    assert f"{index / name}" in result.stderr and "directory" in result.stderr
    assert (index / "HEAD.json").read_bytes() == head
    assert not list((index / "manifests").glob(".*"))  # no half-written file left


def test_repair_without_an_index_says_so(tmp_path: Path) -> None:
    result = run_cli("repair", "--index", str(tmp_path / "none"), check=False)
    assert result.returncode == 3 and "no index at" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "none").exists()


@pytest.mark.parametrize("name", ["lock", "HEAD.json"])
def test_a_build_names_a_directory_where_a_file_should_be(tree: Path, name: str) -> None:
    index = tree / ".ssindex"
    (index / name).unlink()
    (index / name).mkdir()
    result = run_cli("build", str(tree), "--no-embed", "--no-progress", check=False)
    assert result.returncode == 5 and "Traceback" not in result.stderr, result.stderr
    assert "a directory stands where the index keeps a file while writing" in result.stderr
    assert f"remove the directory {index / name}" in result.stderr
    # a directory at the head hides every version; at the lock, the last one still answers
    after = ("until then no version of the index answers searches" if name == "HEAD.json"
             else "the previous index is intact and still answers searches")
    assert after in result.stderr
    assert not [path for path in index.iterdir() if path.name.startswith(f".{name}.")]


def test_a_head_older_than_abstention_thresholds_is_read(tree: Path) -> None:
    """Heads before abstention thresholds have none: searches answer without them."""
    index = tree / ".ssindex"
    _edit(index, lambda head: head.pop("abstention"))
    assert cli_json("status", "--index", str(index))["chunks"] > 0
    found = cli_json("search", "alpha", "--index", str(index), "--no-abstain")["results"]
    assert found[0]["path"] == "m1.py"
