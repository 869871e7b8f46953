"""Progress from a Ray cluster as it works: Ray Data hands a stage's output over only
when all of it is done, so the stage's tasks and actors count their rows on a ``Tally``
actor, and the driver polls it while it waits for the stage (``Tallied``)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ssindex.pipeline.progress import Progress


class Tally:
    """Rows the cluster's tasks and actors have finished, by stage (run as a Ray actor)."""

    def __init__(self) -> None:
        self._done: dict[str, int] = {}

    def add(self, stage: str, amount: int) -> None:
        self._done[stage] = self._done.get(stage, 0) + amount

    def done(self, stage: str) -> int:
        return self._done.get(stage, 0)


class Tallied:
    """A stage's rows reported as the cluster finishes them, not all at its end: a
    thread polls ``done`` (the rows a ``Tally`` actor was told of) while the driver
    waits for the stage. ``shown`` is what was reported, at most ``limit``."""

    POLL_SECONDS = 1.0

    def __init__(self, progress: Progress, stage: str, done: Callable[[], int],
                 limit: int | None = None) -> None:
        self.progress, self.stage, self.done, self.limit = progress, stage, done, limit
        self.shown = 0
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="ssindex-tally", daemon=True)

    def __enter__(self) -> Tallied:
        self._poller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._poller.join()

    def rest(self, total: int) -> int:
        """What is left to report of the stage's ``total`` rows."""
        return max(total - self.shown, 0)

    def _poll(self) -> None:
        while not self._stop.wait(self.POLL_SECONDS):
            try:
                done = self.done()
            except Exception:  # progress only: the stage's own wait raises what failed
                return
            # a retried task adds its rows again: never past the stage's rows
            done = done if self.limit is None else min(done, self.limit)
            if done > self.shown:
                self.progress.advance(self.stage, done - self.shown)
                self.shown = done
