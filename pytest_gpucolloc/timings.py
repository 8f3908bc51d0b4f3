"""How long each scenario took when it last ran on this kind of machine with these settings, kept in pytest's cache
(``.pytest_cache``), so that a run can say before it starts how long it will take. Nothing is kept when pytest's
cache is off (``-p no:cacheprovider``) or under xdist."""
from __future__ import annotations

import math

from .report import duration
from .words import count

CACHE_KEY = "gpucolloc/scenario-seconds"


def _kind(machine: str, settings) -> str:
    """What a scenario's time depends on besides the scenario: the machine kind and the measurement settings."""
    return (f"{machine}; rounds {settings.rounds}-{settings.max_rounds} x {settings.round_s:g} s; precision "
            f"{settings.precision:.2%}; warm-up at most {settings.warmup_s:g} s"
            + ("; cuDNN heuristics" if settings.cudnn == "heuristics" else ""))


def _kept(config) -> dict:
    cache = getattr(config, "cache", None)
    kept = cache.get(CACHE_KEY, {}) if cache is not None else {}
    return kept if isinstance(kept, dict) else {}


def last_seconds(config, machine: str, settings) -> dict[str, float]:
    """Test id -> seconds its scenario took when it last ran here (entries that are not a number are ignored)."""
    found = _kept(config).get(_kind(machine, settings), {})
    if not isinstance(found, dict):
        return {}
    return {test: float(s) for test, s in found.items()
            if isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) and s >= 0}


def remember(config, machine: str, settings, seconds: dict[str, float]) -> None:
    """Keep this run's times beside those of scenarios it did not run."""
    if getattr(config, "cache", None) is not None:
        kept = {**_kept(config), _kind(machine, settings): {**last_seconds(config, machine, settings), **seconds}}
        config.cache.set(CACHE_KEY, kept)


def expected(test_ids: list[str], last: dict[str, float], at_most_each: float) -> str | None:
    """'about 31 min going by ...': None when none of these scenarios ran here before."""
    known = [last[test] for test in test_ids if test in last]
    if not known:
        return None
    rest = len(test_ids) - len(known)
    line = (f"gpucolloc: about {duration(sum(known))} going by their last run here ({len(known)} of "
            f"{count(len(test_ids), 'scenario')}, this kind of machine and these settings)")
    return line + (f"; the other {rest} at most {duration(rest * at_most_each)}" if rest else "")
