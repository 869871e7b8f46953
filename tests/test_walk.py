from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import pathspec
import pytest

from ssindex.config import WalkConfig
from ssindex.errors import ConfigError
from ssindex.stages.walk import Rules, WalkStats, _read_up_to, walk
from ssindex.text.globs import GLOB_ERRORS, ignore_spec


def _walk(root: Path, **cfg: object) -> tuple[list[str], WalkStats]:
    stats = WalkStats()
    files = [f.path for f in walk(root, WalkConfig(**cfg), stats)]  # type: ignore[arg-type]
    return files, stats


def _write(root: Path, rel: str, data: str | bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)
    return path


def test_nested_gitignore_ssindexignore_and_deny_list(tmp_path: Path) -> None:
    _write(tmp_path, ".gitignore", "*.log\n/generated/\n")
    _write(tmp_path, "src/.gitignore", "secret.py\n!keep.log\n")
    _write(tmp_path, ".ssindexignore", "docs/\n")
    for rel in ["a.py", "b.log", "generated/x.py", "src/main.py", "src/secret.py",
                "src/keep.log", "docs/guide.md", "node_modules/lib/index.js",
                ".venv/lib/site.py", "build/out.py", "nested/generated/y.py"]:
        _write(tmp_path, rel, "x = 1\n")
    files, stats = _walk(tmp_path)
    assert files == ["a.py", "nested/generated/y.py", "src/keep.log", "src/main.py"]
    assert stats.skipped["ignored"] == 2  # b.log, src/secret.py
    assert stats.dirs_pruned["denied"] == 3 and stats.dirs_pruned["ignored"] == 2


def test_rules_judge_one_path_as_the_walk_does(tmp_path: Path) -> None:
    _write(tmp_path, ".gitignore", "*.log\n/generated/\n")
    _write(tmp_path, "src/.gitignore", "secret.py\n!keep.log\n")
    _write(tmp_path, ".ssindexignore", "docs/\n")
    paths = ["a.py", "b.log", "generated/x.py", "src/main.py", "src/secret.py",
             "src/keep.log", "docs/guide.md", "node_modules/lib/index.js",
             ".venv/lib/site.py", "build/out.py", "nested/generated/y.py"]
    for rel in paths:
        _write(tmp_path, rel, "x = 1\n")
    rules = Rules(tmp_path, WalkConfig(extra_ignores=("*.tmp",)))
    walked = set(_walk(tmp_path)[0])
    # .venv is pruned by its name here; the walk also prunes any directory with pyvenv.cfg
    assert {rel for rel in paths if rules.indexable(rel)} == walked
    assert not rules.indexable("x.tmp") and not rules.indexable(".git/index")
    assert rules.indexable(".gitignore") and rules.indexable("src/.ssindexignore")
    assert not rules.indexable("generated/.gitignore")  # inside an ignored directory
    _write(tmp_path, ".gitignore", "*.log\n")
    assert not rules.indexable("generated/x.py")  # read once, until forgotten
    rules.forget()
    assert rules.indexable("generated/x.py")


def test_skips_are_counted_by_reason(tmp_path: Path) -> None:
    _write(tmp_path, "ok.py", "print('hi')\n")
    _write(tmp_path, "blob.bin", b"\x89PNG\x00\x00binary")
    _write(tmp_path, "latin1.py", "caf\xe9 = 1\n".encode("latin-1"))
    _write(tmp_path, "big.js", "x" * 2000)
    _write(tmp_path, "empty.py", "\n\n")
    files, stats = _walk(tmp_path, max_file_bytes=1000)
    assert files == ["ok.py"]
    assert stats.skipped == {"binary": 1, "invalid_utf8": 1, "too_large": 1, "empty": 1}
    assert stats.files_seen == 5


