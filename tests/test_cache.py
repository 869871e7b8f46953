"""The machine's shared vector cache: a second worktree embeds almost nothing, damaged
entries and files are never trusted, the cache stays within its bound. Real builds with
the real model through the CLI, real git worktrees, a real SQLite file."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import xxhash

from ssindex.backends.model import ModelSpec
from ssindex.codec import stored_vectors
from ssindex.config import ChunkConfig
from ssindex.index.cache import FILE_NAME, VectorCache
from ssindex.index.layout import IndexDir
from ssindex.index.table import scan
from ssindex.records import SourceFile
from ssindex.stages.chunk import chunk_file
from ssindex.stages.embed import ModelWindow, embed_key
from ssindex.stages.walk import content_hash
from ssindex.util.dirs import cache_dir

from .conftest import STDLIB, cli_json, copy_stdlib, run_cli


@pytest.fixture
def shared(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shared cache turned on for this test's builds, and empty."""
    monkeypatch.setenv("SSINDEX_SHARED_CACHE", "on")
    path = cache_dir() / FILE_NAME
    for suffix in ("", "-wal", "-shm", ".damaged", ".damaged-wal", ".damaged-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return path


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
                   cwd=root, check=True, capture_output=True, timeout=120)


def _vectors(index: Path) -> tuple[list[str], np.ndarray]:
    """Each row's id and stored vector, in id order."""
    head = IndexDir(index).read_head()
    rows = scan(IndexDir(index).open_table(), ["id", "vec_codes", "vec_scale"]).sort_by("id")
    return rows.column("id").to_pylist(), stored_vectors(rows, head.quantization, head.dim)


def test_a_second_worktree_embeds_only_what_is_new(tmp_path: Path, shared: Path) -> None:
    repo = copy_stdlib(tmp_path / "repo", "json", "email")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "init")
    config = tmp_path / "progressive.toml"  # both trees are large enough to build progressively
    config.write_text("[commit]\nmin_files = 10\n", encoding="utf-8")
    first = cli_json("build", str(repo), "--no-progress", "--config", str(config))
    assert first["chunks_embedded"] > 500 and first["chunks_from_cache"] == 0
    assert first["first_commit_seconds"] < first["wall_seconds"]  # a lexical version first
    with sqlite3.connect(shared) as db:  # what the chunker measured to fit, for next time
        assert db.execute("SELECT count(*) FROM fits").fetchone()[0] >= 0.9 * first[
            "chunks_embedded"]

    _git(repo, "worktree", "add", "-q", str(tmp_path / "worktree"))
    (tmp_path / "worktree" / "json" / "extra.py").write_text(
        "def worktree_only_function(a):\n    return a\n", encoding="utf-8")
    second = cli_json("build", str(tmp_path / "worktree"), "--no-progress", "--config",
                      str(config))
    # the cache holds the tree: one pass, no lexical version first (``pipeline.survey``)
    assert second["first_commit_seconds"] == second["wall_seconds"]
    assert second["chunks_embedded"] <= 0.01 * second["chunks_total"]
    assert second["chunks_embedded"] >= 1  # the new function
    assert second["chunks_from_cache"] == first["chunks_embedded"]
    # every file but the new one chunked by the cuts the first build recorded
    assert second["files_cut_from_cache"] == first["files_indexed"]
    ids, vectors = _vectors(repo / ".ssindex")
    ids2, vectors2 = _vectors(tmp_path / "worktree" / ".ssindex")
    common = [ids2.index(row) for row in ids]
    assert np.array_equal(vectors, vectors2[common])  # the very vectors, not near ones

    off = cli_json("build", str(copy_stdlib(tmp_path / "copy", "json")), "--no-progress",
                   "--no-shared-cache")
    assert off["chunks_from_cache"] == 0 and off["chunks_embedded"] > 0


