"""What a baseline's noise lets the gate resolve: the smallest drop caught at the policy's power, where the noise lives
(rounds, processes, runs) and which lever (rounds, fresh-process repeats, baseline runs) would bring it under the
threshold. scipy is imported where a number is computed."""
from __future__ import annotations

import functools
import math
import statistics

from .verdict import Policy, RunSample, variance_of


def _c4(k: int) -> float:
    """E[sample SD] / sigma for k normal values: turns the baseline's spread into an unbiased sigma."""
    return math.sqrt(2 / (k - 1)) * math.exp(math.lgamma(k / 2) - math.lgamma((k - 1) / 2))


@functools.lru_cache(maxsize=256)
def _unit_drop(k: int, alpha: float, power: float, dof: int | None = None) -> float:
    """The log drop, in units of sigma, that the prediction-bound test catches with ``power``: the spread
    is itself estimated from k runs (``dof`` degrees of freedom, k - 1 by default), so the test statistic follows a
    noncentral t."""
    from scipy import special

    dof = k - 1 if dof is None else dof
    critical = special.stdtrit(dof, 1 - alpha)
    # the noncentrality at which the statistic falls below -critical with ``power`` is the drop over the scale:
    # scipy.special's inverse (cdflib, to about 1e-8), then secant steps on its CDF to the last digits
    low = float(special.nctdtrinc(dof, power, -critical))
    high = low * (1 + 1e-6)
    f_low, f_high = (special.nctdtr(dof, nc, -critical) - power for nc in (low, high))
    for _ in range(20):
        if f_high == f_low or abs(f_high) < 1e-14:
            break
        low, high, f_low = high, high - f_high * (high - low) / (f_high - f_low), f_high
        f_high = special.nctdtr(dof, high, -critical) - power
    return -high * math.sqrt(1 + 1 / k)


def mde(spread: float, k: int, policy: Policy, with_threshold: bool = True, dof: int | None = None) -> float:
    """Smallest drop (fraction) caught with probability ``power`` for a run-mean spread (log) measured
    over k runs. Without the threshold: what the noise alone lets the statistics resolve; with it, the
    drop must also be estimated at or above the threshold (the larger of the two requirements binds, so with
    a 2% threshold a drop of exactly 2% is caught about half the time)."""
    from scipy import special

    dof = k - 1 if dof is None else dof
    sigma = spread / _c4(dof + 1)
    drop_log = _unit_drop(k, policy.alpha, policy.power, dof) * sigma
    if with_threshold:
        needed = -math.log(1 - policy.threshold) + special.ndtri(policy.power) * sigma * math.sqrt(1 + 1 / k)
        drop_log = max(drop_log, needed)
    return 1 - math.exp(-drop_log)


MAX_USEFUL_ROUNDS = 1000  # beyond this, "more rounds" is not advice anyone can follow
MAX_BASELINE_RUNS = 30


def what_would_resolve(baseline: list[RunSample], spread: float, policy: Policy) -> str:
    """What would make a threshold the noise cannot resolve resolvable (to follow the verdict's reason)."""
    k = len(baseline)
    within = statistics.fmean(r.log_sd ** 2 for r in baseline)
    n = statistics.fmean(len(r.rounds) for r in baseline)
    between = max(spread ** 2 - within / n, 0.0)
    # the largest run-mean spread at which the statistics still resolve the threshold with k runs
    target = (-math.log(1 - policy.threshold) / _unit_drop(k, policy.alpha, policy.power) * _c4(k)) ** 2
    rounds = math.ceil(within / (target - between)) if target > between and within > 0 else None
    if rounds is not None and rounds <= MAX_USEFUL_ROUNDS:
        return f"; about {rounds} rounds per run (now {n:.0f}: --colloc-rounds={rounds}) would resolve it"
    sigma = spread / _c4(k)  # the same noise, measured over more baseline runs
    runs = next((m for m in range(k + 1, MAX_BASELINE_RUNS + 1)
                 if mde(sigma * _c4(m), m, policy, with_threshold=False) <= policy.threshold), None)
    more_runs = (f"about {runs} baseline runs would resolve it" if runs else
                 f"even {MAX_BASELINE_RUNS} baseline runs would not resolve it")
    more_rounds = (f"more rounds alone would need over {MAX_USEFUL_ROUNDS} per run" if rounds is not None
                   else "more rounds cannot help")
    # where the runs differ no more than their rounds say they would, the rounds are the noise, not the runs
    spread_said = (f"run-to-run spread {math.sqrt(between):.1%}" if between >= 0.1 * spread ** 2 else
                   f"the runs differ by their rounds' noise ({math.sqrt(within):.1%} a round)")
    return (f"; {spread_said}, {more_rounds}; {more_runs}; "
            "or steady the machine (CPU pinning, clocks), or raise the threshold")


