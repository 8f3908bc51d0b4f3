"""Where a scenario's measurement stands (what is measured, its phase, which rounds), told to whoever shows it: the
session's progress line (``progress.py``) listens. Without a listener each call does nothing, so measurement never
depends on a terminal."""
from __future__ import annotations

from typing import Protocol


class Listener(Protocol):
    def stage(self, text: str) -> None: ...
    def phase(self, text: str, workers: int) -> None: ...
    def rounds(self, start: float, round_s: float, first: int, last: int, most: int) -> None: ...
    def tick(self, ready: int | None) -> None: ...


_listener: Listener | None = None


def listen(listener: Listener | None) -> None:
    global _listener
    _listener = listener


def stage(text: str) -> None:
    """What is measured next (a mode and its jobs): its phases follow."""
    if _listener is not None:
        _listener.stage(text)


def phase(text: str, *, workers: int = 0) -> None:
    if _listener is not None:
        _listener.phase(text, workers)


def rounds(start: float, round_s: float, first: int, last: int, most: int) -> None:
    """Rounds ``first``..``last`` (counted from 1) are measured from ``start``, each ``round_s`` long."""
    if _listener is not None:
        _listener.rounds(start, round_s, first, last, most)


def tick(ready: int | None = None) -> None:
    """About once a second while waiting for workers (``ready`` of them warm, where known)."""
    if _listener is not None:
        _listener.tick(ready)
