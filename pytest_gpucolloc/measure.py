"""Turn workers' measurement rounds into throughput numbers (pure arithmetic, no I/O).

A round is ``(seconds, samples)`` between two device synchronisations at boundaries shared by all
workers of a phase, so round k of every worker covers the same wall-clock window.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

Round = tuple[float, int]


def coefficient_of_variation(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean > 0 else None


@dataclass(frozen=True)
class WorkerStats:
    rounds: list[Round]
    samples_per_step: int

    @property
    def round_throughputs(self) -> list[float]:
        return [samples / seconds for seconds, samples in self.rounds]

    @property
    def throughput(self) -> float:
        """Samples per second over the whole measured window."""
        return sum(s for _, s in self.rounds) / sum(t for t, _ in self.rounds)

    @property
    def step_times(self) -> list[float]:
        """Mean step time of each round (seconds)."""
        return [t / (s / self.samples_per_step) for t, s in self.rounds if s > 0]

    def summary(self) -> dict:
        steps = self.step_times
        return {"throughput": self.throughput, "round_throughputs": self.round_throughputs,
                "cv": coefficient_of_variation(self.round_throughputs),
                "step_time_median_s": statistics.median(steps) if steps else None,
                "step_time_cv": coefficient_of_variation(steps), "measured_s": sum(t for t, _ in self.rounds)}


def concurrent_aggregate(workers: Sequence[WorkerStats]) -> list[float]:
    """Aggregate throughput per round of workers that ran at the same time."""
    return [sum(rates) for rates in zip(*(w.round_throughputs for w in workers))]


def counted_aggregate(rounds: Sequence[list[Round]], serves: Sequence[bool]) -> list[float]:
    """Aggregate throughput per round of the workers a scenario counts (``scenario.counted``)."""
    training = [r for r, serving in zip(rounds, serves) if not serving] or list(rounds)
    return concurrent_aggregate([WorkerStats(list(r), 1) for r in training])


def sequential_aggregate(workers: Sequence[WorkerStats]) -> list[float]:
    """Aggregate throughput per round of jobs one after another, equal work each: N samples take sum(1/x_i) s."""
    return [len(workers) / sum(1.0 / x for x in rates) for rates in zip(*(w.round_throughputs for w in workers))]


def weighted_speedup(collocated: Sequence[float], alone: Sequence[float | None]) -> float | None:
    """Sum of each job's progress relative to running alone; for N identical jobs this is
    aggregate / single-job throughput. None when any job's alone throughput is unknown."""
    known = [a for a in alone if a is not None and a > 0]
    if not collocated or len(known) < len(alone):
        return None
    return sum(c / a for c, a in zip(collocated, known))


def seconds_per_sample(aggregate_rounds: Sequence[float]) -> list[float]:
    """pytest-benchmark's timing statistic: time per unit of work, so that its own
    --benchmark-compare-fail sees a throughput loss as a time increase."""
    return [1.0 / value for value in aggregate_rounds if value > 0]


def rounds_for_precision(aggregate_rounds: Sequence[float], precision: float) -> int:
    """How many rounds in all would bring the 95% confidence interval of the mean (log throughput) within
    ``precision`` (a fraction), judged from the rounds so far; 0 when it already is."""
    logs = [math.log(x) for x in aggregate_rounds if x > 0]
    if len(logs) < 2:
        return 2
    from scipy import special

    spread = statistics.stdev(logs)
    critical = special.stdtrit(len(logs) - 1, 0.975)
    if critical * spread / math.sqrt(len(logs)) <= math.log1p(precision):
        return 0
    return math.ceil((critical * spread / math.log1p(precision)) ** 2)


def stopped_rising(window_rates: Sequence[float], tolerance: float = 0.02) -> bool:
    """Warm-up is over when throughput has stopped rising (autotuning, allocator growth and clock ramp-up only
    make it faster): the last two windows are not faster than the two before them by more than ``tolerance``."""
    if len(window_rates) < 4:
        return False
    return statistics.fmean(window_rates[-2:]) <= statistics.fmean(window_rates[-4:-2]) * (1 + tolerance)


# No more rounds when the spread so far says that even this many times the most rounds would not reach the
# precision: the mean would be no better known at the most rounds (on H200s, 42 of 42 eager launch-bound
# scenarios that took 10 rounds would have needed 37 or more).
OUT_OF_REACH_FACTOR = 2


def enough_rounds(aggregate_rounds: Sequence[float], precision: float, most: int) -> tuple[str | None, int]:
    """Why no more rounds are needed (None while they are), and how many in all the precision (0: the most) needs."""
    done = len(aggregate_rounds)
    if precision <= 0:
        return ("most rounds reached" if done >= most else None), most
    needed = rounds_for_precision(aggregate_rounds, precision)
    if needed <= done:
        return f"precision {precision:.2%} reached", needed
    if done >= most:
        return "most rounds reached", needed
    if needed > OUT_OF_REACH_FACTOR * most:
        return f"precision {precision:.2%} out of reach (about {needed} rounds needed, at most {most})", needed
    return None, needed
