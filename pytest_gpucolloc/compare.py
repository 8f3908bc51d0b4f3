"""Compare saved runs (by run id, by commit, or grouped by a machine_info key): ``pytest-gpucolloc compare``'s logic,
over ``history.History``."""
from __future__ import annotations

import dataclasses
import math
import statistics

from . import gate, shift
from .history import LATENCY, History, SavedRun
from .verdict import RunSample, with_latency
from .words import count

GROUPABLE = ("driver_version", "cuda_driver_version", "cuda_runtime", "cudnn", "torch", "torchvision",
             "gpu_name", "gpu_uuid", "plugin_version", "hostname")


class SelectionError(ValueError):
    pass


def select(history: History, *, runs: list[str] | None = None, commits: list[str] | None = None,
           group_by: str | None = None,
           groups: list[str] | None = None) -> tuple[list[SavedRun], list[SavedRun], str, str]:
    """Two sets of runs (before, after) and their labels; ``runs`` and ``commits`` are pairs (argparse's nargs=2)."""
    if runs:
        sets, labels = [_named(history, wanted) for wanted in runs], runs
    elif commits:
        sets, labels = [[r for r in history.runs if r.commit and r.commit.startswith(c)] for c in commits], commits
    elif group_by:
        if group_by not in GROUPABLE:
            raise SelectionError(f"--group-by takes one of {', '.join(GROUPABLE)}")
        values = groups or list(dict.fromkeys(str(r.machine.get(group_by)) for r in history.runs))
        if len(values) != 2:
            raise SelectionError(f"runs have {len(values)} values of {group_by} ({', '.join(values)}); "
                                 "pick two with --groups A B")
        sets = [[r for r in history.runs if str(r.machine.get(group_by)) == v] for v in values]
        labels = [f"{group_by}={v}" for v in values]
    else:
        raise SelectionError("say what to compare: --runs-ids A B, --commits A B or --group-by KEY")
    for label, chosen in zip(labels, sets):
        if not chosen:
            raise SelectionError(f"no saved run matches {label}")
    alike(sets, labels)
    return sets[0], sets[1], labels[0], labels[1]


def alike(sets: list[list[SavedRun]], labels: list[str]) -> None:
    """SelectionError unless both sides are runs of one kind: CPU smoke runs are never compared with GPU runs."""
    kinds = [{"CPU smoke" if run.machine.get("device") == "cpu" else "GPU" for run in chosen} for chosen in sets]
    if len(kinds[0] | kinds[1]) > 1:
        raise SelectionError(f"{labels[0]} has {' and '.join(sorted(kinds[0]))} runs and {labels[1]} "
                             f"{' and '.join(sorted(kinds[1]))} runs: CPU smoke runs (small batches on the CPU) "
                             "are never compared with GPU runs; select runs of one kind")


def _named(history: History, wanted: str) -> list[SavedRun]:
    """The runs an id names (``History.named``); of runs left out of the history, one at most: which is meant?"""
    found = history.named(wanted)
    if len(found) > 1 and not any(run is ordinary for run in found for ordinary in history.runs):
        raise SelectionError(f"{wanted!r} names {len(found)} runs left out of the history "
                             f"({', '.join(str(run.path) for run in found)}): name one by its full id")
    return found


Row = tuple[str, dict]  # a scenario and its verdict (``Verdict.to_dict()``)


def alternating(before: list[SavedRun], after: list[SavedRun]) -> list[tuple[int, SavedRun]] | None:
    """Both sets' runs in time order, (0 for before, 1 for after), when they alternated (A B A B ...), the way
    whole runner sessions are alternated to compare drivers; None otherwise."""
    timeline = sorted([(0, run) for run in before] + [(1, run) for run in after], key=lambda entry: entry[1].datetime)
    sides = [side for side, _ in timeline]
    if len(before) < 2 or len(after) < 2 or any(a == b for a, b in zip(sides, sides[1:])):
        return None
    return timeline


