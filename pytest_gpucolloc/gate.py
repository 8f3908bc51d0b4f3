"""The regression decision: is this run's throughput lower than its history's, beyond noise?

Method (all in log throughput, so changes are ratios):
- each run is summarised by the mean of its rounds' log aggregate throughput (all rounds are used);
- the baseline is the scenario's current level: its comparable runs (same jobs, same GPU model and configuration,
  not throttled; the same physical GPU when it has enough history, else the model's other GPUs with each GPU's
  level estimated from scenarios both ran) since the last level shift (``changepoints``), at most ``runs``;
- disturbed runs are left out and named: a round spread far above the scenario's usual one, a power-cap share far
  below the others' (both blind to the run's level, so leaving them out does not bias the spread), and run levels
  that the other runs' own spread cannot explain (each run's externally studentised residual, Bonferroni);
- the spread of the kept runs' means carries both noise sources that matter: round-to-round noise
  *and* run-to-run noise (on the H200 machine runs of one job differed by 18% while rounds differed by 5-7%);
- the current run is a regression when it falls below the one-sided (1 - alpha) *prediction bound* of the
  kept runs (Student t, K - 1 degrees of freedom: an A/A run fails with probability alpha, checked by simulation
  with disturbed runs injected: tests/doubles/gatesim.py) **and** the drop is at least the threshold (minimum
  effect size);
- the minimum detectable effect (MDE) at ``power`` follows from the same spread; when it exceeds the
  threshold the verdict says so, and what would help (more rounds, or more baseline runs, or neither when
  run-to-run noise alone is too large).
A current run with a disturbed signature is named (``Verdict.disturbed``): the pytest gate measures it again.

A serving job's latency (lower is better) is judged by the same method at p50 and p99, beside its training
neighbours and alone at the same rate (its own yardstick: "it got slower" apart from "it suffers more from its
neighbours"), on each round's 1/latency (``history.latency_sample_of``): a rise beyond the noise and by at least the
threshold is a regression. The verdicts (``Verdict.latency`` of the scenario's) say it in ms and as changes of the
percentile (``Terms``). A saturated service is not judged on latency: it measured a queue that grew with the run's
length. A change the runs cannot resolve (the smallest one caught would be a halving of the throughput, a doubling
of a latency) is said to be so, not given as a number.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from dataclasses import KW_ONLY, dataclass, field, fields

from . import changepoints
from .machine import bounding_differences
from .outcome import Outcome

# scipy is imported where a decision is computed: the option defaults below load with every pytest session.

DEFAULT_THRESHOLD = 0.02
DEFAULT_ALPHA = 0.005
DEFAULT_POWER = 0.95
DEFAULT_RUNS = 30  # at most this many runs of the current level: as much comparable history as there is
DEFAULT_MIN_RUNS = 3
DEFAULT_REMEASURE = 1  # the pytest gate measures a disturbed run again this many times at most

# Disturbed runs. On H200s a user's GPU-bound job had steady runs with round CVs of 0.1-1.5% (within 4x of the
# median run's) and power-capped for 88-100% of the window; a disturbed run had a 5.2% round CV and the cap for
# 4%, cold first runs 48-56%. The two rules below look at a run's own signature, never at its level.
ROUND_SPREAD_RATIO = 5.0  # a run whose round spread exceeds this many times the scenario's median run's
CAP_SHARE_DROP = 0.3  # a run that held the power cap this much less of its window than the median run ...
CAP_SHARE_USUAL = 0.5  # ... of a scenario whose runs usually hold it at least this much (GPU-bound at the cap)
# The chance that a steady history loses a run to the level rule (Bonferroni over its runs). At 0.01 the A/A
# false alarms of 5 launch-bound runs rose from 0.60% to 0.74% (nominal 0.5%; 8,000 trials): what is left
# after an exclusion spreads less than a normal sample; at 0.001, 0.63%.
OUTLIER_ALPHA = 0.001


@dataclass(frozen=True)
class Policy:
    threshold: float = DEFAULT_THRESHOLD  # smallest drop (fraction) that counts as a regression
    alpha: float = DEFAULT_ALPHA
    power: float = DEFAULT_POWER
    runs: int = DEFAULT_RUNS  # baseline: the most recent comparable runs
    min_runs: int = DEFAULT_MIN_RUNS


def _variance_of(values: list[float]) -> float:
    """Sample variance in floating point (statistics.variance computes exactly, in fractions: slow)."""
    centre = math.fsum(values) / len(values)
    return math.fsum((x - centre) ** 2 for x in values) / (len(values) - 1)


@dataclass(frozen=True)
class RunSample:
    """One scenario in one saved run."""

    run_id: str
    rounds: tuple[float, ...]  # aggregate throughput per round
    _: KW_ONLY  # the rest by name: many same-typed fields, a wrong position would pass silently
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
    power_capped_share: float | None = None  # share of the measurement window at the power cap (telemetry)
    latency: str | None = None  # rounds hold a serving job's 1/latency (1/ms) at this percentile ("p50", "alone p99")
    saturated: str | None = None  # why the serving job could not keep up with its rate (a latency sample)

    @property
    def process_sets(self) -> tuple[tuple[float, ...], ...]:
        """Rounds grouped by the processes that measured them (one group per fresh-process repeat)."""
        return self.repeats if len(self.repeats) > 1 else (self.rounds,)

    @functools.cached_property  # read many times per decision
    def log_mean(self) -> float:
        """Mean log throughput with each set of processes weighted equally: the process is the unit."""
        return statistics.fmean(statistics.fmean(math.log(x) for x in rounds) for rounds in self.process_sets)

    @property
    def throughput(self) -> float:
        return math.exp(self.log_mean)

    @functools.cached_property
    def log_sd(self) -> float:
        """Round-to-round spread (log) within a set of processes, pooled over the sets."""
        variances = [_variance_of([math.log(x) for x in rounds]) for rounds in self.process_sets if len(rounds) > 1]
        return math.sqrt(statistics.fmean(variances)) if variances else 0.0


@dataclass(frozen=True)
class Terms:
    """How a verdict says what it judges. A sample is higher-is-better (throughput, or a serving job's 1/p99): the
    statistics never differ, only the numbers shown and the words."""

    metric: str  # "throughput" (samples/s) or a latency percentile ("p50", "alone p99"; ms)
    worse: str  # a change for the worse, after its size
    better: str
    drops: str  # what the detectable change is a change of
    noise: str  # whose noise sets what the statistics resolve
    inverse: bool  # the sample holds 1 / what is shown

    def value(self, sample_value: float) -> float:
        return 1 / sample_value if self.inverse else sample_value

    def change(self, sample_change: float) -> float:
        """A change (fraction) of what is shown, from the sample's."""
        return 1 / (1 + sample_change) - 1 if self.inverse else sample_change

    def detectable(self, sample_drop: float) -> float:
        """The smallest change for the worse caught, from the sample's smallest drop (a latency: 1/(1-drop)-1)."""
        return 1 / (1 - sample_drop) - 1 if self.inverse else sample_drop

    def level(self, sample_change: float) -> str:
        """A level's change in a note, e.g. ``+5.0%`` or ``p99 +5.0%``."""
        return f"{self.metric + ' ' if self.inverse else ''}{self.change(sample_change):+.1%}"


THROUGHPUT = Terms("throughput", "slower", "faster", "drops", "the noise alone", inverse=False)


def latency_terms(metric: str) -> Terms:
    return Terms(metric, f"higher {metric} latency", f"lower {metric} latency", f"{metric} rises",
                 f"the {metric} latency's own noise", inverse=True)


def terms_of(sample: RunSample) -> Terms:
    return latency_terms(sample.latency) if sample.latency else THROUGHPUT


@dataclass(kw_only=True)
class Verdict:
    verdict: Outcome
    reason: str = ""
    baseline: float | None = None
    current: float | None = None
    change: float | None = None  # fraction, + is faster (of a latency verdict: + is a higher latency)
    ci: tuple[float, float] | None = None  # of change, two-sided 1 - 2*alpha
    mde: float | None = None  # smallest drop (latency: rise) detectable at the policy's alpha and power, and threshold
    mde_noise: float | None = None  # the same without the threshold: what the noise alone lets the test resolve
    threshold: float = DEFAULT_THRESHOLD
    baseline_runs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    noise: dict | None = None  # which level of noise dominates, and what would resolve the threshold
    left_out: dict[str, str] = field(default_factory=dict)  # disturbed runs of the history -> why
    disturbed: str | None = None  # why the current run itself looks disturbed (the pytest gate measures it again)
    remeasured: list[str] = field(default_factory=list)  # why each earlier measurement of this run was taken again
    fleet: str | None = None  # how runs on other GPUs of the model entered the baseline, when they did
    metric: str = "throughput"  # what is judged: "throughput" (baseline, current in samples/s) or a latency (ms)
    latency: dict[str, Verdict] = field(default_factory=dict)  # a serving job's, by metric (``with_latency``)

    @property
    def failed(self) -> bool:
        """Regressed: its throughput, or a latency of its serving job."""
        return self.verdict == "regressed" or any(v.failed for v in self.latency.values())

    def to_dict(self) -> dict:
        """As saved (a record's ``gate``) and printed."""
        saved = {f.name: getattr(self, f.name) for f in fields(self)}
        saved["latency"] = {metric: verdict.to_dict() for metric, verdict in self.latency.items()}
        return saved

    @classmethod
    def from_dict(cls, saved: dict) -> Verdict:
        """A saved verdict (a record's ``gate``, already checked by ``record.read``) as an object again."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in saved.items() if k in known}
        if values.get("ci") is not None:
            values["ci"] = tuple(values["ci"])  # JSON keeps a list
        latency = dict(values.get("latency") or {})
        if saved.get("p99") is not None:  # saved before the latency was judged at several percentiles
            latency.setdefault("p99", saved["p99"])
        values["latency"] = {metric: cls.from_dict(verdict) for metric, verdict in latency.items()}
        return cls(**values)


def with_latency(verdict: Verdict, latency: Verdict) -> Verdict:
    """The scenario's verdict carrying a latency verdict of its serving job, named in its notes too (a table of one
    row per scenario still says it)."""
    verdict.latency[latency.metric] = latency
    if latency.change is not None and latency.baseline is not None and latency.current is not None:
        said = f" ({latency.change:+.1%}: {latency.baseline:.3g} -> {latency.current:.3g} ms)"
    else:
        said = f": {latency.reason}"
    verdict.notes.append(f"{latency.metric} latency {latency.verdict}{said}")
    return verdict


def _comparable(current: RunSample, history: list[RunSample]) -> tuple[list[RunSample], list[str]]:
    """Runs of the same jobs on the same GPU model and configuration, not throttled, and notes on the rest."""
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
    served = [r for r in calm if not r.saturated]
    if len(served) < len(calm):
        notes.append(f"{len(calm) - len(served)} saturated run(s) left out (their latency was a growing queue's)")
    return served, notes


@dataclass(frozen=True)
class MachineLevel:
    """This GPU's level against another GPU of its model (log), from scenarios measured on both."""

    offset: float  # add to a run on the other GPU to read it at this GPU's level
    variance: float  # what reading the judged scenario at ``offset`` may be off by (log, squared)
    scenarios: int


