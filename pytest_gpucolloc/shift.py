"""A paired shift judged by signs: how much a latency percentile moved between two arms, robust to a disturbed unit.

Each unit (a block of fresh processes in ``ab``) gives one log-ratio d = log(candidate / baseline) of a percentile.
Latencies are heavy-tailed: one stalled block moves a mean (and even a signed rank) far, but costs exactly one sign.
The change is the median d, its p value the exact one-sided sign test, its (1 - 2 alpha) interval the
distribution-free one for the median; with too few units there is none (n units give at best p = 2^-n). Why, and
the verdicts: docs/ab.md. Pure functions over numbers.
"""
from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

from .outcome import Outcome


@dataclass(frozen=True)
class Shift:
    verdict: Outcome
    units: int
    change: float | None = None  # the estimated rise (fraction; + is slower)
    ci: tuple[float, float] | None = None  # of the rise, (1 - 2 alpha); None: not resolvable with these units
    p_worse: float | None = None  # one-sided p of a rise
    detectable: float | None = None  # the smallest rise these units resolve (the interval's half-width, as a rise)
    above: int = 0  # units whose quantile rose (the sign of each, for the reader)


@functools.cache
def critical_rank(n: int, alpha: float) -> int:
    """The largest k with P(Bin(n, 1/2) <= k - 1) <= alpha (0: no interval at this alpha with n units)."""
    from scipy import stats

    k = 0
    while k < n and stats.binom.cdf(k, n, 0.5) <= alpha:
        k += 1
    return k


def judge(log_ratios: list[float], threshold: float, alpha: float) -> Shift:
    """The paired shift of ``log_ratios`` (lower is better) at one-sided ``alpha``, a rise of ``threshold`` at least."""
    from scipy import stats

    n = len(log_ratios)
    if n == 0:
        return Shift("inconclusive", 0)
    ordered = sorted(log_ratios)
    median = statistics.median(ordered)
    above, below = sum(d > 0 for d in ordered), sum(d < 0 for d in ordered)
    # a unit that did not move counts against a change either way: the test and the interval count the same units
    p_worse = float(stats.binomtest(above, n, alternative="greater").pvalue)
    p_better = float(stats.binomtest(below, n, alternative="greater").pvalue)
    k = critical_rank(n, alpha)
    low, high = (ordered[k - 1], ordered[-k]) if k else (None, None)
    bound = math.log(1 + threshold)
    verdict: Outcome
    if p_worse < alpha and median >= bound:
        verdict = "regressed"
    elif p_better < alpha and median <= -bound:
        verdict = "improved"
    elif low is not None and high is not None and -bound < low and high < bound:
        verdict = "unchanged"
    else:
        verdict = "inconclusive"
    ci = (math.exp(low) - 1, math.exp(high) - 1) if low is not None and high is not None else None
    detectable = math.exp((high - low) / 2) - 1 if low is not None and high is not None else None
    return Shift(verdict, n, math.exp(median) - 1, ci, p_worse, detectable, above)


def units_needed(alpha: float) -> int:
    """The fewest units for which an interval (and so any verdict but ``inconclusive``) exists at ``alpha``."""
    return next(n for n in range(1, 64) if critical_rank(n, alpha))
