"""Several indexes searched as one: merged with comparable scores, against one index of
everything they hold; a workspace file; indexes of another model or settings refused."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from ssindex.backends.model import ModelSpec
from ssindex.query.searcher import Searcher
from ssindex.query.workspace import Workspace

from .conftest import cli_json, copy_stdlib, run_cli

QUERIES = ["parse an email address", "decode json from a string", "send an http request",
           "rotate log files by size", "quote a header value", "handle a redirect",
           "format a log record", "encode a python object", "read a cookie",
           "base64 encode a message body", "JSONDecoder", "HTTPConnection request",
           "getLogger"]
HALVES = {"a": ("json", "http"), "b": ("email", "logging")}


@pytest.fixture(scope="module")
def halves(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The packages of the session's stdlib index, split between two indexes."""
    roots = {}
    for name, packages in HALVES.items():
        roots[name] = copy_stdlib(tmp_path_factory.mktemp(f"half-{name}"), *packages)
        cli_json("build", str(roots[name]), "--no-progress")
    return roots


def _key(hit: dict[str, Any]) -> tuple[str, int]:
    return hit["path"], hit["start_line"]


def test_two_indexes_rank_like_one_index_of_both(
        stdlib_index: tuple[Path, dict[str, Any]], halves: dict[str, Path]) -> None:
    whole = Searcher(stdlib_index[0] / ".ssindex")
    workspace = Workspace([Searcher(root / ".ssindex") for root in halves.values()])
    overlap, first = [], []
    for query in QUERIES:
        expected = [_key(h) for h in whole.search(query, k=10, abstain=False).results]
        hits = workspace.search(query, k=10, abstain=False).results
        assert len(hits) == 10
        assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
        for hit in hits:  # each result names the index it came from, and that index's root
            half = next(n for n, packages in HALVES.items()
                        if hit["path"].split("/")[0] in packages)
            assert hit["root"] == str(halves[half])
            assert hit["index"] == str(halves[half] / ".ssindex")
        overlap.append(len(set(expected) & {_key(h) for h in hits}) / 10)
        first.append(_key(hits[0]) == expected[0])
    # one index of both ranks each leg's candidates over both: the same top, nearly the
    # same ten (each half's legs reach 100 deep in less)
    assert np.mean(first) >= 0.9 and np.mean(overlap) >= 0.65, (first, overlap)
    json_only = workspace.search("decode json from a string", k=5, abstain=False).results
    assert all(hit["path"].startswith("json/") for hit in json_only)


def test_a_workspace_file_lists_the_indexes(halves: dict[str, Path], tmp_path: Path) -> None:
    a, b = (root / ".ssindex" for root in halves.values())
    listing = tmp_path / "team" / "ws.toml"
    listing.parent.mkdir()
    # one absolute entry, one relative to the file (not to the working directory)
    listing.write_text(f'indexes = ["{a}", "{os.path.relpath(b, listing.parent)}"]\n',
                       encoding="utf-8")
    by_file = cli_json("search", "read a cookie", "--workspace", str(listing), "-k", "5")
    by_flags = cli_json("search", "read a cookie", "--index", str(a), "--index", str(b), "-k", "5")
    assert [_key(h) for h in by_file["results"]] == [_key(h) for h in by_flags["results"]]
    files = run_cli("search", "read a cookie", "--index", str(a), "--index", str(b),
                    "--format", "files", "-k", "5", "--tests", "exclude").stdout.splitlines()
    assert files and all(Path(line).is_absolute() and Path(line).is_file() for line in files)
    listing.write_text("indexes = 3\n", encoding="utf-8")
    bad = run_cli("search", "x", "--workspace", str(listing), check=False)
    assert bad.returncode == 2 and "`indexes` must be a list" in bad.stderr


def _tiny(root: Path, *options: str) -> Path:
    root.mkdir()
    (root / "one.py").write_text("def one():\n    return 1\n", encoding="utf-8")
    cli_json("build", str(root), "--no-progress", *options)
    return root / ".ssindex"


def test_indexes_of_another_model_or_settings_are_refused(
        halves: dict[str, Path], tmp_path: Path) -> None:
    """A model whose weights differ (one tensor scaled) and an int4 index: each is a
    one-line error naming what differs."""
    model = tmp_path / "model"
    shutil.copytree(ModelSpec.resolve(None).path, model)
    weights = load_file(model / "model.safetensors")
    name = next(key for key in weights if key.endswith("LayerNorm.weight"))
    weights[name] = weights[name] * np.float32(1.01)
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    cases = {"model.fingerprint": _tiny(tmp_path / "other-model", "--model", str(model)),
             "quantization": _tiny(tmp_path / "int4", "--quantize", "int4")}
    index = halves["a"] / ".ssindex"
    for setting, other in cases.items():
        refused = run_cli("search", "one", "--index", str(index), "--index", str(other),
                          check=False)
        assert refused.returncode == 2 and not refused.stdout
        assert len(refused.stderr.strip().splitlines()) == 1
        assert f"differ in {setting}" in refused.stderr
    alias = tmp_path / "alias"
    alias.symlink_to(index)
    other = halves["b"] / ".ssindex"
    for names in ([index, index], [index, other, alias]):
        twice = run_cli("search", "x", *(f"--index={name}" for name in names), check=False)
        assert twice.returncode == 2 and "given twice" in twice.stderr
    assert json.loads(run_cli("search", "one", "--index", str(cases["quantization"]),
                              "--json").stdout)["results"]