MIN_SHARED = 2  # scenarios that place a GPU: one cannot say whether the others move as it does


def machine_levels(current: RunSample, references) -> dict[str, MachineLevel]:
    """Per other GPU (UUID) of the current run's model: this GPU's level relative to it, estimated from
    ``references``, pairs of (another scenario's run on this GPU, that scenario's history): the mean over the
    scenarios both GPUs ran of (its run here - its mean there). Scenarios do not all move alike between two machines
    (on two H200s a GPU-bound transformer ran at one level where an LSTM paced by its host differed by 2-4%): the
    spread of the shared scenarios' offsets is what the judged scenario's own offset may differ by, so at least
    ``MIN_SHARED`` are needed, and that spread widens the bound."""
    found: dict[str, list[tuple[float, float]]] = {}
    for here, saved in references:
        if here.gpu_uuid != current.gpu_uuid or here.throttled or here.contaminated:
            continue
        comparable, _ = _comparable(here, saved)
        by_gpu: dict[str, list[float]] = {}
        for run in comparable:
            if run.gpu_uuid and run.gpu_uuid != current.gpu_uuid:
                by_gpu.setdefault(run.gpu_uuid, []).append(run.log_mean)
        for gpu, means in by_gpu.items():
            if len(means) >= 2:  # its own spread is needed to know how well it places the GPU
                noise = _variance_of(means)
                found.setdefault(gpu, []).append((here.log_mean - statistics.fmean(means),
                                                  noise * (1 + 1 / len(means))))
    levels = {}
    for gpu, pairs in found.items():
        if len(pairs) < MIN_SHARED:
            continue
        offsets, k = [d for d, _ in pairs], len(pairs)
        # the offsets' spread holds the references' run noise and how unalike scenarios move (at least the noise);
        # the judged scenario's own offset differs from their mean by that much, plus the mean's own error
        spread = max(_variance_of(offsets), statistics.fmean(v for _, v in pairs))
        levels[gpu] = MachineLevel(statistics.fmean(offsets), spread * (1 + 1 / k), k)
    return levels


