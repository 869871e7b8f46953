"""Progress events from a running build, for whatever front end listens."""

from __future__ import annotations

from typing import Protocol

from ssindex.index.activity import Activity


class Progress(Protocol):
    def advance(self, stage: str, amount: int = 1) -> None:
        """``amount`` more units (files or chunks) went through ``stage``; none, as a
        pass begins: the rows past the embed stage will count for ``stage`` (``embed``,
        or ``write`` where the pass embeds nothing)."""
        ...

    def message(self, text: str) -> None:
        """A notice for the user (a fallback, a broken stale lock)."""
        ...

    def restart(self, text: str) -> None:
        """A new pass over the tree begins (a progressive build's embedding, after its
        lexical version): counts start again; ``text`` says what was committed."""
        ...


class SilentProgress:
    def advance(self, stage: str, amount: int = 1) -> None:
        pass

    def message(self, text: str) -> None:
        pass

    def restart(self, text: str) -> None:
        pass


class Tracked:
    """A build's progress, passed on to ``inner`` and recorded for ``ssindex status``
    (``ssindex.index.activity``)."""

    def __init__(self, inner: Progress, activity: Activity) -> None:
        self.inner, self.activity = inner, activity

    def advance(self, stage: str, amount: int = 1) -> None:
        self.inner.advance(stage, amount)
        self.activity.advance(stage, amount)

    def message(self, text: str) -> None:
        self.inner.message(text)

    def restart(self, text: str) -> None:
        self.inner.restart(text)
