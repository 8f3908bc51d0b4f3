"""A collocation model: each job's share of its speed alone in a mix nobody measured, from the jobs' profiles alone
(pure: saved records in, numbers out; the advisor says them, always as predictions). The model, one per sharing mode,
fitted on every measured mix of the GPU model, and its held-out check: docs/advisor.md::

    share of job i = 1 / ((1 + overhead * (n - 1)) * max(1, demand, slice_weight * n * SM activity of job i alone)),
    demand = sm_weight * sum of the jobs' SM activity alone + dram_weight * sum of their DRAM bandwidth alone
             + graph_weight * number of CUDA-graphed jobs
"""
from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from .record import LAUNCH_BOUND_SM_ACTIVITY, ScenarioRecord

PREDICTED_MODES = ("naive", "mps", "mps-partitioned")  # the modes with measured mixes to fit (MIG: never run)
MEASURE_ABOVE = 0.15  # a kind of mix whose held-out median error is above this is measured, not predicted
MIN_HELD_OUT = 3  # fewer held-out mixes of a kind than this: too few to know the error, measured
INTERVAL_QUANTILE = 0.8  # the interval covers this share of the held-out errors of the mix's kind


@dataclass(frozen=True)
class Profile:
    """One job measured alone (medians over the times it was)."""
    label: str
    params: dict
    throughput: float
    sm_activity: float  # fraction of the SMs' time busy (GPM), 0-1
    dram_bandwidth: float | None  # fraction of the peak
    memory_bytes: int | None

    @property
    def graphed(self) -> bool:
        return bool(self.params.get("cuda_graph"))

    @property
    def launch_bound(self) -> bool:
        """Leaves the SMs mostly idle alone: the host issuing kernels sets its pace."""
        return self.sm_activity * 100 < LAUNCH_BOUND_SM_ACTIVITY


@dataclass(frozen=True)
class Observation:
    """One measured scenario of several jobs: each job's throughput over its throughput alone."""
    jobs: tuple[str, ...]
    mode: str
    shares: tuple[float, ...]

    @property
    def mix(self) -> tuple:
        return tuple(sorted(Counter(self.jobs).items()))


def _phase_of(scenario: ScenarioRecord, index: int) -> dict | None:
    """The telemetry of the phase worker ``index`` ran in (found by its process id; a one-job scenario's only one)."""
    pid = str(scenario.workers[index].other.get("pid"))
    found = next((t for t in scenario.telemetry if pid in (t.get("memory_bytes_by_pid") or {})), None)
    return found or (scenario.telemetry[0] if scenario.n_workers == 1 and scenario.telemetry else None)


def _usable(scenario: ScenarioRecord) -> bool:
    return scenario.device == "cuda" and not scenario.serving and not scenario.throttled


def median_of_known(values: list) -> float | None:
    known = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(known) if known else None


def profiles_of(scenarios: Iterable[ScenarioRecord]) -> dict[str, Profile]:
    """Each job measured alone with its telemetry (sequential scenarios, one job under naive), by label."""
    found: dict[str, list[tuple]] = defaultdict(list)  # (throughput, SM activity %, DRAM bandwidth %, memory)
    params: dict[str, dict] = {}
    for scenario in scenarios:
        alone = scenario.mode == "sequential" or (scenario.mode == "naive" and scenario.n_workers == 1)
        if not (alone and _usable(scenario)):
            continue
        for index, worker in enumerate(scenario.workers):
            phase = _phase_of(scenario, index)
            if phase and isinstance(phase.get("sm_activity_pct"), (int, float)):
                found[worker.workload].append((worker.throughput, phase["sm_activity_pct"],
                                               phase.get("dram_bw_util_pct"), worker.device_memory_bytes))
                params[worker.workload] = worker.params
    profiles = {}
    for label, seen in found.items():
        throughput, sm, dram, memory = (median_of_known(list(column)) for column in zip(*seen))
        profiles[label] = Profile(label, params[label], throughput or 0.0, (sm or 0.0) / 100,
                                  None if dram is None else dram / 100, None if memory is None else int(memory))
    return profiles


def observations_of(scenarios: Iterable[ScenarioRecord]) -> list[Observation]:
    """Every measured scenario of two or more training jobs under PREDICTED_MODES whose jobs' speeds alone are known."""
    found = []
    for scenario in scenarios:
        if scenario.n_workers < 2 or scenario.mode not in PREDICTED_MODES or not _usable(scenario):
            continue
        alone = [scenario.alone_of(i) for i in range(scenario.n_workers)]
        shares = tuple(w.throughput / a for w, a in zip(scenario.workers, alone) if a)
        if len(shares) == scenario.n_workers and all(0 < s < math.inf for s in shares):  # logs are fitted
            found.append(Observation(scenario.workloads, scenario.mode, shares))
    return found