@dataclass(frozen=True)
class Placement:
    """How other GPUs' runs were read at the current GPU's level: what that may be off by, and how many scenarios
    placed it (None: the baseline is this GPU's own runs, nothing was placed)."""

    variance: float = 0.0  # log, squared: added to the baseline centre's uncertainty
    shared: int | None = None

    def dof(self, k: int) -> int:
        """Degrees of freedom of the test on k baseline runs: the placement's spread is estimated from ``shared``
        offsets, so with few of them the test has fewer (a t on k - 1 would call machines' differences changes)."""
        return k - 1 if self.shared is None else max(1, min(k - 1, self.shared - 1))


def choose_baseline(current: RunSample, history: list[RunSample], policy: Policy,
                    references=()) -> tuple[list[RunSample], list[str], Placement | None, str | None]:
    """Comparable runs, newest last, at the current GPU's level; notes on what was left out and why; how other
    GPUs' runs were placed at this one's level (None: their level relative to this GPU is unknown); and how other
    GPUs' runs were used, in words."""
    calm, notes = _comparable(current, history)
    same_gpu = [r for r in calm if current.gpu_uuid and r.gpu_uuid == current.gpu_uuid]
    if len(same_gpu) >= policy.min_runs or not current.gpu_uuid or len(same_gpu) == len(calm):
        return sorted(calm if not current.gpu_uuid else same_gpu, key=lambda r: r.datetime), notes, Placement(), None
    levels = machine_levels(current, references)
    adjusted = [_at_level(r, levels[r.gpu_uuid].offset) for r in calm if r.gpu_uuid in levels]
    if len(same_gpu) + len(adjusted) < policy.min_runs:
        others = len({r.gpu_uuid for r in calm}) - bool(same_gpu)
        fleet = (f"other GPUs of this model ({others}), not adjusted: fewer than {MIN_SHARED} scenarios shared with "
                 "this GPU")
        return sorted(calm, key=lambda r: r.datetime), notes, None, fleet
    unplaced = len(calm) - len(same_gpu) - len(adjusted)
    if unplaced:
        notes.append(f"{unplaced} run(s) on GPUs that share fewer than {MIN_SHARED} scenarios with this one left out "
                     "(their level is unknown)")
    used = {r.gpu_uuid for r in calm if r.gpu_uuid in levels}
    runs = [r for r in calm if r.gpu_uuid in used]
    mean_offset = statistics.fmean(levels[g].offset for r in runs if (g := r.gpu_uuid) is not None)
    shared = min(levels[g].scenarios for g in used)
    fleet = (f"other GPUs of this model ({len(used)}), level adjusted by "
             f"{terms_of(current).level(math.exp(mean_offset) - 1)} from "
             f"{shared}{'+' if any(levels[g].scenarios > shared for g in used) else ''} shared scenario(s)")
    chosen = sorted(same_gpu + adjusted, key=lambda r: r.datetime)
    # each GPU's offset moves the centre by its share of the runs; the offsets share this GPU's reference runs and
    # the judged scenario's own way of moving, so their errors are taken as one (a weighted mean, not of squares)
    share = {g: sum(r.gpu_uuid == g for r in chosen) / len(chosen) for g in used}
    return chosen, notes, Placement(sum(share[g] * levels[g].variance for g in used), shared), fleet


