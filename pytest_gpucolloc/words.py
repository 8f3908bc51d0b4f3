"""Counted nouns as English says them: "1 scenario", "2 scenarios"."""
from __future__ import annotations


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1 (``plural``: where adding an s is not it)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