def paired(timeline: list[tuple[int, SavedRun]], policy: gate.Policy) -> list[Row]:
    """Per scenario, each ``after`` run against the mean of the ``before`` runs on either side of it (which
    cancels a machine level that drifts over the sessions), judged as ``pytest-gpucolloc ab`` judges pairs; a
    serving job's latencies too, as ``ab`` judges a latency (a median by signed ranks, a tail by signs)."""
    rows = []
    for name in dict.fromkeys(name for side, run in timeline if side == 1 for name in run.scenarios):
        verdict = _paired(timeline, name, "throughput", policy)
        for metric in LATENCY:
            if any(run.sample(name, metric) is not None for _, run in timeline):
                with_latency(verdict, _paired(timeline, name, metric, policy))
        rows.append((name, verdict.to_dict()))
    return rows


def _paired(timeline: list[tuple[int, SavedRun]], name: str, metric: str, policy: gate.Policy) -> gate.Verdict:
    from . import ab_judge  # hdrhistogram loads only where latencies are compared

    levels = [(side, run.sample(name, metric)) for side, run in timeline]  # None: not in that run
    ratios, befores, afters = [], [], []
    for i, (side, sample) in enumerate(levels):
        around = [s for j in (i - 1, i + 1) if 0 <= j < len(levels) and (s := levels[j][1]) is not None]
        if side == 1 and sample is not None and around:
            ratios.append(sample.log_mean - statistics.fmean(s.log_mean for s in around))
            afters.append(sample.log_mean)
        elif side == 0 and sample is not None:
            befores.append(sample.log_mean)
    reason = f"paired: {count(len(ratios), 'run')}, each against the runs on either side of it (alternating sessions)"
    sign = 1 if metric == "throughput" else -1  # a latency sample holds 1/latency: its log-ratios turned round
    judged: shift.Shift | ab_judge.Judgement
    if metric != "throughput":  # judged as ab judges a latency: p50 by signed ranks, a tail by signs
        judged = found = shift.judge([-d for d in ratios], policy.threshold, policy.alpha, ranks=metric.endswith("p50"))
        reason += f", {found.above} of {found.units} slower"
        if found.ci is None:
            reason += f" (a latency's verdict needs {shift.units_needed(policy.alpha)} pairs at this alpha)"
    else:
        judged = by_pairs = ab_judge.judge(name, ratios, policy.threshold, policy.alpha)
        reason += "" if by_pairs.p_slower is None else f", p(slower)={by_pairs.p_slower:.2g}"
    return gate.Verdict(verdict=judged.verdict, reason=reason,
                        baseline=math.exp(sign * statistics.fmean(befores)) if befores else None,
                        current=math.exp(sign * statistics.fmean(afters)) if afters else None,
                        change=judged.change, ci=judged.ci, mde=judged.detectable, threshold=policy.threshold,
                        baseline_runs=[run.run_id for side, run in timeline if side == 0], metric=metric)


def _samples(runs: list[SavedRun], name: str, metric: str = "throughput") -> list[RunSample]:
    return [s for run in runs if (s := run.sample(name, metric)) is not None]


def compare(before: list[SavedRun], after: list[SavedRun], policy: gate.Policy) -> list[Row]:
    """Per scenario: when the runs alternated, their paired log-ratios (``paired``); else the newest run of
    ``after`` judged against the runs of ``before``."""
    if timeline := alternating(before, after):
        return paired(timeline, policy)
    rows = []
    for name in dict.fromkeys(name for run in after for name in run.scenarios):
        baseline = _samples(before, name)
        wide = dataclasses.replace(policy, runs=max(len(baseline), 2))
        judged = gate.decide(_samples(after, name)[-1], baseline, wide)
        for metric in LATENCY:  # a serving job's latencies, judged as the gate judges them
            if latest := _samples(after, name, metric):
                with_latency(judged, gate.decide(latest[-1], _samples(before, name, metric), wide))
        verdict = judged.to_dict()
        if verdict["verdict"] == "no baseline" and verdict["baseline_runs"]:
            # too few runs for a verdict (one against one): the change is still worth saying, as a change only, and
            # what a verdict needs (not the gate's words on a history: these runs were named)
            verdict["reason"] = (f"changed {verdict['change']:+.1%} ({len(verdict['baseline_runs'])} run(s) before, 1 "
                                 f"after), not a verdict: a verdict needs {max(policy.min_runs, 2)} runs before (their "
                                 "run-to-run spread); save more runs on each side, or run pytest-gpucolloc ab (paired, "
                                 "in one job)")
        rows.append((name, verdict))
    return rows