def test_damaged_entries_and_files_are_embedded_again(tmp_path: Path, shared: Path) -> None:
    first = cli_json("build", str(copy_stdlib(tmp_path / "a", "json")), "--no-progress")
    exemplars = first["chunks_embedded"]
    with sqlite3.connect(shared) as db:
        keys = [key for (key,) in db.execute("SELECT key FROM vectors ORDER BY key LIMIT 5")]
        for key in keys:  # one flipped byte in each vector, as a bad disk would leave it
            db.execute("UPDATE vectors SET vector = CAST(substr(vector, 1, 9) || "
                       "x'ff' || substr(vector, 11) AS BLOB) WHERE key = ?", (key,))
    second = cli_json("build", str(copy_stdlib(tmp_path / "b", "json")), "--no-progress")
    assert second["chunks_embedded"] == len(keys)
    assert second["chunks_from_cache"] == exemplars - len(keys)
    _, before = _vectors(tmp_path / "a" / ".ssindex")
    _, after = _vectors(tmp_path / "b" / ".ssindex")
    cosines = np.sum(before * after, axis=1) / (
        np.linalg.norm(before, axis=1) * np.linalg.norm(after, axis=1))
    assert cosines.min() > 0.999
    dim = IndexDir(tmp_path / "b" / ".ssindex").read_head().dim
    healed = VectorCache(64, shared).lookup(keys, dim)
    assert set(healed) == set(keys)  # stored again, whole

    shared.write_bytes(b"this is not a SQLite database" * 100)
    for suffix in ("-wal", "-shm"):
        Path(f"{shared}{suffix}").unlink(missing_ok=True)
    third = run_cli("build", str(copy_stdlib(tmp_path / "c", "json")), "--no-progress")
    assert "is damaged: starting a new one" in third.stderr
    assert Path(f"{shared}.damaged").is_file()
    assert cli_json("build", str(copy_stdlib(tmp_path / "d", "json")),
                    "--no-progress")["chunks_from_cache"] == exemplars


def test_cuts_the_cache_cannot_trust_are_not_replayed(tmp_path: Path, shared: Path) -> None:
    first = cli_json("build", str(copy_stdlib(tmp_path / "a", "json")), "--no-progress")
    with sqlite3.connect(shared) as db:
        keys = [key for (key,) in db.execute("SELECT key FROM cuts ORDER BY key")]
        assert len(keys) == first["files_indexed"]
        # one entry whose checksum fails; one whose checksum holds, cutting past the file
        db.execute("UPDATE cuts SET cuts = '[\"ast\", []]' WHERE key = ?", (keys[0],))
        overrun = json.dumps(["ast", [[1, 10**6, "decode", "function"]]])
        db.execute("UPDATE cuts SET cuts = ?, checksum = ? WHERE key = ?",
                   (overrun, xxhash.xxh3_64_hexdigest(keys[1].encode() + b"\0" +
                                                      overrun.encode()), keys[1]))
    second = cli_json("build", str(copy_stdlib(tmp_path / "b", "json")), "--no-progress")
    assert second["files_cut_from_cache"] == first["files_indexed"] - 2
    assert second["chunks_total"] == first["chunks_total"]
    columns = ["id", "path", "start_line", "end_line", "symbol", "kind", "text"]
    assert scan(IndexDir(tmp_path / "a" / ".ssindex").open_table(), columns).sort_by(
        "id").equals(scan(IndexDir(tmp_path / "b" / ".ssindex").open_table(),
                          columns).sort_by("id"))
    with sqlite3.connect(shared) as db:  # both recorded anew, whole
        assert db.execute("SELECT count(*) FROM cuts WHERE cuts = ?",
                          (overrun,)).fetchone()[0] == 0