@dataclass(frozen=True)
class ModeModel:
    mode: str
    overhead: float  # share lost per neighbour, before any resource is full
    sm_weight: float
    dram_weight: float
    graph_weight: float  # demand of one CUDA-graphed job's time slices
    slice_weight: float  # a job's own demand on its 1/n of the GPU, per unit of its SM activity alone
    mixes: int  # measured mixes it was fitted on

    def demand(self, jobs: list[Profile]) -> dict[str, float]:
        """The jobs' summed demand on the SMs, DRAM bandwidth and time slices (their sum 1: the GPU is full)."""
        return {"SMs": self.sm_weight * sum(p.sm_activity for p in jobs),
                "DRAM bandwidth": self.dram_weight * sum(p.dram_bandwidth or 0.0 for p in jobs),
                "graphed jobs' time slices": self.graph_weight * sum(p.graphed for p in jobs)}

    def slices(self, jobs: list[Profile]) -> list[float]:
        """Each job's demand on its own 1/n of the GPU (1: full)."""
        return [self.slice_weight * len(jobs) * p.sm_activity for p in jobs]

    def shares(self, jobs: list[Profile]) -> list[float]:
        common = max(1.0, sum(self.demand(jobs).values()))
        return [1 / ((1 + self.overhead * (len(jobs) - 1)) * max(common, own)) for own in self.slices(jobs)]

    def contended(self, jobs: list[Profile]) -> str:
        """The resource it expects the jobs to contend for, in words."""
        demand = self.demand(jobs)
        total, own = sum(demand.values()), max(self.slices(jobs))
        if max(total, own) <= 1:
            return f"none full (demand {total:.2f} of the GPU): a {self.overhead:.0%} loss per neighbour"
        if own > total:
            return f"each job's 1/{len(jobs)} of the GPU (the busiest job needs {own:.2f}x its slice)"
        return f"{max(demand, key=lambda k: demand[k])} (demand {total:.2f}x the GPU)"


def fit(observations: list[Observation], profiles: dict[str, Profile], mode: str) -> ModeModel | None:
    """The mode's model from its measured mixes (None: fewer than two mixes of profiled jobs)."""
    import numpy as np
    from scipy.optimize import least_squares

    rows = [o for o in observations if o.mode == mode and all(j in profiles for j in o.jobs)]
    if len({o.mix for o in rows}) < 2:
        return None
    unweighted = ModeModel(mode, 0.0, 1.0, 1.0, 1.0, 1.0, 0)  # its demand's terms: the sums over each job's mix
    n, sm, dram, graphed, own = np.array([(len(o.jobs), *unweighted.demand([profiles[k] for k in o.jobs]).values(),
                                           profiles[j].sm_activity) for o in rows for j in o.jobs], dtype=float).T
    measured = np.log(np.array([s for o in rows for s in o.shares]))

    def residuals(theta):
        common = np.maximum(1.0, theta[1] * sm + theta[2] * dram + theta[3] * graphed)
        return -np.log((1 + theta[0] * (n - 1)) * np.maximum(common, theta[4] * n * own)) - measured

    theta = least_squares(residuals, [0.05, 1.0, 1.0, 0.1, 0.5], bounds=([0] * 5, [np.inf] * 5), loss="soft_l1",
                          f_scale=0.1).x
    overhead, sm_weight, dram_weight, graph_weight, slice_weight = (float(t) for t in theta)
    return ModeModel(mode, overhead, sm_weight, dram_weight, graph_weight, slice_weight, len({o.mix for o in rows}))


def kind_of(jobs: list[Profile]) -> str:
    """The kind of mix the held-out errors are told by: CUDA graphs in it, a GPU-bound job in it, or neither."""
    if any(p.graphed for p in jobs):
        return "graphed"
    return "launch-bound" if all(p.launch_bound for p in jobs) else "GPU-bound"


@dataclass(frozen=True)
class HeldOut:
    """A measured mix left out of the fit and predicted: the speedup and each job's share, against the median of its
    measurements."""
    mix: tuple
    mode: str
    kind: str
    predicted: float
    measured: float
    predicted_shares: dict
    measured_shares: dict
    measurements: int

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured


