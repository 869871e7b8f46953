"""Progress events from a running build, for whatever front end listens."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Protocol

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


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Notices:
    """Progress reduced to its notices, a fallback or a version committed, each said to
    ``say`` (stderr by default): ``ssindex watch``'s builds."""

    def __init__(self, say: Callable[[str], None] = _to_stderr) -> None:
        self._say = say

    def __enter__(self) -> Notices:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def advance(self, stage: str, amount: int = 1) -> None:
        pass

    def message(self, text: str) -> None:
        self._say(f"warning: {text}")

    def restart(self, text: str) -> None:
        self._say(text)


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
