"""Indexes on an object store: a real S3-compatible server (moto) on loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import cli_json, copy_stdlib, run_cli


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for name, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="indexes")
    yield endpoint
    server.stop()


def _keys(endpoint: str) -> list[str]:
    import boto3

    listing = boto3.client("s3", endpoint_url=endpoint).list_objects_v2(Bucket="indexes")
    return [item["Key"] for item in listing.get("Contents", [])]


def test_build_search_and_rebuild_an_index_on_s3(s3: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_stdlib(tmp_path / "tree", "json")
    uri = "s3://indexes/team/json"
    stats = cli_json("build", str(root), "--index", uri, "--no-progress")
    assert stats["index"] == uri and stats["chunks_total"] > 0
    keys = _keys(s3)
    assert "team/json/HEAD.json" in keys
    assert any(key.startswith("team/json/db/chunks.lance/data/") for key in keys)
    assert not any(key.endswith("/lock") or "/staging/" in key for key in keys)
    assert not (root / ".ssindex").exists()

    # another machine: an empty cache pulls the index, then searches it
    monkeypatch.setenv("SSINDEX_CACHE_DIR", str(tmp_path / "other-machine"))
    hits = cli_json("search", "decode json from a string", "--index", uri)["results"]
    assert hits and hits[0]["path"].startswith("json/")
    assert run_cli("build", str(root), "--index", uri, "--check", check=False).returncode == 0

    decoder = root / "json" / "decoder.py"
    decoder.write_text(decoder.read_text() + "\n\ndef added(x):\n    return 2 * x\n")
    assert run_cli("build", str(root), "--index", uri, "--check", check=False).returncode == 1
    again = cli_json("build", str(root), "--index", uri, "--no-progress")
    assert again["files_changed"] == 1 and 0 < again["chunks_embedded"] <= 3
    head = json.loads(
        (tmp_path / "other-machine" / "remote").glob("*/HEAD.json").__next__().read_text())
    assert head["table_version"] > 1
    status = cli_json("status", "--index", uri)
    assert status["table_version"] == head["table_version"]


def test_a_missing_bucket_is_one_clear_error(s3: str) -> None:
    result = run_cli("search", "anything", "--index", "s3://no-such-bucket/x", check=False)
    assert result.returncode == 3
    assert result.stderr.startswith("error: no index")
    assert "s3://no-such-bucket/x" in result.stderr and "Traceback" not in result.stderr


def test_two_builders_racing_on_one_prefix_never_lose_a_commit(
        s3: str, tmp_path: Path) -> None:
    """Two machines (two caches) build the same tree into one prefix at the same time,
    20 times. Each build commits or exits 4 with one line; a commit is never written
    over: the builds that succeed in a round commit distinct table versions, the last
    is what the prefix holds, and a fresh machine finds it whole."""
    import os
    import subprocess

    from .conftest import CLI

    root = copy_stdlib(tmp_path / "tree", "json")
    uri = "s3://indexes/raced"
    cli_json("build", str(root), "--index", uri, "--no-progress")
    outcomes = {"committed": 0, "lost": 0}
    for round_ in range(20):
        (root / "json" / "raced.py").write_text(f"def round_{round_}():\n    return {round_}\n")
        builders = [subprocess.Popen(
            [CLI, "build", str(root), "--index", uri, "--no-progress", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "SSINDEX_CACHE_DIR": str(tmp_path / f"machine-{machine}")})
            for machine in "ab"]
        versions = []
        for builder in builders:
            stdout, stderr = builder.communicate(timeout=600)
            assert builder.returncode in (0, 4), stderr
            if builder.returncode == 4:
                errors = [line for line in stderr.splitlines() if line.startswith("error:")]
                assert len(errors) == 1 and "Traceback" not in stderr, stderr
                assert "another build committed" in errors[0]
                outcomes["lost"] += 1
            else:
                versions.append(json.loads(stdout)["table_version"])
                outcomes["committed"] += 1
        assert versions and len(set(versions)) == len(versions), versions
        fresh = {**os.environ, "SSINDEX_CACHE_DIR": str(tmp_path / f"reader-{round_}")}
        report = json.loads(subprocess.run([CLI, "repair", "--index", uri, "--json"],
                                           capture_output=True, text=True, env=fresh,
                                           check=True).stdout)
        assert report["damaged"] == []
        head = json.loads(next((tmp_path / f"reader-{round_}").rglob("HEAD.json")).read_text())
        assert head["table_version"] == max(versions)
        hits = json.loads(subprocess.run(
            [CLI, "search", f"round_{round_}", "--index", uri, "--json", "--mode", "lexical",
             "-k", "1"], capture_output=True, text=True, env=fresh, check=True).stdout)
        assert hits["results"][0]["symbol"] == f"round_{round_}"
    assert outcomes["lost"] > 0  # the race was run, not avoided