def _at_level(run: RunSample, offset: float) -> RunSample:
    factor = math.exp(offset)
    return dataclasses.replace(run, rounds=tuple(x * factor for x in run.rounds),
                               repeats=tuple(tuple(x * factor for x in r) for r in run.repeats))


def power_cap_share(telemetry) -> float | None:
    """A run's share of its measurement windows at the power cap (mean over its phases), if recorded."""
    shares = [t["power_capped_share"] for t in telemetry
              if isinstance(t, dict) and isinstance(t.get("power_capped_share"), (int, float))]
    return statistics.fmean(shares) if shares else None


@dataclass(frozen=True)
class Usual:
    """A scenario's usual run: the median run's round spread and power-cap share (None: not known)."""

    spread: float | None
    cap: float | None

    @classmethod
    def of(cls, runs: list[RunSample]) -> Usual:
        spreads = [r.log_sd for r in runs if r.log_sd > 0]
        spread = statistics.median(spreads) if len(spreads) >= 2 else None
        # the usual share at the cap, of the runs whose rounds were usual (a disturbed run is rarely capped)
        caps = [r.power_capped_share for r in runs if r.power_capped_share is not None
                and not (spread and r.log_sd > ROUND_SPREAD_RATIO * spread)]
        return cls(spread, statistics.median(caps) if len(caps) >= 2 else None)


