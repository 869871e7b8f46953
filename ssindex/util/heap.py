"""Handing freed heap memory back to the operating system.

glibc's malloc keeps freed blocks in its arenas and returns little of them to the OS on
its own. The embed stage frees activation tensors of a different shape every batch, so
a long build's resident memory climbed with every chunk it embedded: on this project's
AVX2 machine 877 → 1,191 MB over 6,144 texts through the fp32 encoder alone, ~190 KB per
chunk in bf16 on AMX. ``malloc_trim(0)`` after each batch keeps it flat (533–537 MB over
the same texts) for ~45 ms per call, against ~17 s of compute per 512-text batch there;
``Trimmer`` spaces the calls so that they never take more than 5% of the time (a GPU
embeds a batch in milliseconds). The trim's cost is paid again after it: the next batch
faults the returned pages back in. Trimming after every forward pass rather than every
call of 1,024 chunks held a 9,587-chunk build at 992 against 1,113 MB, but took the
whole standard library's build from 333 to 400 s on AMX.
Each thread a build runs also meets freed memory only in its own arena, so builds share
a few (``limit_arenas``), and a trim also hands back what Arrow's allocator holds unused
(after a lexical pass of 9,587 chunks: 388 → 329 MB).
Written by hand because no maintained library exposes the calls; other C libraries
(musl, macOS) have no such functions, and there they are no-ops.
"""

from __future__ import annotations

import ctypes
import functools
import time

import pyarrow as pa

TIME_SHARE = 0.05
"""The most of the time ``Trimmer`` spends trimming."""
ARENAS = 2
"""malloc arenas a build's threads share at most (glibc's default: 8 per core)."""
_M_ARENA_MAX = -8


def limit_arenas() -> None:
    """Let the process's threads share at most ``ARENAS`` malloc arenas. Each thread that
    meets a busy arena gets one of its own (the main thread, the producer, torch's,
    Lance's, the pool's), and each keeps its freed memory apart: a 9,587-chunk build
    peaked at 984–1,017 MB with the default (four runs), 889–991 MB with two (five runs),
    no slower; a whole-stdlib build without the forward pass 1,053–1,098 against
    1,002–1,032 MB. glibc fixes its limit once it has more than 8 arenas, so this is
    called as a build starts; off glibc it does nothing."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_ARENA_MAX, ARENAS)


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """glibc, when this process runs on it (``mallopt`` and ``malloc_trim`` are its own)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def trim() -> None:
    """Return the free memory at the top and inside of every malloc arena to the OS, and
    what Arrow's allocator (mimalloc) holds unused."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
    pa.default_memory_pool().release_unused()


class Trimmer:
    """Trims after bulk work, no more often than keeps trimming within ``TIME_SHARE``."""

    def __init__(self) -> None:
        self._last = time.monotonic()
        self._cost = 0.0

    def after_batch(self) -> None:
        """Trim now unless the last trim was too recent for its cost."""
        started = time.monotonic()
        if started - self._last < self._cost / TIME_SHARE:
            return
        trim()
        self._last = time.monotonic()
        self._cost = self._last - started
