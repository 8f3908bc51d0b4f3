"""The regression decision: is this run's throughput lower than its history's, beyond noise?

Method (all in log throughput, so changes are ratios):
- each run is summarised by the mean of its rounds' log aggregate throughput (all rounds are used);
- the baseline is the last ``runs`` comparable runs (same scenario training the same jobs, same GPU model, the
  same physical GPU when it has enough history, not throttled);
- the spread of the baseline's run means carries both noise sources that matter: round-to-round noise
  *and* run-to-run noise (on the H200 machine runs of one job differed by 18% while rounds differed by 5-7%);
- the current run is a regression when it falls below the one-sided (1 - alpha) *prediction bound* of the
  baseline runs (Student t, K - 1 degrees of freedom: exact for normal run means, so an A/A run fails with
  probability alpha) **and** the drop is at least the threshold (minimum effect size);
- the minimum detectable effect (MDE) at ``power`` follows from the same spread; when it exceeds the
  threshold the verdict says so, and what would help (more rounds, or more baseline runs, or neither when
  run-to-run noise alone is too large).
"""
from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, field

# scipy is imported where a decision is computed: the option defaults below load with every pytest session.

DEFAULT_THRESHOLD = 0.02
DEFAULT_ALPHA = 0.005
DEFAULT_POWER = 0.95
DEFAULT_RUNS = 5
DEFAULT_MIN_RUNS = 3


@dataclass(frozen=True)
class Policy:
    threshold: float = DEFAULT_THRESHOLD  # smallest drop (fraction) that counts as a regression
    alpha: float = DEFAULT_ALPHA
    power: float = DEFAULT_POWER
    runs: int = DEFAULT_RUNS  # baseline: the most recent comparable runs
    min_runs: int = DEFAULT_MIN_RUNS


@dataclass(frozen=True)
class RunSample:
    """One scenario in one saved run."""

    run_id: str
    rounds: tuple[float, ...]  # aggregate throughput per round
    gpu_name: str | None = None
    gpu_uuid: str | None = None
    throttled: bool | None = None
    datetime: str = ""
    commit: str | None = None
    contaminated: bool = False
    config: dict = field(default_factory=dict)  # the GPU configuration that bounds performance (machine.BOUNDING)
    repeats: tuple[tuple[float, ...], ...] = ()  # rounds of each fresh-process repeat; () or one: a single set
    eager: bool = False  # GPU workloads without CUDA graphs (cuda_graph=True is a lever on launch noise)
    autotuned: bool = False  # convolutions whose algorithms cuDNN times in each process (cudnn_autotune)
    jobs: tuple[str, ...] = ()  # the workers' job labels, sorted (what is trained); () when not known

    @property
    def process_sets(self) -> tuple[tuple[float, ...], ...]:
        """Rounds grouped by the processes that measured them (one group per fresh-process repeat)."""
        return self.repeats if len(self.repeats) > 1 else (self.rounds,)

    @property
    def log_mean(self) -> float:
        """Mean log throughput with each set of processes weighted equally: the process is the unit."""
        return statistics.fmean(statistics.fmean(math.log(x) for x in rounds) for rounds in self.process_sets)

    @property
    def throughput(self) -> float:
        return math.exp(self.log_mean)

    @property
    def log_sd(self) -> float:
        """Round-to-round spread (log) within a set of processes, pooled over the sets."""
        variances = [statistics.variance([math.log(x) for x in rounds]) for rounds in self.process_sets
                     if len(rounds) > 1]
        return math.sqrt(statistics.fmean(variances)) if variances else 0.0


@dataclass
class Verdict:
    verdict: str  # regressed | improved | unchanged | inconclusive | no baseline | not comparable
    reason: str = ""
    baseline: float | None = None
    current: float | None = None
    change: float | None = None  # fraction, + is faster
    ci: tuple[float, float] | None = None  # of change, two-sided 1 - 2*alpha
    mde: float | None = None  # smallest drop detectable at the policy's alpha and power (and the threshold)
    mde_noise: float | None = None  # the same without the threshold: what the noise alone lets the test resolve
    threshold: float = DEFAULT_THRESHOLD
    baseline_runs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    noise: dict | None = None  # which level of noise dominates, and what would resolve the threshold

    @property
    def failed(self) -> bool:
        return self.verdict == "regressed"

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("verdict", "reason", "baseline", "current", "change", "ci", "mde",
                                                "mde_noise", "threshold", "baseline_runs", "notes", "noise")}


