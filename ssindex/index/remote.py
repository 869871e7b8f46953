"""Indexes at object-store URIs (``s3://bucket/prefix``, ``gs://…``, ``abfs://…``).

Builds and searches run against a local mirror of the index, synced through
pyarrow's filesystems, which take their credentials and endpoint from the usual
environment (``AWS_*``, including ``AWS_ENDPOINT_URL`` for S3-compatible servers;
``GOOGLE_APPLICATION_CREDENTIALS``; ``AZURE_STORAGE_*``).

A mirror rather than Lance reading the bucket directly, because the rest of an
index (the builder lock, ``HEAD.json``'s atomic rename, the manifests) is made of
local-filesystem operations, and because every file of an index but
``HEAD.json`` is immutable once written (Lance data, index, transaction and
version files; manifests named by table version). So a sync moves only files
that are new, and ``push`` uploads ``HEAD.json`` last, as one PUT, which object
stores apply atomically: a reader on another machine sees the old index or the
new one, never a mix. Builders on different machines are not locked out of one
prefix (object stores have no ``flock``): the last ``HEAD.json`` wins, and the
versions either one pins stay readable until the next cleanup.
"""

from __future__ import annotations

import os
from pathlib import Path

import xxhash

from ssindex.errors import ConfigError, IndexNotFound
from ssindex.index.layout import HEAD
from ssindex.util.dirs import cache_dir
from ssindex.util.fsio import atomic_write_bytes

_SCHEMES = ("s3", "gs", "gcs", "abfs", "abfss", "az", "hdfs")
_LOCAL_ONLY = ("lock", "staging/")
"""The builder lock and embedding checkpoints belong to one machine: never synced."""


def is_remote(location: str | os.PathLike[str]) -> bool:
    return str(location).split("://", 1)[0].lower() in _SCHEMES and "://" in str(location)


class RemoteIndex:
    """An index at ``uri``, mirrored in the local cache."""

    def __init__(self, uri: str) -> None:
        import pyarrow.fs as pafs

        try:
            self.fs, self.root = pafs.FileSystem.from_uri(uri)
        except (ValueError, OSError) as exc:
            raise ConfigError(f"cannot open {uri}: {exc}") from exc
        self.uri = uri.rstrip("/")
        self.root = self.root.rstrip("/")
        self.local = cache_dir() / "remote" / xxhash.xxh3_64_hexdigest(self.uri.encode())

    def _remote_files(self) -> dict[str, int]:
        """Relative path → size of every file under the prefix."""
        import pyarrow.fs as pafs

        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.root, recursive=True,
                                                            allow_not_found=True))
        except OSError as exc:
            raise IndexNotFound(f"no index at {self.uri}: cannot list it ({exc})") from exc
        return {info.path[len(self.root) + 1 :]: info.size for info in infos
                if info.type == pafs.FileType.File}

    def _local_files(self) -> dict[str, int]:
        if not self.local.is_dir():
            return {}
        return {p.relative_to(self.local).as_posix(): p.stat().st_size
                for p in self.local.rglob("*") if p.is_file()
                and not p.relative_to(self.local).as_posix().startswith(_LOCAL_ONLY)}

    def pull(self) -> Path:
        """Bring the mirror up to the remote index (new files, then ``HEAD.json``);
        files the remote no longer holds are dropped. Returns the mirror's path."""
        remote, local = self._remote_files(), self._local_files()
        self.local.mkdir(parents=True, exist_ok=True)
        for name, size in sorted(remote.items()):
            if name != HEAD and local.get(name) != size:
                self._download(name)
        for name in local.keys() - remote.keys():
            (self.local / name).unlink()
        if HEAD in remote:
            self._download(HEAD)
        return self.local

    def push(self) -> None:
        """Upload what the mirror has that the remote lacks, ``HEAD.json`` last, then
        delete remote files the mirror dropped (versions the build cleaned up)."""
        remote, local = self._remote_files(), self._local_files()
        for name, size in sorted(local.items()):
            if name != HEAD and remote.get(name) != size:
                self._upload(name)
        if HEAD in local:
            self._upload(HEAD)
        for name in remote.keys() - local.keys():
            self.fs.delete_file(f"{self.root}/{name}")

    def _download(self, name: str) -> None:
        with self.fs.open_input_stream(f"{self.root}/{name}") as source:
            data = source.readall()
        target = self.local / name
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(target, data)

    def _upload(self, name: str) -> None:
        with self.fs.open_output_stream(f"{self.root}/{name}") as sink:
            sink.write((self.local / name).read_bytes())


def resolve_index(location: str | os.PathLike[str]) -> Path:
    """A local index path: the location itself, or the pulled mirror of a remote one."""
    if not is_remote(location):
        return Path(location)
    local = RemoteIndex(str(location)).pull()
    if not (local / HEAD).is_file():
        raise IndexNotFound(f"no index at {location} (run `ssindex build --index {location}`)")
    return local
