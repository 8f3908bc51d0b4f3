"""The runs a verdict stands on: comparable runs of the scenario (the same jobs, GPU model and configuration; the same
physical GPU, or the model's others placed at this one's level), the current level since the last shift, disturbed
runs left out and named."""
from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass

from . import changepoints
from .machine import bounding_differences
from .verdict import Policy, RunSample, terms_of, variance_of

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


def comparable(current: RunSample, history: list[RunSample]) -> tuple[list[RunSample], list[str]]:
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
    same_config = [r for r in same_jobs if not config_differs(r, current)]
    if len(same_config) < len(same_jobs):
        notes.append(f"{len(same_jobs) - len(same_config)} run(s) under another GPU configuration left out "
                     f"({'; '.join(config_changes(same_jobs, current))})")
    calm = [r for r in same_config if not r.throttled and not r.contaminated]
    if len(calm) < len(same_config):
        notes.append(f"{len(same_config) - len(calm)} throttled or contaminated run(s) left out")
    served = [r for r in calm if not r.saturated]
    if len(served) < len(calm):
        notes.append(f"{len(calm) - len(served)} saturated run(s) left out (their latency was a growing queue's)")
    ordinary = [r for r in served if not r.slowed]
    if len(ordinary) < len(served):
        notes.append(f"{len(served) - len(ordinary)} run(s) slowed on purpose (--colloc-extra-step-every) left out")
    # a regression is no baseline until a person accepts it: a retry of a regressed commit would pass on it
    kept = [r for r in ordinary if not r.regressed or r.accepted]
    if len(kept) < len(ordinary):
        ids = ", ".join(r.run_id.split("_")[0] for r in ordinary if r not in kept)
        notes.append(f"{len(ordinary) - len(kept)} run(s) judged regressed left out until accepted ({ids}; "
                     "`pytest-gpucolloc accept RUN` makes one the new level)")
    return kept, notes


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
        alike, _ = comparable(here, saved)
        by_gpu: dict[str, list[float]] = {}
        for run in alike:
            if run.gpu_uuid and run.gpu_uuid != current.gpu_uuid:
                by_gpu.setdefault(run.gpu_uuid, []).append(run.log_mean)
        for gpu, means in by_gpu.items():
            if len(means) >= 2:  # its own spread is needed to know how well it places the GPU
                noise = variance_of(means)
                found.setdefault(gpu, []).append((here.log_mean - statistics.fmean(means),
                                                  noise * (1 + 1 / len(means))))
    levels = {}
    for gpu, pairs in found.items():
        if len(pairs) < MIN_SHARED:
            continue
        offsets, k = [d for d, _ in pairs], len(pairs)
        # the offsets' spread holds the references' run noise and how unalike scenarios move (at least the noise);
        # the judged scenario's own offset differs from their mean by that much, plus the mean's own error
        spread = max(variance_of(offsets), statistics.fmean(v for _, v in pairs))
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
    calm, notes = comparable(current, history)  # in the history's order: the order the runs were saved in
    same_gpu = [r for r in calm if current.gpu_uuid and r.gpu_uuid == current.gpu_uuid]
    if len(same_gpu) >= policy.min_runs or not current.gpu_uuid or len(same_gpu) == len(calm):
        return calm if not current.gpu_uuid else same_gpu, notes, Placement(), None
    levels = machine_levels(current, references)
    chosen = [r if r.gpu_uuid == current.gpu_uuid else _at_level(r, levels[r.gpu_uuid].offset)
              for r in calm if r.gpu_uuid == current.gpu_uuid or r.gpu_uuid in levels]
    if len(chosen) < policy.min_runs:
        others = len({r.gpu_uuid for r in calm}) - bool(same_gpu)
        fleet = (f"other GPUs of this model ({others}), not adjusted: fewer than {MIN_SHARED} scenarios shared with "
                 "this GPU")
        return calm, notes, None, fleet
    if unplaced := len(calm) - len(chosen):
        notes.append(f"{unplaced} run(s) on GPUs that share fewer than {MIN_SHARED} scenarios with this one left out "
                     "(their level is unknown)")
    used = {r.gpu_uuid for r in calm if r.gpu_uuid in levels}
    mean_offset = statistics.fmean(levels[g].offset for r in calm if (g := r.gpu_uuid) is not None and g in used)
    shared = min(levels[g].scenarios for g in used)
    fleet = (f"other GPUs of this model ({len(used)}), level adjusted by "
             f"{terms_of(current).level(math.exp(mean_offset) - 1)} from "
             f"{shared}{'+' if any(levels[g].scenarios > shared for g in used) else ''} shared scenario(s)")
    # each GPU's offset moves the centre by its share of the runs; the offsets share this GPU's reference runs and
    # the judged scenario's own way of moving, so their errors are taken as one (a weighted mean, not of squares)
    share = {g: sum(r.gpu_uuid == g for r in chosen) / len(chosen) for g in used}
    return chosen, notes, Placement(sum(share[g] * levels[g].variance for g in used), shared), fleet


def _at_level(run: RunSample, offset: float) -> RunSample:
    factor = math.exp(offset)
    return dataclasses.replace(run, rounds=tuple(x * factor for x in run.rounds),
                               repeats=tuple(tuple(x * factor for x in r) for r in run.repeats),
                               level=None if run.level is None else run.level + offset)


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
    from scipy import special

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
        p = 2 * special.stdtr(k - 2, -t)
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
    whys = [signature(r, usual) for r in chosen]
    left_out = {r.run_id: why for r, why in zip(chosen, whys) if why}
    steady = [r for r, why in zip(chosen, whys) if not why]  # by run, not id: machine folders share ids
    start = changepoints.level_start([r.log_mean for r in steady], min_runs=max(policy.min_runs, 2))
    accepted = max((i for i, r in enumerate(steady) if r.accepted), default=0)
    if accepted and accepted >= start:  # a person's word on where the level starts outranks a shift before it
        start = accepted
        notes.append(f"{start} run(s) before the level accepted at {steady[start].run_id} (`pytest-gpucolloc "
                     "accept`) left out")
    elif start:
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
    return [r for i, r in enumerate(level) if i not in outliers], left_out, notes


def config_differs(baseline: RunSample, current: RunSample) -> list[str]:
    return bounding_differences(baseline.config, current.config)


def config_changes(runs: list[RunSample], current: RunSample) -> list[str]:
    """Every way the runs' GPU configuration differs from the current run's, in words."""
    return sorted({change for run in runs for change in config_differs(run, current)})
