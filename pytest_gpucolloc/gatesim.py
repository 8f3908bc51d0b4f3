"""Synthetic histories for checking the gate: run means vary run to run, rounds vary within a run
(log-normal, as throughput noise is multiplicative)."""
from __future__ import annotations

import math
import random
import statistics

from .gate import Policy, RunSample, decide


def synthetic_run(rng: random.Random, run_id: str, level: float, within_cv: float, between_cv: float,
                  rounds: int) -> RunSample:
    run_level = level * math.exp(rng.gauss(0, between_cv))
    values = tuple(run_level * math.exp(rng.gauss(0, within_cv)) for _ in range(rounds))
    return RunSample(run_id, values, "NVIDIA H200", "GPU-sim", False, datetime=run_id)


def detection_rate(drop: float, within_cv: float, between_cv: float, *, rounds: int = 10, baseline_runs: int = 5,
                   trials: int = 1000, policy: Policy = Policy(), seed: int = 0) -> dict:
    """Share of trials the gate says 'regressed' when the current run is ``drop`` slower; and the
    median MDE it reported."""
    rng = random.Random(seed)
    flagged, mdes = 0, []
    for trial in range(trials):
        history = [synthetic_run(rng, f"{trial:05d}-{i}", 1000.0, within_cv, between_cv, rounds)
                   for i in range(baseline_runs)]
        current = synthetic_run(rng, f"{trial:05d}-z", 1000.0 * (1 - drop), within_cv, between_cv, rounds)
        verdict = decide(current, history, policy)
        flagged += verdict.failed
        mdes.append(verdict.mde)
    return {"rate": flagged / trials, "median_mde": statistics.median(mdes)}
