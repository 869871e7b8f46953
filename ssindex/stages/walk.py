"""Walk: git-aware discovery of the text files under a root.

Yields ``SourceFile`` rows in sorted path order, reading each file once, or
not at all when a previous walk's stat of it still holds (``known``). Every
file that is not yielded is counted under a skip reason; directories pruned
whole (deny list, ignore rules) are counted separately. Secrets never pass:
secret files are skipped, secret values redacted (``ssindex.text.secrets``).
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NamedTuple

import pathspec
import xxhash

from ssindex.config import WalkConfig
from ssindex.errors import ConfigError
from ssindex.records import SourceFile, Stamp
from ssindex.text.globs import GLOB_ERRORS, glob_fault, ignore_spec
from ssindex.text.languages import detect_language
from ssindex.text.secrets import redact, secret_file, secret_name

DENIED_DIRS: frozenset[str] = frozenset({
    ".git", ".hg", ".svn", ".ssindex", "node_modules", "bower_components", "__pycache__",
    ".venv", "venv", ".tox", ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache",
    "dist", "build", "target", ".gradle", ".idea", "vendor", "site-packages", ".eggs",
})
IGNORE_FILES: tuple[str, ...] = (".gitignore", ".ssindexignore")
IGNORE_FILE_MAX_BYTES = 1 << 20
"""Ignore files above this size are not read: a generated one of 30,000 lines is 1 MB."""
_SNIFF_BYTES = 8192


@dataclass(slots=True)
class WalkStats:
    files_seen: int = 0
    files_read: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    dirs_pruned: Counter[str] = field(default_factory=Counter)
    secrets_redacted: Counter[str] = field(default_factory=Counter)
    """Secret values redacted from the files read, by kind."""
    ignore_skipped: Counter[str] = field(default_factory=Counter)
    """Ignore rules not followed: lines git would not take (``invalid_rule``), and
    ignore files that are not regular files or are too large (``unusable_file``)."""

    def add(self, other: WalkStats) -> None:
        """Count in what ``read`` counted elsewhere (in a worker process)."""
        self.files_seen += other.files_seen
        self.files_read += other.files_read
        self.skipped.update(other.skipped)
        self.dirs_pruned.update(other.dirs_pruned)
        self.secrets_redacted.update(other.secrets_redacted)
        self.ignore_skipped.update(other.ignore_skipped)


class Candidate(NamedTuple):
    """A file the walk found and did not rule out by its name or place."""

    path: str
    """Where to open it."""
    rel: str
    """POSIX path relative to the root."""


@dataclass(frozen=True, slots=True)
class _IgnoreScope:
    base: str
    """Directory (relative, '' for the root) whose ignore files define ``spec``."""
    spec: pathspec.PathSpec


def content_hash(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


Known = Mapping[str, Stamp]
"""The files a previous walk read, by path."""


def walk(
    root: Path, cfg: WalkConfig, stats: WalkStats, exclude: Path | None = None,
    known: Known | None = None,
) -> Iterator[SourceFile]:
    """Yield the indexable files under ``root``; ``exclude`` (the index dir) is never entered.

    A file listed in ``known`` whose size, mtime, ctime and inode are unchanged is not
    read: it is yielded with the known content hash, empty text and ``read=False``
    (git's index makes the same bet; any write to a file moves its ctime)."""
    stamps = known or {}
    for candidate in discover(root, cfg, stats, exclude):
        source = read(candidate, cfg, stats, stamps)
        if source is not None:
            yield source


def discover(root: Path, cfg: WalkConfig, stats: WalkStats,
             exclude: Path | None = None) -> Iterator[Candidate]:
    """The files under ``root`` to ``read``, in sorted path order, without opening any."""
    root = check_root(root)
    excluded = exclude.resolve() if exclude is not None else None
    extra = [_IgnoreScope("", _spec(cfg.extra_ignores, stats))] if cfg.extra_ignores else []
    yield from _walk_dir(root, root, "", extra, stats, excluded)


def reread(root: Path, source: SourceFile, cfg: WalkConfig, stats: WalkStats,
           ) -> SourceFile | None:
    """``source`` with its text, when the walk did not read it (``None`` if it can no
    longer be read, the reason counted in ``stats``)."""
    if source.read:
        return source
    return read(Candidate(os.path.join(root, source.path), source.path), cfg, stats, {})


def check_root(root: Path) -> Path:
    if not root.exists():
        raise ConfigError(f"path does not exist: {root}")
    if not root.is_dir():
        raise ConfigError(f"path is not a directory: {root}")
    if not os.access(root, os.R_OK | os.X_OK):
        raise ConfigError(f"directory is not readable: {root}")
    return root.resolve()


def _spec(lines: tuple[str, ...] | list[str], stats: WalkStats | None) -> pathspec.PathSpec:
    """Git's rules of ``lines``. A line git would skip (``!``, ``[z-a]``) is skipped,
    and counted: pathspec refuses the whole file for it."""
    try:
        return ignore_spec(lines)
    except GLOB_ERRORS:
        kept = [line for line in lines if glob_fault(line) is None]
        if stats is not None:
            stats.ignore_skipped["invalid_rule"] += len(lines) - len(kept)
        return ignore_spec(kept)


def _load_scope(directory: Path, rel: str, stats: WalkStats | None) -> _IgnoreScope | None:
    lines = [line for name in IGNORE_FILES for line in _ignore_lines(directory / name, stats)]
    return _IgnoreScope(rel, _spec(lines, stats)) if lines else None


def _ignore_lines(path: Path, stats: WalkStats | None) -> list[str]:
    """The lines of one ignore file: none where there is none, and none, counted, where
    it is not a regular file or is too large (a FIFO would block the walk; a link to
    ``/dev/zero`` would fill the memory). Opened without blocking, then checked."""
    try:
        handle = os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb")
    except OSError:
        return []
    with handle:
        st = os.fstat(handle.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > IGNORE_FILE_MAX_BYTES:
            if stats is not None:
                stats.ignore_skipped["unusable_file"] += 1
            return []
        try:
            data = handle.read(IGNORE_FILE_MAX_BYTES)
        except OSError:
            return []
    return data.decode("utf-8", errors="replace").splitlines()


def _ignored(rel: str, is_dir: bool, scopes: list[_IgnoreScope]) -> bool:
    """Git semantics: the deepest ignore file with a matching rule decides (``!`` re-includes)."""
    ignored = False
    for scope in scopes:
        sub = rel[len(scope.base) + 1 :] if scope.base else rel
        verdict = scope.spec.check_file(sub + "/" if is_dir else sub).include
        if verdict is not None:
            ignored = verdict
    return ignored


class Rules:
    """The walk's verdict on one path at a time, for a watcher deciding which file events
    can change the index: the denied directories and ignore files ``discover`` obeys.
    Each directory's ignore files are read once, until ``forget``."""

    def __init__(self, root: Path, cfg: WalkConfig) -> None:
        self._root = root
        self._extra = ([_IgnoreScope("", _spec(cfg.extra_ignores, None))] if cfg.extra_ignores
                       else [])
        self._scopes: dict[str, _IgnoreScope | None] = {}

    def forget(self) -> None:
        """Read ignore files again (one was edited)."""
        self._scopes.clear()

    def indexable(self, rel: str) -> bool:
        """Whether a change at ``rel`` (POSIX, relative to the root) can change what the
        walk finds: not in a denied or ignored directory, not an ignored file. Ignore files
        themselves count, since they change what the walk takes."""
        parts = rel.split("/")
        scopes = [*self._extra, *self._scope("")]
        for depth in range(1, len(parts)):
            directory = "/".join(parts[:depth])
            if parts[depth - 1] in DENIED_DIRS or _ignored(directory, True, scopes):
                return False
            scopes += self._scope(directory)
        return parts[-1] in IGNORE_FILES or (parts[-1] != ".git"
                                             and not _ignored(rel, False, scopes))

    def _scope(self, rel_dir: str) -> list[_IgnoreScope]:
        if rel_dir not in self._scopes:
            self._scopes[rel_dir] = _load_scope(self._root / rel_dir, rel_dir, None)
        scope = self._scopes[rel_dir]
        return [scope] if scope is not None else []


def _walk_dir(
    root: Path,
    directory: Path,
    rel_dir: str,
    scopes: list[_IgnoreScope],
    stats: WalkStats,
    excluded: Path | None,
) -> Iterator[Candidate]:
    scope = _load_scope(directory, rel_dir, stats)
    if scope is not None:
        scopes = [*scopes, scope]
    try:
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        stats.dirs_pruned["unreadable"] += 1
        return
    for entry in entries:
        rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
        if not _utf8_name(rel):
            stats.files_seen += 1
            stats.skipped["non_utf8_name"] += 1
            continue
        try:
            is_link = entry.is_symlink()
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            stats.files_seen += 1
            stats.skipped["vanished"] += 1
            continue
        if is_dir:
            reason = _prune_reason(entry, rel, scopes, excluded)
            if reason:
                stats.dirs_pruned[reason] += 1
                continue
            yield from _walk_dir(root, Path(entry.path), rel, scopes, stats, excluded)
            continue
        if entry.name in IGNORE_FILES or entry.name == ".git":  # rules, or a worktree's link
            continue
        stats.files_seen += 1
        if _ignored(rel, False, scopes):
            stats.skipped["ignored"] += 1
            continue
        reason = _link_reason(root, Path(entry.path)) if is_link else None
        if reason:
            stats.skipped[reason] += 1
            continue
        yield Candidate(entry.path, rel)


def _read_up_to(handle: BinaryIO, size: int, limit: int) -> bytes:
    """Up to ``limit + 1`` bytes (one more tells a file over the limit): as many as its
    stat said, then, if it grew since, the rest in pieces. One read of ``limit + 1``
    would allocate them all first, whatever the file's size."""
    parts = [handle.read(min(size, limit) + 1)]
    read = len(parts[0])
    while size < read <= limit and (more := handle.read(min(limit + 1 - read, 1 << 20))):
        parts.append(more)
        read += len(more)
    return b"".join(parts)


def _utf8_name(rel: str) -> bool:
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _prune_reason(
    entry: os.DirEntry[str], rel: str, scopes: list[_IgnoreScope], excluded: Path | None
) -> str | None:
    if entry.name in DENIED_DIRS:
        return "denied"
    if os.path.exists(os.path.join(entry.path, "pyvenv.cfg")):
        return "denied"
    if excluded is not None and Path(entry.path).resolve() == excluded:
        return "index_dir"
    if _ignored(rel, True, scopes):
        return "ignored"
    return None


def _link_reason(root: Path, path: Path) -> str | None:
    """Why a symlink is skipped, or ``None`` for a link to a regular file inside the root."""
    try:
        target = path.resolve(strict=True)
    except (OSError, RuntimeError):
        return "symlink_broken_or_loop"
    if not target.is_relative_to(root):
        return "symlink_outside_root"
    if target.is_dir():
        return "symlink_dir"
    return None


def read(candidate: Candidate, cfg: WalkConfig, stats: WalkStats,
         known: Known) -> SourceFile | None:
    """The file as a ``SourceFile`` (unread when ``known`` holds its stat), or ``None``
    with the reason counted in ``stats``."""
    path, rel = candidate
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            stats.skipped["not_regular"] += 1
            return None
        if st.st_size > cfg.max_file_bytes:
            stats.skipped["too_large"] += 1
            return None
        if not cfg.allow_secrets and secret_name(rel):  # never read at all
            stats.skipped["secret"] += 1
            return None
        seen = known.get(rel)
        if seen is not None and seen.matches(st):
            return SourceFile(rel, detect_language(rel), "", st.st_size, st.st_mtime_ns,
                              seen.content_hash, st.st_ctime_ns, st.st_ino, read=False,
                              secrets=seen.secrets)
        stats.files_read += 1
        with open(path, "rb") as handle:
            data = _read_up_to(handle, st.st_size, cfg.max_file_bytes)
    except FileNotFoundError:
        stats.skipped["vanished"] += 1
        return None
    except PermissionError:
        stats.skipped["unreadable"] += 1
        return None
    except OSError:
        stats.skipped["unreadable"] += 1
        return None
    text = _text(data, rel, cfg, stats)
    if text is None:
        return None
    found = 0
    if not cfg.allow_secrets:
        text, kinds = redact(text)
        stats.secrets_redacted.update(kinds)
        found = kinds.total()
    return SourceFile(
        path=rel,
        language=detect_language(rel),
        text=text,
        size=len(data),
        mtime_ns=st.st_mtime_ns,
        content_hash=content_hash(data),
        ctime_ns=st.st_ctime_ns,
        inode=st.st_ino,
        secrets=found,
    )


def _text(data: bytes, rel: str, cfg: WalkConfig, stats: WalkStats) -> str | None:
    """The file's text, or ``None`` with the reason counted: too large, binary, not
    UTF-8, empty, minified, or a secret as a whole."""
    if len(data) > cfg.max_file_bytes:
        stats.skipped["too_large"] += 1
        return None
    if b"\0" in data[:_SNIFF_BYTES]:
        stats.skipped["binary"] += 1
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        stats.skipped["invalid_utf8"] += 1
        return None
    if not text.strip():
        stats.skipped["empty"] += 1
        return None
    limit = cfg.max_average_line_chars
    if limit and len(text) > limit * (text.count("\n") + 1):
        stats.skipped["minified"] += 1
        return None
    if not cfg.allow_secrets and secret_file(rel, text):
        stats.skipped["secret"] += 1
        return None
    return text