def choose_baseline(current: RunSample, history: list[RunSample], policy: Policy) -> tuple[list[RunSample], list[str]]:
    """Comparable runs, newest last, and notes on what was left out and why."""
    notes = []
    same_model = [r for r in history if r.gpu_name == current.gpu_name]
    if len(same_model) < len(history):
        others = sorted({r.gpu_name or "unknown GPU" for r in history if r.gpu_name != current.gpu_name})
        notes.append(f"{len(history) - len(same_model)} run(s) on other GPUs left out ({', '.join(others)})")
    same_jobs = [r for r in same_model if not (r.jobs and current.jobs and r.jobs != current.jobs)]
    if len(same_jobs) < len(same_model):
        others = sorted({" + ".join(r.jobs) for r in same_model if r.jobs and r.jobs != current.jobs})
        notes.append(f"{len(same_model) - len(same_jobs)} run(s) of other jobs under this test id left out "
                     f"({'; '.join(others)}; now {' + '.join(current.jobs)})")
    same_config = [r for r in same_jobs if not _config_differs(r, current)]
    if len(same_config) < len(same_jobs):
        notes.append(f"{len(same_jobs) - len(same_config)} run(s) under another GPU configuration left out "
                     f"({'; '.join(_config_changes(same_jobs, current))})")
    calm = [r for r in same_config if not r.throttled and not r.contaminated]
    if len(calm) < len(same_config):
        notes.append(f"{len(same_config) - len(calm)} throttled or contaminated run(s) left out")
    same_gpu = [r for r in calm if current.gpu_uuid and r.gpu_uuid == current.gpu_uuid]
    if len(same_gpu) >= policy.min_runs:
        chosen = same_gpu
    else:
        chosen = calm
        if calm and current.gpu_uuid and len(same_gpu) < len(calm):
            notes.append("baseline includes other GPUs of the same model (identical GPUs differ by a few percent)")
    chosen = sorted(chosen, key=lambda r: r.datetime)[-policy.runs:]
    return chosen, notes


def _config_differs(baseline: RunSample, current: RunSample) -> list[str]:
    from .machine import bounding_differences

    return bounding_differences(baseline.config, current.config)


def _config_changes(runs: list[RunSample], current: RunSample) -> list[str]:
    """Every way the runs' GPU configuration differs from the current run's, in words."""
    return sorted({change for run in runs for change in _config_differs(run, current)})


def _c4(k: int) -> float:
    """E[sample SD] / sigma for k normal values: turns the baseline's spread into an unbiased sigma."""
    return math.sqrt(2 / (k - 1)) * math.exp(math.lgamma(k / 2) - math.lgamma((k - 1) / 2))


@functools.lru_cache(maxsize=256)
def _unit_drop(k: int, alpha: float, power: float) -> float:
    """The log drop, in units of sigma, that the prediction-bound test catches with ``power``: the spread
    is itself estimated from k runs, so the test statistic follows a noncentral t."""
    from scipy import optimize, stats

    scale = math.sqrt(1 + 1 / k)
    critical = stats.t.ppf(1 - alpha, k - 1)

    def shortfall(drop: float) -> float:
        return stats.nct.cdf(-critical, k - 1, -drop / scale) - power

    return optimize.brentq(shortfall, 0.0, 1000.0)


def mde(spread: float, k: int, policy: Policy, with_threshold: bool = True) -> float:
    """Smallest drop (fraction) caught with probability ``power`` for a run-mean spread (log) measured
    over k runs. Without the threshold: what the noise alone lets the statistics resolve; with it, the
    drop must also be estimated at or above the threshold (the larger of the two requirements binds, so with
    a 2% threshold a drop of exactly 2% is caught about half the time)."""
    from scipy import stats

    sigma = spread / _c4(k)
    drop_log = _unit_drop(k, policy.alpha, policy.power) * sigma
    if with_threshold:
        needed = -math.log(1 - policy.threshold) + stats.norm.ppf(policy.power) * sigma * math.sqrt(1 + 1 / k)
        drop_log = max(drop_log, needed)
    return 1 - math.exp(-drop_log)


