"""Level shifts in saved history: per scenario and per physical GPU, where its throughput (or a latency of its serving
job, ``metric="p50"``, ``"p99"``, ``"alone p50"``, ...) moved to a new level and stayed there.

Candidates come from ``ruptures`` (PELT over the runs' mean log throughput, a penalty scaled by the series' own
run-to-run noise); a candidate is kept only where Welch's t-test between the runs since the previous kept
level and the runs up to the next one says the levels differ (p < alpha) and keeps saying so with any one run left
out. Each level must hold for ``min_runs`` runs: a single outlier run is never a change point.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

from .history import History, SavedRun, series_gpu

DEFAULT_ALPHA = 0.01
DEFAULT_MIN_RUNS = 3


@dataclass(frozen=True)
class Point:
    run: SavedRun  # one run of the series
    log_level: float  # of what the series follows: throughput (samples/s) or a latency (ms)


@dataclass(frozen=True, kw_only=True)
class ChangePoint:
    scenario: str
    gpu: str  # physical GPU (UUID), or "CPU smoke"
    run_id: str  # the first run at the new level
    commit: str | None
    driver: str | None
    datetime: str
    before: float  # geometric mean of the level before: samples/s, or ms of a latency
    after: float
    change: float  # fraction: + is faster (a latency: + is higher)
    p_value: float  # Welch's t-test between the two levels, the largest with any one run left out
    runs_before: int
    runs_after: int
    metric: str = "throughput"  # or a latency: "p50", "p90", "p99", "alone p50", "alone p99"

    def to_dict(self) -> dict:
        return asdict(self)


def series(history: History, metric: str = "throughput") -> dict[tuple[str, str], list[Point]]:
    """Each scenario's comparable runs per physical GPU, oldest first (throttled runs, runs that shared the
    GPU with foreign processes and, of p99, saturated services are left out: their level is not the scenario's)."""
    found: dict[tuple[str, str], list[Point]] = {}
    for run in history.runs:
        for name in run.scenarios:
            sample = run.sample(name, metric)
            if sample is None or sample.throttled or sample.contaminated or sample.saturated:
                continue
            level = -sample.log_mean if sample.latency else sample.log_mean  # a latency sample holds 1/latency
            found.setdefault((name, series_gpu(run, run.scenarios[name])), []).append(Point(run, level))
    return found


def _welch_p(before: list[float], after: list[float]) -> float:
    from scipy import stats

    if statistics.pvariance(before) == 0 and statistics.pvariance(after) == 0:
        return 0.0 if statistics.fmean(before) != statistics.fmean(after) else 1.0
    return float(stats.ttest_ind(before, after, equal_var=False).pvalue)


def _robust_p(before: list[float], after: list[float]) -> float:
    """The largest p with any one run left out: one odd run cannot make (or carry) a shift."""
    ps = [_welch_p(before, after)]
    ps += [_welch_p(before[:i] + before[i + 1:], after) for i in range(len(before))]
    ps += [_welch_p(before, after[:i] + after[i + 1:]) for i in range(len(after))]
    return max(ps)


def _candidates(values: list[float], min_runs: int) -> list[int]:
    """Indexes where a new level may start (ruptures' PELT, penalty from the run-to-run noise)."""
    import numpy as np
    import ruptures

    diffs = [b - a for a, b in zip(values, values[1:])]
    centre = statistics.median(diffs)
    noise = 1.4826 * statistics.median(abs(d - centre) for d in diffs) / math.sqrt(2)  # robust to the shifts
    noise = max(noise, 1e-6)
    signal = np.asarray(values).reshape(-1, 1) / noise
    ends = ruptures.Pelt(model="l2", min_size=min_runs, jump=1).fit(signal).predict(pen=2 * math.log(len(values)))
    return ends[:-1]  # the last "end" is the series' length


def can_hold_a_shift(runs: int, min_runs: int = DEFAULT_MIN_RUNS) -> bool:
    """Whether a series of ``runs`` runs can show a shift at all: two levels of ``min_runs`` runs each."""
    return runs >= 2 * min_runs


def shifts(values: list[float], alpha: float = DEFAULT_ALPHA, min_runs: int = DEFAULT_MIN_RUNS) -> list[int]:
    """Indexes (into ``values``, oldest first) where a new level starts and holds."""
    if not can_hold_a_shift(len(values), min_runs):
        return []
    kept: list[int] = []
    candidates = _candidates(values, min_runs)
    for k, start in enumerate(candidates):
        left = kept[-1] if kept else 0
        right = candidates[k + 1] if k + 1 < len(candidates) else len(values)
        before, after = values[left:start], values[start:right]
        if len(before) >= min_runs and len(after) >= min_runs and _robust_p(before, after) < alpha:
            kept.append(start)
    return kept


def level_start(values: list[float], alpha: float = DEFAULT_ALPHA, min_runs: int = DEFAULT_MIN_RUNS) -> int:
    """Where the series' current level starts: the last shift, or 0 (the gate's baseline is this level)."""
    found = shifts(values, alpha, min_runs)
    return found[-1] if found else 0


def detect(points: list[Point], scenario: str, gpu: str, alpha: float = DEFAULT_ALPHA,
           min_runs: int = DEFAULT_MIN_RUNS, metric: str = "throughput") -> list[ChangePoint]:
    values = [p.log_level for p in points]
    kept = shifts(values, alpha, min_runs)
    found = []
    bounds = [0, *kept, len(values)]
    for i, start in enumerate(kept):
        before, after = values[bounds[i]:start], values[start:bounds[i + 2]]
        run = points[start].run
        level_before, level_after = math.exp(statistics.fmean(before)), math.exp(statistics.fmean(after))
        found.append(ChangePoint(scenario=scenario, gpu=gpu, run_id=run.run_id, commit=run.commit,
                                 driver=run.machine.get("driver_version"), datetime=run.datetime,
                                 before=level_before, after=level_after, change=level_after / level_before - 1,
                                 p_value=_robust_p(before, after), runs_before=len(before), runs_after=len(after),
                                 metric=metric))
    return found


def find(history: History, scenario: str | None = None, gpu: str | None = None, alpha: float = DEFAULT_ALPHA,
         min_runs: int = DEFAULT_MIN_RUNS, metric: str = "throughput"
         ) -> tuple[list[ChangePoint], list[tuple[str, str, int]]]:
    """Change points of every series of ``metric`` (optionally of scenarios whose name contains ``scenario`` and
    GPUs whose UUID starts with ``gpu``), and every series looked at: (scenario, GPU, number of runs)."""
    points, looked = [], []
    for (name, uuid), runs in series(history, metric).items():
        if (scenario and scenario not in name) or (gpu and not uuid.startswith(gpu)):
            continue
        looked.append((name, uuid, len(runs)))
        points += detect(runs, name, uuid, alpha, min_runs, metric)
    return points, looked
