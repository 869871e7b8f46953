"""Hostile input: every case is a clear error or a counted skip, never a crash."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ssindex.config import WalkConfig
from ssindex.stages.walk import WalkStats, walk

from .conftest import cli_json, run_cli


def test_hostile_tree_builds_with_every_skip_counted(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "ok.py").write_text("def fine():\n    return 'fine'\n")
    (root / "bad_utf8.py").write_bytes(b"x = '\xff\xfe broken'\n")
    (root / "nul.py").write_bytes(b"x = 1\x00\x00\n")
    with open(root / "minified.js", "w") as handle:  # 50 MB on one line
        handle.write("var a=[")
        for _ in range(500):
            handle.write("1," * 50_000)
        handle.write("1];")
    (root / "bundle.js").write_text(";".join(f"f{i}()" for i in range(20_000)))  # 200 KB
    (root / "deep.py").write_text("x = " + "[\n" * 10_000 + "]" * 10_000 + "\n")
    (root / "loop.py").symlink_to(root / "loop.py")
    (tmp_path / "secret.py").write_text("password = 'x'\n")
    (root / "escape.py").symlink_to(tmp_path / "secret.py")
    with open(os.fsencode(root) + b"/caf\xe9.py", "wb") as handle:
        handle.write(b"x = 1\n")
    stats = cli_json("build", str(root), "--no-progress")
    assert stats["files_skipped"] == {"binary": 1, "invalid_utf8": 1, "minified": 1,
                                      "non_utf8_name": 1, "symlink_broken_or_loop": 1,
                                      "symlink_outside_root": 1, "too_large": 1}
    assert stats["files_indexed"] == 2  # ok.py and deep.py
    hits = cli_json("search", "fine", "--index", str(root / ".ssindex"), "--mode", "lexical")
    assert hits["results"][0]["path"] == "ok.py"


def test_empty_repository_builds_an_empty_index(tmp_path: Path) -> None:
    stats = cli_json("build", str(tmp_path), "--no-progress")
    assert stats["files_indexed"] == 0 and stats["chunks_total"] == 0
    response = cli_json("search", "anything", "--index", str(tmp_path / ".ssindex"))
    assert response["results"] == []


def test_bad_paths_are_clear_errors(tmp_path: Path) -> None:
    file = tmp_path / "file.py"
    file.write_text("x = 1\n")
    result = run_cli("build", str(file), check=False)
    assert result.returncode == 2 and "not a directory" in result.stderr
    result = run_cli("build", str(tmp_path), "--index", str(file / "index"), check=False)
    assert result.returncode == 5 and "cannot write index directory" in result.stderr
    for output in (result.stderr,):
        assert "Traceback" not in output and len(output.strip().splitlines()) == 1


def test_an_index_needs_a_directory_of_its_own(tmp_path: Path) -> None:
    """The tree, a directory above it, or a directory of other files would mix the index
    with them: refused, and nothing written. An index's own directory is taken again."""
    tree = tmp_path / "repo"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.py").write_text("x = 1\n")
    (tree / "sub" / "b.py").write_text("y = 2\n")
    for index in (tree, tmp_path, tree / "sub"):
        result = run_cli("build", str(tree), "--index", str(index), "--no-embed", check=False)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert "a directory of its own" in result.stderr
    assert sorted(p.name for p in tree.rglob("*")) == ["a.py", "b.py", "sub"]
    for _ in range(2):
        stats = cli_json("build", str(tree), "--index", str(tmp_path / "idx"), "--no-embed")
        assert stats["files_indexed"] == 2
    moved = run_cli("build", str(tree / "sub"), "--index", str(tmp_path / "idx"), "--no-embed",
                    "--json")
    assert f"the index was built from {tree}; it now indexes {tree / 'sub'}" in moved.stderr
    assert json.loads(moved.stdout)["files_removed"] == 2


def test_files_that_vanish_or_change_during_the_walk(tmp_path: Path) -> None:
    for name in "abcd":
        (tmp_path / f"{name}.py").write_text(f"{name} = 1\n")
    stats = WalkStats()
    seen = []
    for source in walk(tmp_path, WalkConfig(), stats):
        seen.append(source.path)
        if source.path == "a.py":
            (tmp_path / "c.py").unlink()
            (tmp_path / "d.py").write_text("d = 2  # changed mid-walk\n")
    assert seen == ["a.py", "b.py", "d.py"]
    assert stats.skipped["vanished"] == 1


def test_names_with_brackets_print_as_they_are(tmp_path: Path) -> None:
    """Paths and messages are the user's, not rich markup: "[red]" is not a style and
    "[/]" does not crash the error line."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / "[red]probe.py").write_text("def bracket_probe():\n    return 1\n")
    (root / "x[b]y.py").write_text("def bracket_probe_two():\n    return 2\n")
    index = str(tmp_path / "[bold]index")
    cli_json("build", str(root), "--index", index, "--no-progress")
    shown = run_cli("search", "bracket_probe", "--index", index, "-k", "2",
                    "--mode", "lexical").stdout
    assert "[red]probe.py:1-2" in shown and "x[b]y.py:1-2" in shown
    assert "[bold]index" in run_cli("status", "--index", index).stdout
    missing = run_cli("search", "x", "--index", str(tmp_path / "[/]nowhere"), check=False)
    assert missing.returncode == 3 and "Traceback" not in missing.stderr
    assert "[/]nowhere" in missing.stderr


def test_a_damaged_index_is_a_clear_error(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "a.py").write_text("def alpha():\n    return 1\n")
    cli_json("build", str(root), "--no-progress")
    index = root / ".ssindex"
    head = (index / "HEAD.json").read_text()

    def fails(*args: str) -> str:
        result = run_cli(*args, "--index", str(index), check=False)
        assert result.returncode == 3 and "Traceback" not in result.stderr, result.stderr
        return result.stderr

    for damaged in ("[]", '{"format_version": 1, "table_version": 1}'):
        (index / "HEAD.json").write_text(damaged)
        assert "rebuild the index" in fails("status") and "rebuild the index" in fails(
            "search", "alpha")
    (index / "HEAD.json").write_text(head)
    for manifest in (index / "manifests").glob("search-v*.arrow"):
        manifest.write_bytes(b"corrupt")
    message = fails("search", "alpha")
    assert "search-v1.arrow" in message and "is damaged" in message
    assert "ssindex repair" in message
    # an index from before checksums: the unreadable file itself is the error
    data = json.loads(head)
    del data["checksums"]
    (index / "HEAD.json").write_text(json.dumps(data))
    assert "the index is damaged" in fails("search", "alpha")