def decide(current: RunSample, history: list[RunSample], policy: Policy = Policy()) -> Verdict:
    from scipy import stats

    result = Verdict("unchanged", threshold=policy.threshold, current=current.throughput)
    if current.throttled:
        result.verdict, result.reason = "not comparable", "the GPU throttled during this run (not the power cap)"
        return result
    same_model = [r for r in history if r.gpu_name == current.gpu_name]
    if same_model and all(_config_differs(r, current) for r in same_model):
        result.verdict = "not comparable"
        result.reason = (f"the GPU's configuration differs from every baseline run's "
                         f"({'; '.join(_config_changes(same_model, current))}); compare runs made under one configuration")
        return result
    if current.contaminated:
        result.verdict, result.reason = "not comparable", "other processes used the GPU during this run"
        return result
    baseline, result.notes = choose_baseline(current, history, policy)
    result.baseline_runs = [r.run_id for r in baseline]
    needed = max(policy.min_runs, 2)  # a spread needs two runs at least
    if len(baseline) < needed:
        result.verdict = "no baseline"
        result.reason = (f"{len(baseline)} comparable run(s) in the history; the gate needs {needed} "
                         "to know the run-to-run spread")
        if baseline:
            result.baseline = math.exp(statistics.fmean(r.log_mean for r in baseline))
            result.change = current.throughput / result.baseline - 1
        return result

    means = [r.log_mean for r in baseline]
    k = len(means)
    centre = statistics.fmean(means)
    spread = statistics.stdev(means)
    scale = spread * math.sqrt(1 + 1 / k)
    d = current.log_mean - centre
    result.baseline = math.exp(centre)
    result.change = math.exp(d) - 1
    if scale > 0:
        half = stats.t.ppf(1 - policy.alpha, k - 1) * scale
        result.ci = (math.exp(d - half) - 1, math.exp(d + half) - 1)
        p_lower = stats.t.cdf(d / scale, k - 1)  # chance of a run this low if nothing changed
        p_higher = stats.t.sf(d / scale, k - 1)
    else:  # identical baseline runs: any difference is real
        result.ci = (result.change, result.change)
        p_lower = 0.0 if d < 0 else 1.0
        p_higher = 0.0 if d > 0 else 1.0
    result.mde = mde(spread, k, policy)
    result.mde_noise = resolvable = mde(spread, k, policy, with_threshold=False)
    result.noise = noise_levels(baseline, spread, policy, resolvable > policy.threshold)
    if p_lower < policy.alpha and -result.change >= policy.threshold:
        result.verdict = "regressed"
        result.reason = f"{-result.change:.1%} slower, beyond the baseline's run-to-run spread (p={p_lower:.2g})"
    elif p_higher < policy.alpha and result.change >= policy.threshold:
        result.verdict = "improved"
        result.reason = f"{result.change:.1%} faster (p={p_higher:.2g})"
    elif resolvable > policy.threshold:
        result.verdict = "inconclusive"
        result.reason = too_noisy(current, baseline, spread, policy)
    else:
        result.reason = (f"change within noise; drops of {result.mde:.1%} or more are caught (the noise alone "
                         f"resolves {resolvable:.1%}; the {policy.threshold:.0%} threshold sets the rest)")
    return result


MAX_USEFUL_ROUNDS = 1000  # beyond this, "more rounds" is not advice anyone can follow
MAX_BASELINE_RUNS = 30


