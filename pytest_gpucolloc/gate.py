"""The regression decision: is this run's throughput lower than its history's, beyond noise? And a serving job's
latency (lower is better), judged by the same method at each percentile on 1/latency (a run's over all its requests).

In log throughput, so changes are ratios: a run is regressed when it falls below the one-sided (1 - alpha)
prediction bound of its baseline runs (``baseline.py``: comparable, at the current level, disturbed runs left out)
**and** by at least the threshold. The method and how it was checked: docs/gate.md.
"""
from __future__ import annotations

import dataclasses
import math
import statistics

from .baseline import (
    MIN_SHARED,
    Usual,
    choose_baseline,
    comparable,
    config_changes,
    config_differs,
    robust_baseline,
    signature,
)
from .noise import mde, noise_levels, what_would_resolve
from .verdict import Policy, RunSample, Terms, Verdict, percent, terms_of, variance_of


def decide(current: RunSample, history: list[RunSample], policy: Policy = Policy(), references=()) -> Verdict:
    """``references``: pairs of (another scenario's run on this GPU, its history) that place this GPU's level when
    it has too little history (``machine_levels``). A latency is judged on its 1/latency and said in ms."""
    terms = terms_of(current)
    result = Verdict(verdict="unchanged", threshold=policy.threshold, current=current.throughput, metric=terms.metric)
    served = [r for r in comparable(current, history)[0] if r.gpu_uuid == current.gpu_uuid] if current.saturated else []
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
    if terms.inverse:  # what the statistics saw as 1/latency, said as latency
        result.current = terms.value(current.throughput)
        result.baseline = None if result.baseline is None else terms.value(result.baseline)
        result.change = None if result.change is None else terms.change(result.change)
        result.ci = None if result.ci is None else (terms.change(result.ci[1]), terms.change(result.ci[0]))
        result.mde = None if result.mde is None else terms.detectable(result.mde)
        result.mde_noise = None if result.mde_noise is None else terms.detectable(result.mde_noise)
    return result


UNRESOLVABLE_DROP = 0.5  # a detectable drop this large (a latency: a doubling) is no number to give a reader


def _decide(result: Verdict, current: RunSample, history: list[RunSample], policy: Policy, references,
            terms: Terms) -> None:
    """``decide`` in the sample's own terms (higher is better), into ``result``; its reasons in ``terms``."""
    from scipy import special  # Student t; importing scipy.stats costs most of a second

    same_model = [r for r in history if r.gpu_name == current.gpu_name]
    why_not = None
    if current.throttled:
        why_not = "the GPU throttled during this run (not the power cap)"
    elif same_model and all(config_differs(r, current) for r in same_model):
        why_not = (f"the GPU's configuration differs from every baseline run's "
                   f"({'; '.join(config_changes(same_model, current))}); compare runs made under one configuration")
    elif current.contaminated:
        why_not = "other processes used the GPU during this run"
    if why_not:
        result.verdict, result.reason = "not comparable", why_not
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
    own = sum(r.gpu_uuid == current.gpu_uuid for r in history)
    if placement is None and terms.inverse:  # no other scenario's latency places this GPU (references: throughput)
        result.reason = (f"{own} comparable run(s) on this GPU (the gate needs {needed}); latency is judged "
                         "against runs on this GPU only (GPUs of one model differ): save runs on this GPU")
    elif placement is None:  # identical GPUs differ by up to 15% (H200s): a level from other GPUs decides nothing
        result.reason = (f"{own} comparable run(s) on this GPU (the gate needs {needed}) and fewer than "
                         f"{MIN_SHARED} scenarios measured both here and on the other GPUs of this model whose runs "
                         f"are saved, so this GPU's level is unknown: gate {MIN_SHARED} or more scenarios that ran "
                         "on them earlier in the same session (their levels place this GPU), or save runs on this GPU")
    elif len(baseline) < needed:
        result.reason = (f"{len(baseline)} comparable run(s) in the history; the gate needs {needed} "
                         "to know the run-to-run spread")
    if placement is None or len(baseline) < needed:
        result.verdict = "no baseline"
        if baseline:
            result.baseline = math.exp(statistics.fmean(r.log_mean for r in baseline))
            result.change = current.throughput / result.baseline - 1
        return

    means = [r.log_mean for r in baseline]
    k = len(means)
    centre = statistics.fmean(means)
    # the spread of the runs, plus what placing other GPUs at this one's level may be off by (0 on one GPU)
    spread = math.sqrt(variance_of(means) + placement.variance / (1 + 1 / k))
    scale = spread * math.sqrt(1 + 1 / k)
    dof = placement.dof(k)
    d = current.log_mean - centre
    result.baseline = math.exp(centre)
    result.change = math.exp(d) - 1
    if scale > 0:
        half = special.stdtrit(dof, 1 - policy.alpha) * scale
        result.ci = (math.exp(d - half) - 1, math.exp(min(d + half, 700.0)) - 1)  # past e^700: unbounded anyway
        # the chances of a run this low, and this high, if nothing changed
        p_lower, p_higher = special.stdtr(dof, d / scale), special.stdtr(dof, -d / scale)
    else:  # identical baseline runs: any difference is real
        result.ci = (result.change, result.change)
        p_lower, p_higher = (0.0 if d < 0 else 1.0), (0.0 if d > 0 else 1.0)
    result.mde = mde(spread, k, policy, dof=dof)
    result.mde_noise = resolvable = mde(spread, k, policy, with_threshold=False, dof=dof)
    result.noise = noise_levels(baseline, spread, policy, resolvable > policy.threshold)
    shown = abs(terms.change(result.change))
    if p_lower < policy.alpha and -result.change >= policy.threshold:
        result.verdict = "regressed"
        result.reason = (f"{percent(shown, '.1%')} {terms.worse}, beyond the baseline's run-to-run spread "
                         f"(p={p_lower:.2g})")
    elif p_higher < policy.alpha and result.change >= policy.threshold:
        result.verdict = "improved"
        result.reason = f"{percent(shown, '.1%')} {terms.better} (p={p_higher:.2g})"
    elif resolvable > policy.threshold:
        result.verdict = "inconclusive"
        if resolvable < UNRESOLVABLE_DROP:
            result.reason = (f"too noisy for the {result.threshold:.0%} threshold: with {k} baseline runs it can only "
                             f"catch {terms.drops} of {terms.detectable(result.mde):.1%} or more")
        else:  # a halving may be missed: its interval and detectable change are numbers no data stands behind (+21309%)
            result.reason = (f"not resolvable with {k} baseline run{'s' * (k != 1)}: they spread so much that "
                             f"even {'a doubling' if terms.inverse else 'a halving'} could go uncaught")
            result.ci = result.mde = result.mde_noise = None
        result.reason += what_would_resolve(baseline, spread, policy)
    else:
        result.reason = (f"change within noise; {terms.drops} of {terms.detectable(result.mde):.1%} or more are caught "
                         f"({terms.noise} resolves {terms.detectable(resolvable):.1%}; the {result.threshold:.0%} "
                         "threshold sets the rest)")
