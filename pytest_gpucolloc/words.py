"""Words said in many places: counted nouns ("1 scenario", "2 scenarios"), what CPU smoke runs are."""
from __future__ import annotations

CPU_SMOKE = "CPU smoke mode: its numbers check the suite, not a GPU"  # said wherever CPU runs' numbers are shown


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1 (``plural``: where adding an s is not it)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
