"""A paired shift of a latency percentile between two arms, robust to a disturbed unit.

Each unit (a block of fresh processes in ``ab``) gives one log-ratio d = log(candidate / baseline) of a percentile.
Two rules, both exact and distribution-free, each with the (1 - 2 alpha) interval its test inverts:

- **signs** (a tail): the change is the median d, its p the one-sided sign test's. A stalled block moves a tail
  by 2-5x; under signs it costs exactly one unit, whatever its size.
- **signed ranks** (the median, p50): the change is the Hodges-Lehmann estimate (the median of the pairwise means
  of the d), its p the exact Wilcoxon signed-rank test's. A block's p50 barely moves on a stall, but a process's
  level moves it by about 10% in either arm: a block whose two arms drew different levels lands near 0 or beyond
  it, and signs count each such block as a full vote against; ranks count it by its size.

With too few units there is no interval (n units give at best p = 2^-n, under either rule). Units that did not
move count against a change either way. Why, and the verdicts: docs/ab.md. Pure functions over numbers.
"""
from __future__ import annotations

import bisect
import functools
import itertools
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
def _null_cdf(n: int, ranks: bool) -> tuple[float, ...]:
    """P(S <= s) for s = 0, 1, ... under no change: S the count of units above 0 (signs), or the sum of the ranks
    of the units above 0 (signed ranks; counted exactly, for every subset of ranks)."""
    from scipy import stats

    if not ranks:
        return tuple(stats.binom.cdf(range(n + 1), n, 0.5))
    ways = [1] + [0] * (n * (n + 1) // 2)
    for rank in range(1, n + 1):
        for total in range(len(ways) - 1, rank - 1, -1):
            ways[total] += ways[total - rank]
    return tuple(x / 2**n for x in itertools.accumulate(ways))


@functools.cache
def critical_rank(n: int, alpha: float, ranks: bool = False) -> int:
    """The largest k with P(S <= k - 1) <= alpha under no change (0: no interval at this alpha with n units)."""
    cdf = _null_cdf(n, ranks)
    return next((k for k, p in enumerate(cdf) if p > alpha), len(cdf))


def judge(log_ratios: list[float], threshold: float, alpha: float, ranks: bool = False) -> Shift:
    """The paired shift of ``log_ratios`` (lower is better) at one-sided ``alpha``, a rise of ``threshold`` at least;
    by signed ranks when ``ranks``, else by signs."""
    n = len(log_ratios)
    if n == 0:
        return Shift("inconclusive", 0)
    # signs look at the units, signed ranks at their pairwise means (Walsh averages): without ties the count of those
    # below 0 is the sum of the ranks of the units below 0, so one ordered list gives the estimate, the test and the
    # interval (a mean of exactly 0 counts against a change either way, as a unit that did not move does)
    points = sorted((a + b) / 2 for a, b in itertools.combinations_with_replacement(log_ratios, 2)) if ranks \
        else sorted(log_ratios)
    median = statistics.median(points)
    cdf = _null_cdf(n, ranks)
    p_worse, p_better = cdf[sum(x <= 0 for x in points)], cdf[sum(x >= 0 for x in points)]
    k = critical_rank(n, alpha, ranks)
    low, high = (points[k - 1], points[-k]) if k else (math.nan, math.nan)
    bound = math.log(1 + threshold)
    verdict: Outcome
    if p_worse < alpha and median >= bound:
        verdict = "regressed"
    elif p_better < alpha and median <= -bound:
        verdict = "improved"
    elif k and -bound < low and high < bound:
        verdict = "unchanged"
    else:
        verdict = "inconclusive"
    ci, detectable = ((math.exp(low) - 1, math.exp(high) - 1), math.exp((high - low) / 2) - 1) if k else (None, None)
    return Shift(verdict, n, math.exp(median) - 1, ci, p_worse, detectable, sum(d > 0 for d in log_ratios))


def _alarms(level: float, looks: int, ranks: bool) -> float:
    """The share of sequences with no change in which a rule that rejects at p <= ``level`` calls a rise at one of
    ``looks`` looks, exactly: under no change each new unit's sign is a coin flip and its place among the units so far
    (ordered by size) uniform, whatever the noise. A state is those signs in that order, as the bits of a number."""
    import numpy as np

    weights = np.arange(1, looks + 1) if ranks else np.ones(looks, dtype=np.int64)
    states: np.ndarray = np.zeros(1, dtype=np.int64)
    shares: np.ndarray = np.ones(1)
    rejected = 0.0
    for n in range(1, looks + 1):
        grown = [(states & ((1 << place) - 1)) | (below << place) | ((states >> place) << (place + 1))
                 for place in range(n) for below in (0, 1)]  # the new unit below or above 0, at each place
        states, where = np.unique(np.concatenate(grown), return_inverse=True)
        shares = np.bincount(where, weights=np.tile(shares, 2 * n) / (2 * n))
        counted = ((states[:, None] >> np.arange(n)) & 1) @ weights[:n]  # units below 0, or the sum of their ranks
        hit = np.asarray(_null_cdf(n, ranks))[counted] <= level
        rejected += float(shares[hit].sum())
        states, shares = states[~hit], shares[~hit]
    return rejected


EXACT_LOOKS = 16  # beyond, the states (2^looks) cost too much: Bonferroni over the looks that can reject


@functools.cache
def per_look_alpha(alpha: float, looks: int, ranks: bool = False) -> float:
    """The alpha each of ``looks`` looks (after units 1, 2, ... ``looks``) may use so that a rule judged after every
    unit, stopped at the first rise found, calls a rise in at most ``alpha`` of sequences with no change (a constant
    boundary, as Pocock's): the largest of the rule's own p values that keeps it there (``_alarms``)."""
    if looks > EXACT_LOOKS:
        return alpha / max(1, looks - units_needed(alpha) + 1)
    levels = sorted({p for n in range(1, looks + 1) for p in _null_cdf(n, ranks) if p < alpha})
    # the alarms grow with the level: the first level that gives too many, found by bisection
    too_many = bisect.bisect_left(levels, True, key=lambda level: _alarms(level, looks, ranks) > alpha)
    return math.nextafter(levels[too_many - 1], 1.0) if too_many else alpha  # judge() rejects p < alpha


def units_needed(alpha: float) -> int:
    """The fewest units for which an interval (and so any verdict but ``inconclusive``) exists at ``alpha`` (the same
    under either rule: all n units on one side give p = 2^-n)."""
    return next(n for n in range(1, 64) if critical_rank(n, alpha))
