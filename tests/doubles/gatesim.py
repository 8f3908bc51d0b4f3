"""Synthetic histories for checking the gate: run means vary run to run, rounds vary within a run
(log-normal, as throughput noise is multiplicative); optionally disturbed and cold runs shaped like those
measured on H200s (docs/gate.md), and a fleet of GPUs whose levels differ."""
from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

from pytest_gpucolloc.gate import RunSample, decide
from pytest_gpucolloc.verdict import Policy

# A user's GPU-bound job on H200s (FIELD_NOTES): steady runs power-capped for 88-100% of the window; a disturbed
# run -9% with a 5.2% round CV and the cap for 4%; the first runs of a fresh machine ~3% low, capped 48-56%.
STEADY_CAP = (0.88, 1.0)


@dataclass(frozen=True)
class Disturbance:
    drop: float  # its level, below the steady runs'
    round_cv: float | None  # its round spread (None: the steady runs')
    cap: tuple[float, float]  # its power-cap share


DISTURBED = Disturbance(0.09, 0.052, (0.02, 0.06))
COLD = Disturbance(0.03, None, (0.48, 0.56))


def synthetic_run(rng: random.Random, run_id: str, level: float, within_cv: float, between_cv: float,
                  rounds: int, *, cap: tuple[float, float] | None = None, uuid: str = "GPU-sim") -> RunSample:
    run_level = level * math.exp(rng.gauss(0, between_cv))
    values = tuple(run_level * math.exp(rng.gauss(0, within_cv)) for _ in range(rounds))
    return RunSample(run_id, values, gpu_name="NVIDIA H200", gpu_uuid=uuid, throttled=False, datetime=run_id,
                     power_capped_share=rng.uniform(*cap) if cap else None)


def disturbed_run(rng: random.Random, run_id: str, level: float, within_cv: float, between_cv: float, rounds: int,
                  kind: Disturbance, telemetry: bool = True, uuid: str = "GPU-sim") -> RunSample:
    return synthetic_run(rng, run_id, level * (1 - kind.drop), kind.round_cv or within_cv, between_cv, rounds,
                         cap=kind.cap if telemetry else None, uuid=uuid)


def history(rng: random.Random, trial: int, runs: int, within_cv: float, between_cv: float, rounds: int, *,
            disturbed: int = 0, cold: int = 0, telemetry: bool = True) -> tuple[list[RunSample], set[str]]:
    """``runs`` baseline runs, oldest first: the first ``cold`` ones cold, ``disturbed`` ones at random places
    after them disturbed; and the ids of those injected."""
    places = set(rng.sample(range(cold, runs), disturbed))
    made, injected = [], set()
    for i in range(runs):
        run_id = f"{trial:05d}-{i:03d}"
        kind = COLD if i < cold else DISTURBED if i in places else None
        if kind:
            injected.add(run_id)
            made.append(disturbed_run(rng, run_id, 1000.0, within_cv, between_cv, rounds, kind, telemetry))
        else:
            made.append(synthetic_run(rng, run_id, 1000.0, within_cv, between_cv, rounds,
                                      cap=STEADY_CAP if telemetry else None))
    return made, injected


def detection_rate(drop: float, within_cv: float, between_cv: float, *, rounds: int = 10, baseline_runs: int = 5,
                   trials: int = 1000, policy: Policy = Policy(), seed: int = 0, disturbed: int = 0, cold: int = 0,
                   telemetry: bool = True) -> dict:
    """Share of trials the gate says 'regressed' when the current run is ``drop`` slower (the current run is
    steady: a disturbed one is measured again); the median MDE it reported; how often it named the injected
    disturbed and cold runs, and how often it left out a steady one."""
    rng = random.Random(seed)
    flagged, mdes, named, wrongly = 0, [], 0, 0
    for trial in range(trials):
        runs, injected = history(rng, trial, baseline_runs, within_cv, between_cv, rounds, disturbed=disturbed, cold=cold,
                       telemetry=telemetry)
        current = synthetic_run(rng, f"{trial:05d}-zzz", 1000.0 * (1 - drop), within_cv, between_cv, rounds,
                                cap=STEADY_CAP if telemetry else None)
        verdict = decide(current, runs, policy)
        flagged += verdict.failed
        if verdict.mde is not None:
            mdes.append(verdict.mde)
        named += injected <= set(verdict.left_out)
        wrongly += bool(set(verdict.left_out) - injected)
    return {"rate": flagged / trials, "median_mde": statistics.median(mdes) if mdes else None,
            "named": named / trials, "steady_left_out": wrongly / trials}