def too_noisy(current: RunSample, baseline: list[RunSample], spread: float, policy: Policy) -> str:
    """Why the threshold cannot be resolved, and what would make it resolvable."""
    k = len(baseline)
    text = (f"too noisy for the {policy.threshold:.0%} threshold: with {k} baseline runs it can only catch drops of "
            f"{mde(spread, k, policy):.1%} or more")
    within = statistics.fmean(r.log_sd ** 2 for r in baseline)
    n = statistics.fmean(len(r.rounds) for r in baseline)
    between = max(spread ** 2 - within / n, 0.0)
    # the largest run-mean spread at which the statistics still resolve the threshold with k runs
    target = (-math.log(1 - policy.threshold) / _unit_drop(k, policy.alpha, policy.power) * _c4(k)) ** 2
    rounds = math.ceil(within / (target - between)) if target > between and within > 0 else None
    if rounds is not None and rounds <= MAX_USEFUL_ROUNDS:
        return text + f"; about {rounds} rounds per run (now {n:.0f}: --colloc-rounds={rounds}) would resolve it"
    sigma = spread / _c4(k)  # the same noise, measured over more baseline runs
    runs = next((m for m in range(k + 1, MAX_BASELINE_RUNS + 1)
                 if mde(sigma * _c4(m), m, policy, with_threshold=False) <= policy.threshold), None)
    more_runs = (f"about {runs} baseline runs would resolve it" if runs else
                 f"even {MAX_BASELINE_RUNS} baseline runs would not resolve it")
    more_rounds = (f"more rounds alone would need over {MAX_USEFUL_ROUNDS} per run" if rounds is not None
                   else "more rounds cannot help")
    return text + (f"; run-to-run spread {math.sqrt(between):.1%}, {more_rounds}; {more_runs}; "
                   "or steady the machine (CPU pinning, clocks), or raise the threshold")


def _variance(values: list[float]) -> float | None:
    return statistics.variance(values) if len(values) > 1 else None


def noise_levels(baseline: list[RunSample], spread: float, policy: Policy, too_noisy: bool) -> dict:
    """Where the baseline's noise lives, as shares of a run mean's variance: rounds within a process, processes
    within a run (measurable with fresh-process repeats), runs. And, when the threshold is out of reach, which
    lever would bring the detectable drop under it, with the numbers."""
    k = len(baseline)
    n = statistics.fmean(len(s) for r in baseline for s in r.process_sets)  # rounds per set of processes
    sets = statistics.fmean(len(r.process_sets) for r in baseline)  # sets of processes per run
    round_var = statistics.fmean(r.log_sd ** 2 for r in baseline)
    per_run = [_variance([statistics.fmean(math.log(x) for x in s) for s in r.process_sets]) for r in baseline]
    process_var = None
    if all(v is not None for v in per_run):
        process_var = max(statistics.fmean(per_run) - round_var / n, 0.0)
    run_var = max(spread ** 2 - (process_var or 0.0) / sets - round_var / (sets * n), 0.0)
    parts = {"rounds": round_var / (sets * n), "processes": None if process_var is None else process_var / sets,
             "runs": run_var}
    total = sum(v for v in parts.values() if v) or 1.0
    shares = {level: None if v is None else v / total for level, v in parts.items()}
    dominant = max((level for level in parts if parts[level] is not None), key=lambda level: parts[level])
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
            levers.append(f"more than {MAX_USEFUL_REPEATS} fresh-process repeats per run")
    if baseline[-1].eager:
        levers.append("cuda_graph=True (removes CPU launch noise at its source)")
    if dominant != "rounds" and baseline[-1].autotuned and not baseline[-1].eager:  # measured on graphed jobs
        levers.insert(0, 'options={"cudnn_autotune": False} (cuDNN\'s heuristics choose the same convolution '
                         "algorithms in every process)")
    runs = next((m for m in range(k + 1, MAX_BASELINE_RUNS + 1)
                 if mde(spread / _c4(k) * _c4(m), m, policy, with_threshold=False) <= policy.threshold), None)
    if runs:
        levers.append(f"{runs} baseline runs")
    result["lever"] = " or ".join(levers) if levers else "steady the machine (CPU pinning, clocks) or raise the threshold"
    return result


MAX_USEFUL_REPEATS = 1000
LEVER_MARGIN = 0.5  # a spread of 5 runs exceeds twice its true variance about 1 time in 11
