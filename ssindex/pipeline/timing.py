"""Per-stage wall time for chained iterators.

A stage's time is the time spent inside its ``next()`` minus the time its
upstream stage took to produce the item it consumed: exclusive, so the sum
over stages on one thread is that thread's wall time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


class StageClock:
    def __init__(self) -> None:
        self.inclusive: dict[str, float] = {}
        self.upstream: dict[str, str | None] = {}

    def timed(self, name: str, items: Iterable[T], upstream: str | None) -> Iterator[T]:
        self.inclusive.setdefault(name, 0.0)
        self.upstream[name] = upstream
        iterator = iter(items)
        while True:
            start = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                self.inclusive[name] += time.perf_counter() - start
                return
            self.inclusive[name] += time.perf_counter() - start
            yield item

    def lap(self, name: str, started: float) -> float:
        """Add the time since ``started`` to stage ``name`` (a stage that runs as one
        step, as the Ray engine's do); returns now, the next stage's start."""
        now = time.perf_counter()
        self.inclusive[name] = self.inclusive.get(name, 0.0) + now - started
        return now

    def exclusive(self) -> dict[str, float]:
        out = {}
        for name, total in self.inclusive.items():
            parent = self.upstream.get(name)
            out[name] = round(max(total - (self.inclusive.get(parent, 0.0) if parent else 0.0),
                                  0.0), 3)
        return out