def held_out(observations: list[Observation], profiles: dict[str, Profile], fit_on: list[Observation] | None = None,
             fit_profiles: dict[str, Profile] | None = None) -> list[HeldOut]:
    """Leave-one-mix-out: each measured mix of profiled jobs predicted by the model fitted on every other mix (of
    ``fit_on``, whose jobs' profiles are ``fit_profiles``, where given: another GPU's measurements)."""
    by_cell: dict[tuple, list[Observation]] = defaultdict(list)
    for o in observations:
        if all(j in profiles for j in o.jobs):
            by_cell[(o.mix, o.mode)].append(o)
    found = []
    for (mix, mode), measured in sorted(by_cell.items()):
        model = fit([o for o in (observations if fit_on is None else fit_on) if o.mix != mix],
                    profiles if fit_profiles is None else fit_profiles, mode)
        if model is None:
            continue
        jobs = list(measured[0].jobs)
        shares = model.shares([profiles[j] for j in jobs])
        each = {j: statistics.median(s for o in measured for job, s in zip(o.jobs, o.shares) if job == j) for j in jobs}
        found.append(HeldOut(mix, mode, kind_of([profiles[j] for j in jobs]), sum(shares),
                             statistics.median(sum(o.shares) for o in measured), dict(zip(jobs, shares)), each,
                             len(measured)))
    return found


@dataclass(frozen=True)
class Prediction:
    mode: str
    speedup: float | None  # None: not predicted (measure it)
    low: float | None
    high: float | None
    shares: dict  # job label -> share of its speed alone
    kind: str
    held_out_error: float | None  # median absolute relative error of this kind of mix under this mode, held out
    held_out_mixes: int
    contended: str
    fits_in_memory: bool | None
    why_not: str | None = None  # why it says "measure it" instead of a number


def predict(jobs: Counter, profiles: dict[str, Profile], observations: list[Observation],
            memory_total_bytes: int | None = None, checks: list[HeldOut] | None = None) -> list[Prediction]:
    """Each sharing mode's predicted share per job and speedup for ``jobs`` (every label profiled), with the
    held-out error of its kind of mix; a mode whose kind is predicted badly, or seldom measured, is left to measure."""
    mine = [profiles[label] for label, count in sorted(jobs.items()) for _ in range(count)]
    checks = held_out(observations, profiles) if checks is None else checks
    kind = kind_of(mine)
    used = [p.memory_bytes or 0 for p in mine]  # 0: not measured, and then fitting is not known
    fits = sum(used) <= memory_total_bytes if memory_total_bytes and all(used) else None
    found = []
    for mode in PREDICTED_MODES:
        model = fit(observations, profiles, mode)
        errors = sorted(abs(c.error) for c in checks if c.mode == mode and c.kind == kind)
        if model is None:
            found.append(Prediction(mode, None, None, None, {}, kind, None, 0, "-", fits, "no measured mixes"))
            continue
        shares = model.shares(mine)
        speedup = sum(shares)
        typical = statistics.median(errors) if errors else None
        why_not = None
        if len(errors) < MIN_HELD_OUT:
            why_not = f"{len(errors)} measured {kind} mix(es) under {mode}: too few to know the error"
        elif typical is not None and typical > MEASURE_ABOVE:
            why_not = f"{kind} mixes under {mode} are predicted {typical:.0%} off (held out)"
        spread = errors[min(len(errors) - 1, int(INTERVAL_QUANTILE * len(errors)))] if errors else 0.0
        found.append(Prediction(
            mode, None if why_not else speedup, None if why_not else speedup * (1 - spread),
            None if why_not else speedup * (1 + spread), {p.label: s for p, s in zip(mine, shares)}, kind,
            typical, len(errors), model.contended(mine), fits, why_not))
    return found


def ratio_error(checks: list[HeldOut], first: str, second: str, kind: str) -> tuple[float | None, int]:
    """How far the held-out prediction of ``first``'s speedup over ``second``'s missed the measured ratio (median
    relative error over this kind's mixes measured under both), and over how many mixes."""
    cells = {(c.mix, c.mode): c for c in checks if c.kind == kind}
    errors = [abs((a.predicted / b.predicted) / (a.measured / b.measured) - 1)
              for (mix, mode), a in cells.items() if mode == first and (b := cells.get((mix, second)))]
    return (statistics.median(errors) if errors else None), len(errors)


def within_error(found: list[Prediction], checks: list[HeldOut]) -> list[tuple[Prediction, float | None]]:
    """The predicted modes the model cannot tell from the best predicted one, best first, each with the held-out error
    of its ratio to the best: the predicted gap is within it (or too few mixes to know it). One: a clear best."""
    ranked = sorted((p for p in found if p.speedup), key=lambda p: -(p.speedup or 0.0))
    if not ranked:
        return []
    best = ranked[0]
    tied: list[tuple[Prediction, float | None]] = [(best, None)]
    for other in ranked[1:]:
        error, mixes = ratio_error(checks, best.mode, other.mode, best.kind)
        if error is None or mixes < MIN_HELD_OUT or (best.speedup or 0.0) / (other.speedup or 1.0) - 1 <= error:
            tied.append((other, error))
    return tied