def test_symlinks_outside_root_loops_and_dirs(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    _write(root, "real.py", "a = 1\n")
    _write(tmp_path, "outside.py", "secret = 1\n")
    (root / "out.py").symlink_to(tmp_path / "outside.py")
    (root / "loop.py").symlink_to(root / "loop.py")
    (root / "alias.py").symlink_to(root / "real.py")
    (root / "dirlink").symlink_to(root)
    files, stats = _walk(root)
    assert files == ["alias.py", "real.py"]
    assert stats.skipped["symlink_outside_root"] == 1
    assert stats.skipped["symlink_broken_or_loop"] == 1
    assert stats.skipped["symlink_dir"] == 1


def _walk_unprivileged(root: Path) -> tuple[list[str], dict[str, int]]:
    """The walk as this user, or, for root (who reads any file), in a child process that
    has dropped to the unprivileged ``nobody`` (uid 65534)."""
    if os.geteuid() != 0:
        files, stats = _walk(root)
        return files, dict(stats.skipped)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.setgid(65534)
            os.setuid(65534)
            files, stats = _walk(root)
            os.write(write, json.dumps([files, dict(stats.skipped)]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        report = pipe.read()
    os.waitpid(child, 0)
    files, skipped = json.loads(report)
    return files, skipped


def test_unreadable_file_is_skipped() -> None:
    with tempfile.TemporaryDirectory() as name:  # not tmp_path: its parents are root's alone
        root = Path(name)
        root.chmod(0o755)
        _write(root, "locked.py", "x = 1\n").chmod(0)
        _write(root, "open.py", "y = 2\n").chmod(0o644)
        files, skipped = _walk_unprivileged(root)
    assert files == ["open.py"] and skipped["unreadable"] == 1


def test_non_utf8_file_name_is_skipped(tmp_path: Path) -> None:
    name = os.fsencode(tmp_path) + b"/bad\xff.py"
    with open(name, "wb") as handle:
        handle.write(b"x = 1\n")
    _write(tmp_path, "good.py", "x = 1\n")
    files, stats = _walk(tmp_path)
    assert files == ["good.py"] and stats.skipped["non_utf8_name"] == 1


def test_minified_and_one_line_data_files_are_skipped(tmp_path: Path) -> None:
    bundle = ";".join(f"function f{i}(a){{return a+{i}}}" for i in range(2000))
    _write(tmp_path, "app.js", bundle + "\n")
    _write(tmp_path, "data.json", "[" + ",".join(str(i) for i in range(5000)) + "]")
    long_line = "BLOB = '" + "x" * 20_000 + "'\n"  # one long line in a file of short ones
    _write(tmp_path, "blob.py", long_line + "".join(f"v{i} = {i}\n" for i in range(400)))
    files, stats = _walk(tmp_path)
    assert files == ["blob.py"] and stats.skipped["minified"] == 2
    kept = [f.path for f in walk(tmp_path, WalkConfig(max_average_line_chars=0), WalkStats())]
    assert kept == ["app.js", "blob.py", "data.json"]


def test_empty_repository_and_bad_roots(tmp_path: Path) -> None:
    assert _walk(tmp_path)[0] == []
    file = _write(tmp_path, "f.py", "x = 1\n")
    with pytest.raises(ConfigError, match="not a directory"):
        _walk(file)
    with pytest.raises(ConfigError, match="does not exist"):
        _walk(tmp_path / "missing")


def test_index_dir_is_never_walked(tmp_path: Path) -> None:
    _write(tmp_path, "a.py", "x = 1\n")
    _write(tmp_path, "idx/data.py", "y = 2\n")
    stats = WalkStats()
    files = [f.path for f in walk(tmp_path, WalkConfig(), stats, exclude=tmp_path / "idx")]
    assert files == ["a.py"] and stats.dirs_pruned["index_dir"] == 1


def test_ignore_lines_git_would_skip_are_skipped_and_counted(tmp_path: Path) -> None:
    """pathspec refuses a whole file for one line git takes as matching nothing."""
    _write(tmp_path, ".gitignore", "!\n*.log\n[z-a]\n\\\n")
    for rel in ["a.py", "b.log"]:
        _write(tmp_path, rel, "x = 1\n")
    files, stats = _walk(tmp_path)
    assert files == ["a.py"]
    assert stats.ignore_skipped == {"invalid_rule": 3}
    assert not Rules(tmp_path, WalkConfig()).indexable("b.log")


@pytest.mark.parametrize("target", ["fifo", "/dev/zero", "large"])
def test_an_ignore_file_that_is_no_regular_file_is_not_read(tmp_path: Path, target: str) -> None:
    """A FIFO would block the walk and /dev/zero fill the memory."""
    _write(tmp_path, "a.py", "x = 1\n")
    ignore = tmp_path / ".gitignore"
    if target == "fifo":
        os.mkfifo(ignore)
    elif target == "large":
        _write(tmp_path, ".gitignore", "*.py\n" + "#" * (1 << 20))
    else:
        ignore.symlink_to(target)
    files, stats = _walk(tmp_path)
    assert files == ["a.py"] and stats.ignore_skipped == {"unusable_file": 1}


def test_a_git_file_is_no_content(tmp_path: Path) -> None:
    """A worktree's or submodule's ``.git`` is a file pointing at the repository."""
    _write(tmp_path, ".git", "gitdir: /elsewhere/.git/worktrees/x\n")
    _write(tmp_path, "a.py", "x = 1\n")
    files, stats = _walk(tmp_path)
    assert files == ["a.py"] and stats.files_seen == 1
    assert not Rules(tmp_path, WalkConfig()).indexable(".git")


def test_a_read_takes_what_the_file_holds_not_the_limit(tmp_path: Path) -> None:
    """A limit of 1 TiB allocated that much for every read (``MemoryError``); a file that
    grew after its stat is read on, to one byte past the limit."""
    _write(tmp_path, "a.py", "x = 1\n")
    assert _walk(tmp_path, max_file_bytes=1 << 40)[0] == ["a.py"]
    grown = io.BytesIO(b"y" * 3_000_000)
    assert len(_read_up_to(grown, 10, 2_500_000)) == 2_500_001
    assert len(_read_up_to(io.BytesIO(b"y" * 20), 10, 100)) == 20


def _git_ignored(repo: Path, lines: list[str], paths: list[str]) -> set[str]:
    """The ``paths`` git's own rules ignore under a root ``.gitignore`` of ``lines``."""
    (repo / ".gitignore").write_text("\n".join(lines) + "\n")
    done = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=repo,
                          input="\n".join(paths) + "\n", capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr  # 1: none ignored
    return set(done.stdout.splitlines())


def test_hostile_ignore_rules_end(tmp_path: Path) -> None:
    """Stars in one segment (``*a*a…*b``) against a long name, or ``**`` between many
    segments against a deep path, made Python's regex engine try every way of sharing
    the path among them: a walk that never ended (git's own matcher does not end either,
    so it judges only the tame rules here). The walk runs in a child process, so that a
    regression fails here instead of hanging."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    tame = ["x*y*z*w.py", "q*[*]*\\**.py"]
    deep = "a/" * 80
    names = ["a" * 200 + ".py", "a" * 200 + "b.py", deep + "b.py", deep + "c.py",
             "xayzw.py", "xyz.py", "q1*2*.py", "q**.py"]
    for name in names:
        _write(tmp_path, name, "x = 1\n")
    ignored = _git_ignored(tmp_path, tame, names) | {"a" * 200 + "b.py", deep + "b.py"}
    assert ignored == {"a" * 200 + "b.py", deep + "b.py", "xayzw.py", "q1*2*.py", "q**.py"}
    hostile = ["*a" * 30 + "*b.py", "a/**/" * 10 + "b.py"]
    (tmp_path / ".gitignore").write_text("\n".join([*hostile, *tame]) + "\n")
    judge = ("import json, sys; from pathlib import Path; from ssindex.config import WalkConfig;"
             "from ssindex.stages.walk import Rules, WalkStats, walk; root = Path(sys.argv[1]);"
             "rules = Rules(root, WalkConfig());"
             "print(json.dumps([[f.path for f in walk(root, WalkConfig(), WalkStats())],"
             "[n for n in sys.argv[2:] if not rules.indexable(n)]]))")
    done = subprocess.run([sys.executable, "-c", judge, str(tmp_path), *names],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    walked, refused = json.loads(done.stdout)
    assert set(walked) == set(names) - ignored and set(refused) == ignored


def test_ignore_rules_match_as_pathspecs_or_closer_to_git(tmp_path: Path) -> None:
    """Random rules of stars, brackets and escapes: where the walk's rules and
    pathspec's own differ (a ``[!a]`` that pathspec lets match ``/``), git sides with
    the walk's; nowhere else do they differ."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    draw = random.Random(20)
    glyphs = [*"ab*?[]!/\\.", "[!a]", "[a-c]", "**/", "/**", "*", "[*]", "\\*"]
    paths = sorted({"/".join("".join(draw.choice("ab.*[]") for _ in range(draw.randint(1, 5)))
                             for _ in range(draw.randint(1, 3))) for _ in range(80)})
    paths = [p for p in paths if not {".", "..", ".git"} & set(p.split("/"))] + ["ab/c"]
    drawn = [["".join(draw.choice(glyphs) for _ in range(draw.randint(1, 7)))
              for _ in range(draw.randint(1, 3))] for _ in range(120)]
    differ = 0
    for lines in [["*[!x]*c*"], *drawn]:  # pathspec's ignores ab/c: [!x] takes the "/"
        try:
            ours, theirs = ignore_spec(lines), pathspec.GitIgnoreSpec.from_lines(
                lines, backend="simple")
        except GLOB_ERRORS:
            with pytest.raises(GLOB_ERRORS):
                ignore_spec(lines)
            continue
        git = _git_ignored(tmp_path, lines, paths)
        for path in paths:
            if ours.match_file(path) != theirs.match_file(path):
                differ += 1
                assert ours.match_file(path) == (path in git), (lines, path)
    assert differ  # the draw holds such rules
    # which match a rule's regex finds decides its priority: where no atomic group
    # needs it, a [!x] matches as pathspec's (here the "/" of the directory ab/)
    rules = ["!*[!a]", "ab/**/"]
    plain = pathspec.GitIgnoreSpec.from_lines(rules, backend="simple")
    assert ignore_spec(rules).match_file("ab/") == plain.match_file("ab/") is False