def test_the_cache_keeps_within_its_bound(tmp_path: Path, shared: Path) -> None:
    config = tmp_path / "small.toml"
    config.write_text("[cache]\nmax_mb = 1\n", encoding="utf-8")
    built = cli_json("build", str(copy_stdlib(tmp_path / "tree", "json", "email")),
                     "--no-progress", "--config", str(config))
    with sqlite3.connect(shared) as db:
        entries = db.execute("SELECT count(*) FROM vectors").fetchone()[0]
        payload = db.execute("SELECT sum(length(vector)) FROM vectors").fetchone()[0]
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        fits = db.execute("SELECT count(*) FROM fits").fetchone()[0]
        orphans = db.execute("SELECT count(*) FROM fits WHERE key NOT IN "
                             "(SELECT key FROM vectors)").fetchone()[0]
    assert 0 < entries < built["chunks_embedded"]  # the oldest went
    assert payload <= 1024 * 1024
    assert fits > 0 and orphans <= 0.05 * entries  # a fit goes with its vector
    assert (pages - free) * page_size <= 1024 * 1024 + 64 * page_size
    assert pages * page_size <= 1.5 * 1024 * 1024  # freed pages went back to the disk


def test_two_builders_share_one_cache(tmp_path: Path, shared: Path) -> None:
    trees = [copy_stdlib(tmp_path / name, "json") for name in ("one", "two")]
    results: dict[str, dict] = {}

    def run(tree: Path) -> None:
        results[tree.name] = cli_json("build", str(tree), "--no-progress")

    threads = [threading.Thread(target=run, args=(tree,)) for tree in trees]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(results) == {"one", "two"}
    with sqlite3.connect(shared) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT count(*) FROM vectors").fetchone()[0] == \
            results["one"]["chunks_embedded"] + results["one"]["chunks_from_cache"]


def test_vector_cache_rejects_what_it_cannot_trust(tmp_path: Path) -> None:
    cache = VectorCache(64, tmp_path / "v.sqlite3")
    vectors = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    cache.store(["a", "b", "c"], vectors)
    found = cache.lookup(["a", "b", "c", "missing"], 8)
    assert sorted(found) == ["a", "b", "c"]
    assert np.array_equal(found["b"], vectors[1])
    assert cache.lookup(["a"], 16) == {}  # another width: another model's, never used
    assert cache.stats.rejected == 1
    cache.close()
    assert set(VectorCache(64, tmp_path / "v.sqlite3").lookup(["a", "b"], 8)) == {"b"}

    damaged = tmp_path / "damaged.sqlite3"
    damaged.write_bytes(b"not a database" * 1000)
    notices: list[str] = []
    fresh = VectorCache(64, damaged, warn=notices.append)
    fresh.store(["x"], vectors[:1])
    assert set(fresh.lookup(["x"], 8)) == {"x"}
    assert len(notices) == 1 and "damaged" in notices[0]
    assert Path(f"{damaged}.damaged").read_bytes().startswith(b"not a database")


def test_a_chunk_the_cache_knows_to_fit_is_not_tokenized_again(tmp_path: Path) -> None:
    model = ModelSpec.resolve(None)
    text = (STDLIB / "json" / "decoder.py").read_text()
    source = SourceFile("json/decoder.py", "python", text, len(text), 0,
                        content_hash(text.encode()))
    measured = ModelWindow(model)
    chunks, _ = chunk_file(source, ChunkConfig(), measured)

    cache = VectorCache(64, tmp_path / "v.sqlite3")
    keys = [embed_key(chunk, model.key) for chunk in chunks]
    cache.store_fits(keys[::2])
    known = ModelWindow(model, cache.fitting)
    again, _ = chunk_file(source, ChunkConfig(), known)
    assert again == chunks  # the same chunks, whatever the window learned from the cache
    tokens = known.tokens(chunks)
    assert all(found is None for found in tokens[::2])  # never tokenized
    assert [None if found is None else found.ids.tolist() for found in tokens[1::2]] == [
        found.ids.tolist() for found in measured.measure(chunks[1::2])]
    assert known.fits(chunks) == [True] * len(chunks)
