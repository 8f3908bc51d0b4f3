"""Level shifts in saved history: per scenario and per physical GPU, where its throughput (or a latency of its serving
job, ``metric="p50"``, ``"p99"``, ``"alone p50"``, ...) moved to a new level and stayed there (``changepoints.py``
finds them in each series)."""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

from .changepoints import DEFAULT_ALPHA, DEFAULT_MIN_RUNS, robust_p, shifts
from .history import History, SavedRun


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
            if (level := run.level(name, metric)) is not None:
                found.setdefault((name, run.gpu(name)), []).append(Point(run, level))
    return found


def detect(points: list[Point], scenario: str, gpu: str, alpha: float = DEFAULT_ALPHA,
           min_runs: int = DEFAULT_MIN_RUNS, metric: str = "throughput") -> list[ChangePoint]:
    values = [p.log_level for p in points]
    kept = shifts(values, alpha, min_runs)
    found = []
    bounds = [0, *kept, len(values)]
    for left, start, right in zip(bounds, kept, bounds[2:]):
        before, after = values[left:start], values[start:right]
        run = points[start].run
        level_before, level_after = math.exp(statistics.fmean(before)), math.exp(statistics.fmean(after))
        found.append(ChangePoint(scenario=scenario, gpu=gpu, run_id=run.run_id, commit=run.commit,
                                 driver=run.machine.get("driver_version"), datetime=run.datetime,
                                 before=level_before, after=level_after, change=level_after / level_before - 1,
                                 p_value=robust_p(before, after), runs_before=len(before), runs_after=len(after),
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