def signature(run: RunSample, usual: Usual) -> str | None:
    """Why a run looks disturbed by its own signature against the scenario's usual run (None: it does not).
    Blind to the run's level: a run is never left out for being slow or fast."""
    if usual.spread and run.log_sd > ROUND_SPREAD_RATIO * usual.spread:
        return f"round spread {run.log_sd:.1%}, {run.log_sd / usual.spread:.0f}x the usual {usual.spread:.2%}"
    if usual.cap is not None and run.power_capped_share is not None and usual.cap >= CAP_SHARE_USUAL \
            and run.power_capped_share <= usual.cap - CAP_SHARE_DROP:
        return (f"power cap {run.power_capped_share:.0%} of the window, usually {usual.cap:.0%} "
                "(a cold GPU, or waiting on something else)")
    return None


def level_outliers(means: list[float], alpha: float = OUTLIER_ALPHA, keep: int = 3) -> dict[int, float]:
    """Runs whose level the others' spread cannot explain -> their deviation (log). Each run against the mean and
    spread of the others (its externally studentised residual: Student t with k - 2 degrees of freedom when the
    runs are alike), Bonferroni over the k runs at ``alpha``; the most extreme is removed first and the rest
    tested again, while more than ``keep`` runs remain and the others have a spread to judge by."""
    import numpy as np
    from scipy import stats

    kept = list(range(len(means)))
    found: dict[int, float] = {}
    while len(kept) > max(keep, 3):
        k = len(kept)
        values = np.asarray([means[i] for i in kept])
        values = values - values.mean()  # centred: the sums of squares below stay exact for tiny spreads
        others = (values.sum() - values) / (k - 1)  # each run's others: their mean and spread
        sd = np.sqrt(np.maximum(((values ** 2).sum() - values ** 2 - (k - 1) * others ** 2) / (k - 2), 0.0))
        deviation = values - others
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(sd > 0, np.abs(deviation) / (sd * math.sqrt(1 + 1 / (k - 1))),
                         np.where(deviation != 0, np.inf, 0.0))
        p = 2 * stats.t.sf(t, k - 2)
        worst = int(np.argmin(p))
        if p[worst] * k >= alpha:
            break
        found[kept[worst]] = float(deviation[worst])
        del kept[worst]
    return found


