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
new one, never a mix.

Builders on different machines are not locked out of one prefix (object stores
have no ``flock``), so a push commits like a compare-and-swap. On S3 every file
the build added is written only if absent (``If-None-Match: *``), and
``HEAD.json`` only if it is still the object the build pulled (``If-Match`` on its
ETag): two builders numbering the same table version collide on its files, and
a builder that lost the race exits 4 and names the fix, never overwriting the
other's commit. Other stores get a generation check (``HEAD.json`` read again
before it is written), which narrows the race to that moment.
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path
from typing import Any

import xxhash

from ssindex.errors import ConfigError, IndexLocked, IndexNotFound
from ssindex.index.layout import HEAD
from ssindex.util.dirs import cache_dir
from ssindex.util.fsio import atomic_write_bytes

_SCHEMES = ("s3", "gs", "gcs", "abfs", "abfss", "az", "hdfs")
_LOCAL_ONLY = ("lock", "staging/", ".gitignore")
"""The builder lock, embedding checkpoints and the git ignore file belong to one machine:
never synced."""


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
        self._pulled: dict[str, int] = {}
        self._base: str | None = None
        """The ETag (S3) or bytes' hash of the ``HEAD.json`` pulled; ``None``: none was."""

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

    def pull(self, for_commit: bool = False) -> Path:
        """Bring the mirror up to the remote index (new files, then ``HEAD.json``);
        files the remote no longer holds are dropped. Returns the mirror's path.
        ``for_commit`` notes which ``HEAD.json`` a build starts from (``push``)."""
        remote, local = self._remote_files(), self._local_files()
        self.local.mkdir(parents=True, exist_ok=True)
        if for_commit:
            self._base = self._head_tag() if HEAD in remote else None
        for name, size in sorted(remote.items()):
            if name != HEAD and local.get(name) != size:
                self._download(name)
        for name in local.keys() - remote.keys():
            (self.local / name).unlink()
        if HEAD in remote:
            self._download(HEAD)
        self._pulled = remote
        return self.local

    def push(self) -> None:
        """Upload what the mirror has that the remote lacks, ``HEAD.json`` last, then
        delete remote files the mirror dropped (versions the build cleaned up)."""
        remote, local = self._remote_files(), self._local_files()
        for name in sorted(local.keys() - self._pulled.keys() - {HEAD}):
            if name in remote:  # another builder wrote it since this one pulled
                raise self._lost(name)
            self._upload(name, only_if_absent=True)
        if HEAD in local:
            self._commit_head()
        for name in remote.keys() - local.keys():
            self.fs.delete_file(f"{self.root}/{name}")

    def _download(self, name: str) -> None:
        with self.fs.open_input_stream(f"{self.root}/{name}") as source:
            data = source.readall()
        target = self.local / name
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(target, data)

    def _upload(self, name: str, only_if_absent: bool = False) -> None:
        data = (self.local / name).read_bytes()
        if self._s3 is None:
            with self.fs.open_output_stream(f"{self.root}/{name}") as sink:
                sink.write(data)
            return
        self._put(name, data, {"IfNoneMatch": "*"} if only_if_absent else {})

    def _commit_head(self) -> None:
        """Write ``HEAD.json`` if the remote one is still the one pulled."""
        if self._s3 is None:  # a generation check: no conditional write on this store
            if self._head_tag() != self._base:
                raise self._lost(HEAD)
            self._upload(HEAD)
            return
        self._put(HEAD, (self.local / HEAD).read_bytes(),
                  {"IfMatch": self._base} if self._base else {"IfNoneMatch": "*"})

    def _key(self, name: str) -> tuple[str, str]:
        bucket, _, prefix = self.root.partition("/")
        return bucket, f"{prefix}/{name}" if prefix else name

    def _put(self, name: str, data: bytes, condition: dict[str, str]) -> None:
        from botocore.exceptions import ClientError

        bucket, key = self._key(name)
        try:
            self._s3.put_object(Bucket=bucket, Key=key, Body=data, **condition)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed",
                                                             "ConditionalRequestConflict"):
                raise self._lost(name) from exc
            raise

    def _head_tag(self) -> str | None:
        """The remote ``HEAD.json``'s ETag on S3, its bytes' hash elsewhere."""
        if self._s3 is not None:
            from botocore.exceptions import ClientError

            bucket, key = self._key(HEAD)
            try:
                return str(self._s3.head_object(Bucket=bucket, Key=key)["ETag"])
            except ClientError:
                return None
        try:
            with self.fs.open_input_stream(f"{self.root}/{HEAD}") as source:
                return xxhash.xxh3_64_hexdigest(source.readall())
        except OSError:
            return None

    @cached_property
    def _s3(self) -> Any:
        """A boto3 client for an ``s3://`` index (its conditional writes), else ``None``."""
        if not self.uri.lower().startswith("s3://"):
            return None
        import boto3

        return boto3.client("s3")

    def _lost(self, name: str) -> IndexLocked:
        return IndexLocked(
            f"another build committed to {self.uri} while this one ran ({name} changed "
            "there): its commit stands and nothing of it was overwritten; run the build "
            "again to add this one's changes on top")


def resolve_index(location: str | os.PathLike[str]) -> Path:
    """A local index path: the location itself, or the pulled mirror of a remote one."""
    if not is_remote(location):
        return Path(location)
    local = RemoteIndex(str(location)).pull()
    if not (local / HEAD).is_file():
        raise IndexNotFound(f"no index at {location} (run `ssindex build --index {location}`)")
    return local
