"""The values the gate's decision passes between layers: its policy, one run's sample of a scenario (throughput or a
latency's 1/latency), the words of a metric, and the verdict."""
from __future__ import annotations

import functools
import math
import statistics
from dataclasses import KW_ONLY, asdict, dataclass, field, fields

from .outcome import Outcome

DEFAULT_THRESHOLD = 0.02
DEFAULT_ALPHA = 0.005
DEFAULT_POWER = 0.95
DEFAULT_RUNS = 30  # at most this many runs of the current level: as much comparable history as there is
DEFAULT_MIN_RUNS = 3
DEFAULT_REMEASURE = 1  # the pytest gate measures a disturbed run again this many times at most


@dataclass(frozen=True)
class Policy:
    threshold: float = DEFAULT_THRESHOLD  # smallest drop (fraction) that counts as a regression
    alpha: float = DEFAULT_ALPHA
    power: float = DEFAULT_POWER
    runs: int = DEFAULT_RUNS  # baseline: the most recent comparable runs
    min_runs: int = DEFAULT_MIN_RUNS


def variance_of(values: list[float]) -> float:
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
    level: float | None = None  # a latency's log(1/ms) over every request of the run (the rounds: its noise)
    saturated: str | None = None  # why the serving job could not keep up with its rate (a latency sample)
    regressed: bool = False  # the gate judged it regressed when it was saved
    accepted: bool = False  # a person accepted it as the new level (``pytest-gpucolloc accept``): the level starts here
    slowed: bool = False  # measured with --colloc-extra-step-every: a known slowdown, to check the gate; no baseline

    @property
    def process_sets(self) -> tuple[tuple[float, ...], ...]:
        """Rounds grouped by the processes that measured them (one group per fresh-process repeat)."""
        return self.repeats if len(self.repeats) > 1 else (self.rounds,)

    @functools.cached_property  # read many times per decision
    def log_mean(self) -> float:
        """Mean log throughput with each set of processes weighted equally: the process is the unit. A latency's is
        the run's percentile over all its requests, the number its record and summary say (a mean of rounds' p99
        would be a mean of each round's slowest requests)."""
        if self.level is not None:
            return self.level
        return statistics.fmean(statistics.fmean(math.log(x) for x in rounds) for rounds in self.process_sets)

    @property
    def throughput(self) -> float:
        return math.exp(self.log_mean)

    @functools.cached_property
    def log_sd(self) -> float:
        """Round-to-round spread (log) within a set of processes, pooled over the sets."""
        variances = [variance_of([math.log(x) for x in rounds]) for rounds in self.process_sets if len(rounds) > 1]
        return math.sqrt(statistics.fmean(variances)) if variances else 0.0


def percent(fraction: float, spec: str = "+.1%") -> str:
    """A change said in percent; beyond +1000% a number says nothing more than 'unbounded' (a hostile or broken run)."""
    return (">+1000%" if spec.startswith("+") else ">1000%") if fraction > 10 else f"{fraction:{spec}}"


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
        return f"{self.metric + ' ' if self.inverse else ''}{percent(self.change(sample_change))}"


THROUGHPUT = Terms("throughput", "slower", "faster", "drops", "the noise alone", inverse=False)


def terms_of(sample: RunSample) -> Terms:
    if not (metric := sample.latency):
        return THROUGHPUT
    return Terms(metric, f"higher {metric} latency", f"lower {metric} latency", f"{metric} rises",
                 f"the {metric} latency's own noise", inverse=True)


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
        return asdict(self)

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