def robust_baseline(current: RunSample, chosen: list[RunSample], policy: Policy
                    ) -> tuple[list[RunSample], dict[str, str], list[str]]:
    """The runs the decision stands on: disturbed runs left out (run id -> why), the level since the last shift,
    at most ``policy.runs`` of it; notes on what else was left out."""
    notes: list[str] = []
    terms = terms_of(current)
    usual = Usual.of(chosen)
    left_out = {r.run_id: why for r in chosen if (why := signature(r, usual))}
    steady = [r for r in chosen if r.run_id not in left_out]
    start = changepoints.level_start([r.log_mean for r in steady], min_runs=max(policy.min_runs, 2))
    if start:
        before, after = steady[:start], steady[start:]
        shift = statistics.fmean(r.log_mean for r in after) - statistics.fmean(r.log_mean for r in before)
        notes.append(f"{start} run(s) before the level shift at {steady[start].run_id} left out "
                     f"({terms.level(math.exp(shift) - 1)})")
    level = steady[start:]
    if len(level) > policy.runs:
        notes.append(f"{len(level) - policy.runs} older run(s) of this level left out (at most {policy.runs})")
        level = level[-policy.runs:]
    outliers = level_outliers([r.log_mean for r in level], keep=max(policy.min_runs, 2))
    for i, deviation in outliers.items():
        left_out[level[i].run_id] = (f"level {terms.level(math.exp(deviation) - 1)} from the other runs, "
                                     "beyond their spread")
    kept = [r for i, r in enumerate(level) if i not in outliers]
    return kept, left_out, notes


def _config_differs(baseline: RunSample, current: RunSample) -> list[str]:
    return bounding_differences(baseline.config, current.config)


def _config_changes(runs: list[RunSample], current: RunSample) -> list[str]:
    """Every way the runs' GPU configuration differs from the current run's, in words."""
    return sorted({change for run in runs for change in _config_differs(run, current)})


def _c4(k: int) -> float:
    """E[sample SD] / sigma for k normal values: turns the baseline's spread into an unbiased sigma."""
    return math.sqrt(2 / (k - 1)) * math.exp(math.lgamma(k / 2) - math.lgamma((k - 1) / 2))


@functools.lru_cache(maxsize=256)
def _unit_drop(k: int, alpha: float, power: float, dof: int | None = None) -> float:
    """The log drop, in units of sigma, that the prediction-bound test catches with ``power``: the spread
    is itself estimated from k runs (``dof`` degrees of freedom, k - 1 by default), so the test statistic follows a
    noncentral t."""
    from scipy import optimize, stats

    dof = k - 1 if dof is None else dof
    scale = math.sqrt(1 + 1 / k)
    critical = stats.t.ppf(1 - alpha, dof)

    def shortfall(drop: float) -> float:
        return stats.nct.cdf(-critical, dof, -drop / scale) - power

    return optimize.brentq(shortfall, 0.0, 1000.0)


def mde(spread: float, k: int, policy: Policy, with_threshold: bool = True, dof: int | None = None) -> float:
    """Smallest drop (fraction) caught with probability ``power`` for a run-mean spread (log) measured
    over k runs. Without the threshold: what the noise alone lets the statistics resolve; with it, the
    drop must also be estimated at or above the threshold (the larger of the two requirements binds, so with
    a 2% threshold a drop of exactly 2% is caught about half the time)."""
    from scipy import stats

    dof = k - 1 if dof is None else dof
    sigma = spread / _c4(dof + 1)
    drop_log = _unit_drop(k, policy.alpha, policy.power, dof) * sigma
    if with_threshold:
        needed = -math.log(1 - policy.threshold) + stats.norm.ppf(policy.power) * sigma * math.sqrt(1 + 1 / k)
        drop_log = max(drop_log, needed)
    return 1 - math.exp(-drop_log)


