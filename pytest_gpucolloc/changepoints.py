"""Level shifts in a series of run means (oldest first): where it moved to a new level and stayed there. Pure
statistics over floats; ``history_shifts.py`` applies them to saved history.

Candidates come from ``ruptures``' PELT (its C L2 cost, ``KernelCPD`` with a linear kernel), in overlapping blocks
beyond ``BLOCK`` runs; one is kept only where Welch's t-test says the levels on either side differ, with any one run
left out. Each level must hold for ``min_runs`` runs: a single outlier run is never a change point.
"""
from __future__ import annotations

import math
import statistics

DEFAULT_ALPHA = 0.01
DEFAULT_MIN_RUNS = 3
# PELT's time grows with the square of a steady series' length (2 s for 10,000 runs): longer series are searched in
# overlapping blocks of this many runs (linear time); up to it, and so over the gate's newest runs
# (history.GATE_WINDOW), the candidates are PELT's over the whole series
BLOCK = 1000


def robust_p(before: list[float], after: list[float]) -> float:
    """Welch's t-test between the two levels: the largest p with any one run left out (one odd run cannot make,
    or carry, a shift). All the tests at once: each left-out run changes its side's mean and sum of squares by a
    term of its own. Sides whose runs are all equal have no spread: they differ (p 0) or not (p 1)."""
    import numpy as np
    from scipy import special  # Student t; importing scipy.stats costs most of a second

    def sides(values: list[float]):
        """Count, mean, variance, all equal and their value if so: of the whole side, then without each run."""
        x = np.asarray(values, dtype=float)
        n, centre = len(x), float(np.mean(x))
        d = x - centre
        squares = float(np.sum(d * d))
        with np.errstate(divide="ignore", invalid="ignore"):
            counts = np.concatenate([[n], np.full(n, n - 1)])
            means = np.concatenate([[centre], centre - d / (n - 1)])
            sums = np.concatenate([[squares], np.maximum(squares - d * d * n / (n - 1), 0.0)])
            variances = sums / (counts - 1)
        ordered = np.sort(x)
        second_top, second_bottom = ordered[-2 if n > 1 else -1], ordered[1 if n > 1 else 0]
        top = np.where((x == ordered[-1]) & (second_top != ordered[-1]), second_top, ordered[-1])  # of the others
        bottom = np.where((x == ordered[0]) & (second_bottom != ordered[0]), second_bottom, ordered[0])
        equal = np.concatenate([[ordered[0] == ordered[-1]], top == bottom])
        return counts, means, variances, equal, np.concatenate([[ordered[0]], top])

    b, a = sides(before), sides(after)
    # each test: (before, after), (before without run i, after), (before, after without run j)
    whole_b, whole_a = np.zeros(len(after), dtype=int), np.zeros(len(before), dtype=int)
    pick_b = np.concatenate([[0], np.arange(1, len(before) + 1), whole_b])
    pick_a = np.concatenate([[0], whole_a, np.arange(1, len(after) + 1)])
    n1, m1, v1, e1, level1 = (part[pick_b] for part in b)
    n2, m2, v2, e2, level2 = (part[pick_a] for part in a)
    with np.errstate(divide="ignore", invalid="ignore"):
        s1, s2 = v1 / n1, v2 / n2
        t = (m1 - m2) / np.sqrt(s1 + s2)
        dof = (s1 + s2) ** 2 / (s1 ** 2 / (n1 - 1) + s2 ** 2 / (n2 - 1))
        p = 2 * special.stdtr(dof, -np.abs(t))
    p = np.where(e1 & e2, np.where(level1 != level2, 0.0, 1.0), p)
    return float(p[0]) if np.isnan(p[0]) else float(np.nanmax(p))  # a side of one run has no spread: not a test


def _candidates(values: list[float], min_runs: int) -> list[int]:
    """Indexes where a new level may start (ruptures' PELT, penalty from the run-to-run noise)."""
    import numpy as np
    import ruptures

    diffs = [b - a for a, b in zip(values, values[1:])]
    centre = statistics.median(diffs)
    noise = max(1.4826 * statistics.median(abs(d - centre) for d in diffs) / math.sqrt(2), 1e-6)  # robust to shifts
    signal = np.asarray(values).reshape(-1, 1) / noise
    penalty = 2 * math.log(len(values))

    def pelt(part) -> list[int]:
        ends = ruptures.KernelCPD(kernel="linear", min_size=min_runs).fit(part).predict(pen=penalty)
        return [int(end) for end in ends[:-1]]  # the last "end" is the series' length

    if len(values) <= BLOCK:
        return pelt(signal)
    # blocks overlapping by half, each keeping the candidates of its middle half (the first from the start, the last
    # to the end): every run is searched with a quarter block of context on either side
    found, step = set(), BLOCK // 2
    for start in range(0, len(values) - step, step):
        end = min(start + BLOCK, len(values))
        low = start if start == 0 else start + BLOCK // 4
        high = end if end == len(values) else start + 3 * BLOCK // 4
        found |= {start + i for i in pelt(signal[start:end]) if low <= start + i < high}
    return sorted(found)


def can_hold_a_shift(runs: int, min_runs: int = DEFAULT_MIN_RUNS) -> bool:
    """Whether a series of ``runs`` runs can show a shift at all: two levels of ``min_runs`` runs each."""
    return runs >= 2 * min_runs


def shifts(values: list[float], alpha: float = DEFAULT_ALPHA, min_runs: int = DEFAULT_MIN_RUNS) -> list[int]:
    """Indexes (into ``values``, oldest first) where a new level starts and holds."""
    if not can_hold_a_shift(len(values), min_runs):
        return []
    kept: list[int] = []
    candidates = _candidates(values, min_runs)
    for start, right in zip(candidates, [*candidates[1:], len(values)]):
        before, after = values[(kept or [0])[-1]:start], values[start:right]
        if len(before) >= min_runs and len(after) >= min_runs and robust_p(before, after) < alpha:
            kept.append(start)
    return kept


def level_start(values: list[float], alpha: float = DEFAULT_ALPHA, min_runs: int = DEFAULT_MIN_RUNS) -> int:
    """Where the series' current level starts: the last shift, or 0 (the gate's baseline is this level)."""
    return (shifts(values, alpha, min_runs) or [0])[-1]