def noise_levels(baseline: list[RunSample], spread: float, policy: Policy, too_noisy: bool) -> dict:
    """Where the baseline's noise lives, as shares of a run mean's variance: rounds within a process, processes
    within a run (measurable with fresh-process repeats), runs. And, when the threshold is out of reach, which
    lever would bring the detectable drop under it, with the numbers."""
    k = len(baseline)
    n = statistics.fmean(len(s) for r in baseline for s in r.process_sets)  # rounds per set of processes
    sets = statistics.fmean(len(r.process_sets) for r in baseline)  # sets of processes per run
    round_var = statistics.fmean(r.log_sd ** 2 for r in baseline)
    set_means = [[statistics.fmean(math.log(x) for x in s) for s in r.process_sets] for r in baseline]
    process_var = (max(statistics.fmean(variance_of(means) for means in set_means) - round_var / n, 0.0)
                   if all(len(means) > 1 for means in set_means) else None)
    run_var = max(spread ** 2 - (process_var or 0.0) / sets - round_var / (sets * n), 0.0)
    parts = {"rounds": round_var / (sets * n), "processes": None if process_var is None else process_var / sets,
             "runs": run_var}
    total = sum(v for v in parts.values() if v) or 1.0
    shares = {level: None if v is None else v / total for level, v in parts.items()}
    known = {level: v for level, v in parts.items() if v is not None}
    dominant = max(known, key=known.__getitem__)
    if dominant == "runs" and process_var is None:
        dominant = "processes or runs"  # without repeats the two cannot be told apart
    result = {"dominant": dominant, "shares": shares, "rounds_per_set": n, "sets_per_run": sets, "lever": None}
    if not too_noisy:
        return result
    # the run-mean variance at which the statistics resolve the threshold with k baseline runs, with a margin:
    # the spread of k runs is itself noisy, and advice that only works half the time is no advice
    target = LEVER_MARGIN * (-math.log(1 - policy.threshold) / _unit_drop(k, policy.alpha, policy.power) * _c4(k)) ** 2
    levers = []
    if dominant == "rounds":
        rest = run_var + (process_var or 0.0) / sets
        rounds = math.ceil(round_var / (sets * (target - rest))) if target > rest else None
        if rounds is not None and rounds <= MAX_USEFUL_ROUNDS:
            levers.append(f"{rounds} rounds per run (now {n:.0f}: --colloc-rounds={rounds})")
    elif dominant.startswith("processes"):
        # the other levels' share is small: repeats divide the variance between processes
        between = process_var if process_var is not None else run_var
        repeats = math.ceil((between + round_var / n) / target)
        if repeats <= MAX_USEFUL_REPEATS:
            assumption = "" if process_var is not None else " (if its run-to-run noise lives between processes)"
            levers.append(f"--colloc-repeats={max(repeats, 2)}{assumption}")
        else:
            levers.append(f"not by repeats (it would take over {MAX_USEFUL_REPEATS} fresh-process repeats per run)")
    if baseline[-1].eager:
        levers.append("cuda_graph=True (removes CPU launch noise at its source)")
    if dominant != "rounds" and baseline[-1].autotuned and not baseline[-1].eager:  # measured on graphed jobs
        levers.insert(0, 'options={"cudnn_autotune": False} (cuDNN\'s heuristics choose the same convolution '
                         "algorithms in every process)")
    runs = next((m for m in range(k + 1, MAX_BASELINE_RUNS + 1)
                 if mde(spread / _c4(k) * _c4(m), m, policy, with_threshold=False) <= policy.threshold), None)
    if runs:
        levers.append(f"{runs} baseline runs")
    result["lever"] = (" or ".join(levers) if levers
                       else "steady the machine (CPU pinning, clocks) or raise the threshold")
    return result


MAX_USEFUL_REPEATS = 50  # each repeat starts the workers afresh; beyond this a gated run takes hours per scenario
LEVER_MARGIN = 0.5  # a spread of 5 runs exceeds twice its true variance about 1 time in 11