def decide(current: RunSample, history: list[RunSample], policy: Policy = Policy(), references=()) -> Verdict:
    """``references``: pairs of (another scenario's run on the current GPU, that scenario's history), from which
    this GPU's level is estimated when it has too little history of its own (``machine_levels``).

    A latency sample (``current.latency``) is judged on its 1/latency with the threshold a rise of the latency by
    ``policy.threshold`` (a drop of 1/latency by threshold / (1 + threshold)); the verdict is said in ms and as
    changes of the latency."""
    terms = terms_of(current)
    result = Verdict(verdict="unchanged", threshold=policy.threshold, current=current.throughput, metric=terms.metric)
    served = [r for r in _comparable(current, history)[0] if r.gpu_uuid == current.gpu_uuid] \
        if current.saturated else []
    if current.saturated and len(served) >= policy.min_runs:  # it kept up before, on this GPU: the worst regression
        result.verdict = "regressed"
        result.baseline_runs = [r.run_id for r in served[-policy.runs:]]
        result.reason = (f"the service saturated ({current.saturated}) at the rate its last "
                         f"{len(result.baseline_runs)} runs on this GPU served without a queue: it can no longer "
                         "keep up")
        result.disturbed = "its service saturated where earlier runs kept up"  # a stall, or slower: measured again
    elif current.saturated:
        result.verdict = "not comparable"
        result.reason = (f"latency not judged: the service was saturated ({current.saturated}); its latency measured "
                         "a queue that grew with the run's length, not the service: judge it at a rate it can serve")
    else:
        rise = policy.threshold  # of a latency: a drop of 1/latency by rise / (1 + rise)
        judged = dataclasses.replace(policy, threshold=rise / (1 + rise)) if terms.inverse else policy
        _decide(result, current, history, judged, references, terms)
        unresolvable(result, terms)
    if terms.inverse:  # what the statistics saw as 1/latency, said as latency
        result.current = terms.value(current.throughput)
        result.baseline = None if result.baseline is None else terms.value(result.baseline)
        result.change = None if result.change is None else terms.change(result.change)
        result.ci = None if result.ci is None else (terms.change(result.ci[1]), terms.change(result.ci[0]))
        result.mde = None if result.mde is None else terms.detectable(result.mde)
        result.mde_noise = None if result.mde_noise is None else terms.detectable(result.mde_noise)
    return result


UNRESOLVABLE_DROP = 0.5  # a detectable drop this large (a latency: a doubling) is no number to give a reader


def unresolvable(result: Verdict, terms: Terms) -> None:
    """An inconclusive verdict whose runs could only catch a halving (a latency's doubling) says so in words: its
    interval and detectable change would be numbers the data cannot stand behind (``+21309%``)."""
    if result.verdict != "inconclusive" or result.mde_noise is None or result.mde_noise < UNRESOLVABLE_DROP:
        return
    runs = len(result.baseline_runs)
    advice = result.reason.split("; ", 1)[1] if "; " in result.reason else "steady the scenario or save more runs"
    result.reason = (f"not resolvable with {runs} baseline run{'s' * (runs != 1)}: they spread so much that only "
                     f"{'a doubling' if terms.inverse else 'a halving'} or more would be caught; {advice}")
    result.ci = result.mde = result.mde_noise = None


