"""Progress events from a running build, for whatever front end listens."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def advance(self, stage: str, amount: int = 1) -> None:
        """``amount`` more units (files or chunks) went through ``stage``."""
        ...

    def message(self, text: str) -> None:
        """A notice for the user (a fallback, a broken stale lock)."""
        ...


class SilentProgress:
    def advance(self, stage: str, amount: int = 1) -> None:
        pass

    def message(self, text: str) -> None:
        pass
