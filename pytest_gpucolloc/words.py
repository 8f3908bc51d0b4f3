"""Words said in many places: counted nouns ("1 scenario", "2 scenarios"), what CPU smoke runs are."""
from __future__ import annotations

CPU_SMOKE = "CPU smoke mode: its numbers check the suite, not a GPU"  # said wherever CPU runs' numbers are shown


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural (an added s) unless ``n`` is 1."""
    return f"{n:,} {noun if n == 1 else noun + 's'}"