def _decide(result: Verdict, current: RunSample, history: list[RunSample], policy: Policy, references,
            terms: Terms) -> None:
    """``decide`` in the sample's own terms (higher is better), into ``result``; its reasons in ``terms``."""
    from scipy import stats

    if current.throttled:
        result.verdict, result.reason = "not comparable", "the GPU throttled during this run (not the power cap)"
        return
    same_model = [r for r in history if r.gpu_name == current.gpu_name]
    if same_model and all(_config_differs(r, current) for r in same_model):
        result.verdict = "not comparable"
        result.reason = (f"the GPU's configuration differs from every baseline run's "
                         f"({'; '.join(_config_changes(same_model, current))}); "
                         "compare runs made under one configuration")
        return
    if current.contaminated:
        result.verdict, result.reason = "not comparable", "other processes used the GPU during this run"
        return
    chosen, result.notes, placement, result.fleet = choose_baseline(current, history, policy, references)
    if result.fleet:
        result.notes.append(result.fleet)
    result.disturbed = signature(current, Usual.of(chosen))
    if result.disturbed:
        result.notes.append(f"this run looks disturbed: {result.disturbed}")
    baseline, result.left_out, more = robust_baseline(current, chosen, policy)
    result.notes += more
    if result.left_out:
        result.notes.append(f"{len(result.left_out)} disturbed run(s) left out: "
                            + "; ".join(f"{run} ({why})" for run, why in result.left_out.items()))
    result.baseline_runs = [r.run_id for r in baseline]
    needed = max(policy.min_runs, 2)  # a spread needs two runs at least
    if placement is None:  # identical GPUs differ by up to 15% (H200s): a level from other GPUs decides nothing
        own = sum(r.gpu_uuid == current.gpu_uuid for r in history)
        result.verdict = "no baseline"
        result.reason = (f"{own} comparable run(s) on this GPU (the gate needs {needed}) and fewer than "
                         f"{MIN_SHARED} scenarios measured both here and on the other GPUs of this model whose runs "
                         f"are saved, so this GPU's level is unknown: gate {MIN_SHARED} or more scenarios that ran "
                         "on them earlier in the same session (their levels place this GPU), or save runs on this GPU")
        if terms.inverse:  # no other scenario's latency places this GPU (``references`` are of throughput)
            result.reason = (f"{own} comparable run(s) on this GPU (the gate needs {needed}); latency is judged "
                             "against runs on this GPU only (GPUs of one model differ): save runs on this GPU")
        if baseline:
            result.baseline = math.exp(statistics.fmean(r.log_mean for r in baseline))
            result.change = current.throughput / result.baseline - 1
        return
    if len(baseline) < needed:
        result.verdict = "no baseline"
        result.reason = (f"{len(baseline)} comparable run(s) in the history; the gate needs {needed} "
                         "to know the run-to-run spread")
        if baseline:
            result.baseline = math.exp(statistics.fmean(r.log_mean for r in baseline))
            result.change = current.throughput / result.baseline - 1
        return

    means = [r.log_mean for r in baseline]
    k = len(means)
    centre = statistics.fmean(means)
    # the spread of the runs, plus what placing other GPUs at this one's level may be off by (0 on one GPU)
    spread = math.sqrt(_variance_of(means) + placement.variance / (1 + 1 / k))
    scale = spread * math.sqrt(1 + 1 / k)
    dof = placement.dof(k)
    d = current.log_mean - centre
    result.baseline = math.exp(centre)
    result.change = math.exp(d) - 1
    if scale > 0:
        half = stats.t.ppf(1 - policy.alpha, dof) * scale
        result.ci = (math.exp(d - half) - 1, math.exp(d + half) - 1)
        p_lower = stats.t.cdf(d / scale, dof)  # chance of a run this low if nothing changed
        p_higher = stats.t.sf(d / scale, dof)
    else:  # identical baseline runs: any difference is real
        result.ci = (result.change, result.change)
        p_lower = 0.0 if d < 0 else 1.0
        p_higher = 0.0 if d > 0 else 1.0
    result.mde = mde(spread, k, policy, dof=dof)
    result.mde_noise = resolvable = mde(spread, k, policy, with_threshold=False, dof=dof)
    result.noise = noise_levels(baseline, spread, policy, resolvable > policy.threshold)
    shown = abs(terms.change(result.change))
    if p_lower < policy.alpha and -result.change >= policy.threshold:
        result.verdict = "regressed"
        result.reason = f"{shown:.1%} {terms.worse}, beyond the baseline's run-to-run spread (p={p_lower:.2g})"
    elif p_higher < policy.alpha and result.change >= policy.threshold:
        result.verdict = "improved"
        result.reason = f"{shown:.1%} {terms.better} (p={p_higher:.2g})"
    elif resolvable > policy.threshold:
        result.verdict = "inconclusive"
        result.reason = (f"too noisy for the {result.threshold:.0%} threshold: with {k} baseline runs it can only "
                         f"catch {terms.drops} of {terms.detectable(result.mde):.1%} or more"
                         + what_would_resolve(baseline, spread, policy))
    else:
        result.reason = (f"change within noise; {terms.drops} of {terms.detectable(result.mde):.1%} or more are caught "
                         f"({terms.noise} resolves {terms.detectable(resolvable):.1%}; the {result.threshold:.0%} "
                         "threshold sets the rest)")


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
    return (f"; run-to-run spread {math.sqrt(between):.1%}, {more_rounds}; {more_runs}; "
            "or steady the machine (CPU pinning, clocks), or raise the threshold")


def _variance(values: list[float]) -> float | None:
    return _variance_of(values) if len(values) > 1 else None


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
    measured_runs = [v for v in per_run if v is not None]
    if len(measured_runs) == len(per_run):
        process_var = max(statistics.fmean(measured_runs) - round_var / n, 0.0)
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
