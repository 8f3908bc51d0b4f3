"""An A/B's judgement of each scenario from its blocks' paired log-ratios: throughput by a t test over blocks, a
serving job's latency percentiles by signed ranks (p50) and signs (its tail) (``shift.py``), and the words and table
that say them."""
from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, field

from . import serving, shift
from .outcome import Outcome
from .words import count


@dataclass(kw_only=True)
class Judgement:
    scenario: str
    verdict: Outcome  # regressed | improved | unchanged | inconclusive
    pairs: int
    metric: str = "throughput"  # or a serving job's latency percentile ("p50", "p99", ...), lower is better
    change: float | None = None  # candidate vs baseline, a fraction (throughput: + is faster; latency: + is slower)
    ci: tuple[float, float] | None = None
    p_slower: float | None = None  # one-sided p of the candidate being worse
    detectable: float | None = None  # smallest worsening these pairs resolve (half-width of the interval)
    log_ratios: list[float] = field(default_factory=list)
    blocks: int = 0  # sets of fresh processes per arm (0: each ratio stands alone, e.g. alternated sessions)
    reason: str = ""
    ms: tuple[float, float] | None = None  # a latency's: baseline's and candidate's, medians over the blocks
    saturated: bool = False  # a service's queue grew: its latency is not judged
    final: bool = False  # inconclusive whatever more blocks say (too few requests a block for this percentile)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("scenario", "metric", "verdict", "pairs", "blocks", "change", "ci",
                                               "p_slower", "detectable", "reason", "log_ratios", "ms", "saturated")}


def judge(scenario: str, ratios: list[float], threshold: float, alpha: float,
          lower_is_better: bool = False, unit: str = "pair") -> Judgement:
    """Each log-ratio an independent unit (a block's mean, or a session against its neighbours)."""
    from scipy import special

    n = len(ratios)
    if n < 2:  # one unit shows a change but no spread to judge it by
        return Judgement(scenario=scenario, verdict="inconclusive", pairs=n,
                         change=math.exp(ratios[0]) - 1 if ratios else None, log_ratios=ratios,
                         reason="one unit has no spread to judge it by")
    mean, error = statistics.fmean(ratios), statistics.stdev(ratios) / math.sqrt(n)
    critical = special.stdtrit(n - 1, 1 - alpha)
    low, high = mean - critical * error, mean + critical * error
    if error > 0:
        p_down, p_up = special.stdtr(n - 1, mean / error), special.stdtr(n - 1, -mean / error)
    else:
        p_down, p_up = float(mean >= 0), float(mean <= 0)
    p_worse, p_better = (p_up, p_down) if lower_is_better else (p_down, p_up)
    change = math.exp(mean) - 1
    worse_by = change if lower_is_better else -change
    bound = math.log(1 + threshold)
    verdict: Outcome
    if p_worse < alpha and worse_by >= threshold:
        verdict = "regressed"
    elif p_better < alpha and -worse_by >= threshold:
        verdict = "improved"
    elif -bound < low and high < bound:
        verdict = "unchanged"
    else:
        verdict = "inconclusive"
    detectable = math.exp(critical * error) - 1 if lower_is_better else 1 - math.exp(-critical * error)
    # an inconclusive verdict says why (a budget that stopped it says so in its place, ``ab``)
    reason = (f"its interval holds both no change and a change of the {threshold:.0%} threshold: {n} {unit}s "
              f"resolve changes of {detectable:.1%} or more") if verdict == "inconclusive" else ""
    return Judgement(scenario=scenario, verdict=verdict, pairs=n, change=change,
                     ci=(math.exp(low) - 1, math.exp(high) - 1), p_slower=float(p_worse), detectable=detectable,
                     log_ratios=ratios, reason=reason)


def judge_blocks(scenario: str, blocks: list[list[float]], threshold: float, alpha: float) -> Judgement:
    """Windows paired within blocks of fresh processes: each block's mean log-ratio is one unit, so that a
    difference between two arms' processes is noise, not a verdict."""
    blocks = [block for block in blocks if block]
    judged = judge(scenario, [statistics.fmean(block) for block in blocks], threshold, alpha, unit="block")
    judged.pairs, judged.blocks = sum(map(len, blocks)), len(blocks)
    judged.log_ratios = [x for block in blocks for x in block]
    if len(blocks) < 2:
        judged.reason = "one block of processes: the noise between processes is not known yet"
    return judged


def _queue_grew(window: dict) -> str | None:
    """Why a service's window shows a queue that grew instead of draining (``serving.summary``'s rule), or None."""
    offered, backlog = window.get("offered_rps"), window["backlog"]
    if not offered or not serving.queue_grew(backlog, offered):
        return None
    return (f"{backlog:,} requests still queued at a window's end ({backlog / offered:.1f} s of arrivals at "
            f"{offered:,.0f} requests/s)")


def judge_latency(scenario: str, blocks: list[dict[str, list[dict]]], labels: tuple[str, str], threshold: float,
                  alpha: float, looks: int | None = None) -> list[Judgement]:
    """A serving job's latency at each percentile its blocks resolve: per block, each arm's windows merged and the
    block's log(candidate / baseline) of the percentile one unit, judged by signed ranks (p50) or signs (a tail, so
    that one stalled block cannot decide: ``shift.judge``). Not judged where a service saturated (``regressed`` where
    only the candidate's did, in most blocks). ``looks``: the most blocks the A/B may judge after, one look each; each
    percentile then uses the per-look alpha that keeps ``alpha`` over them all (``shift.per_look_alpha``)."""
    pairs = sum(len(block.get(label, [])) for block in blocks for label in labels) // 2
    grew = {label: [(number, why) for number, block in enumerate(blocks, 1)
                    for why in map(_queue_grew, block.get(label, [])) if why] for label in labels}
    behind = {number for number, _ in grew[labels[1]]}  # blocks in which the candidate's queue grew
    saturated = functools.partial(Judgement, scenario=scenario, metric="latency", pairs=pairs, blocks=len(blocks),
                                  saturated=True)
    if len(behind) >= max(2, math.ceil(len(blocks) / 2)) and not grew[labels[0]]:
        # in most blocks the candidate cannot keep up where the baseline does (one block: a stall, not judged)
        number, why = grew[labels[1]][0]
        return [saturated(verdict="regressed", reason=f"the {labels[1]}'s service saturated in {len(behind)} of "
                          f"{len(blocks)} blocks (block {number}: {why}) at a rate the {labels[0]}'s served without a "
                          "queue: it can no longer keep up")]
    for label in labels:
        if grew[label]:
            number, why = grew[label][0]
            return [saturated(verdict="inconclusive", reason=f"latency not judged: the {label}'s service saturated "
                              f"in block {number}, {why}; its latency measured the queue, not the job (lower its "
                              "rate)")]
    histograms = [tuple(serving.merged(block.get(label, [])) for label in labels) for block in blocks]
    histograms = [pair for pair in histograms if all(h.get_total_count() for h in pair)]
    judgements = []
    for percentile in serving.JUDGED:
        # the blocks whose arms both hold requests enough for this percentile (p50: every block)
        usable = [pair for pair in histograms if percentile == serving.JUDGED[0]
                  or serving.resolves(min(h.get_total_count() for h in pair), percentile)]
        if len(usable) < min(len(histograms), shift.units_needed(alpha)):  # too few requests, not too few blocks
            if percentile == 99:  # the tail a reader looks for: why it has no verdict (more blocks will not help)
                fewest = min((h.get_total_count() for pair in histograms for h in pair), default=0)
                judgements.append(Judgement(
                    scenario=scenario, metric="p99", verdict="inconclusive", pairs=pairs, blocks=len(usable),
                    final=True,
                    reason=f"blocks hold as few as {fewest} requests an arm, too few for p99 in "
                           f"{len(histograms) - len(usable)} of {count(len(histograms), 'block')} "
                           f"({serving.TAIL_REQUESTS / (1 - percentile / 100):.0f} needed): more --ab-pairs or "
                           "longer --ab-window-seconds"))
            continue  # too few requests a block to say anything of this tail (p50 is always said)
        values = [tuple(h.get_value_at_percentile(percentile) / 1000 for h in pair) for pair in usable]
        ratios = [math.log(c / b) for b, c in values if b > 0 and c > 0]
        ranks = percentile == serving.JUDGED[0]
        level = shift.per_look_alpha(alpha, looks, ranks) if looks else alpha
        found = shift.judge(ratios, threshold, level, ranks)
        judged = Judgement(scenario=scenario, metric=serving.name(percentile), verdict=found.verdict, pairs=pairs,
                           blocks=len(ratios), change=found.change, ci=found.ci, p_slower=found.p_worse,
                           detectable=found.detectable, log_ratios=ratios)
        if values:
            judged.ms = (statistics.median(b for b, _ in values), statistics.median(c for _, c in values))
        if found.ci is None and ratios:
            judged.reason = (f"{count(len(ratios), 'block')} cannot resolve a change at this alpha "
                             f"({shift.units_needed(level)} needed); {found.above} of {len(ratios)} rose")
        judgements.append(judged)
    return judgements


def in_words(judgements: list[Judgement]) -> list[str]:
    """Per serving scenario, which part of its latency distribution moved: "the service got slower (p50 +17%), its
    tail too (p99 +12%)", or only its tail, or neither beyond noise."""
    lines = []
    for scenario in dict.fromkeys(j.scenario for j in judgements):
        by = {j.metric: j for j in judgements if j.scenario == scenario}
        median = by.get("p50")
        if median is None or median.change is None:
            continue
        tails = [by[m] for m in ("p99.9", "p99", "p90") if m in by and by[m].change is not None]
        # the tail that regressed, else the highest one judged
        tail = next((t for t in tails if t.verdict == "regressed"), tails[0] if tails else None)
        said = f"{median.metric} {median.change:+.1%}"
        tail_said = None if tail is None else f"{tail.metric} {tail.change:+.1%}"
        tail_verdict = None if tail is None else tail.verdict
        if median.verdict == "regressed":
            text = f"the service got slower ({said})" + (
                "" if tail_said is None else f", its tail too ({tail_said})" if tail_verdict == "regressed"
                else f"; its tail {tail_verdict} ({tail_said})")
        elif tail_verdict == "regressed":
            text = f"only its tail got worse ({tail_said}); the median {median.verdict} ({said})"
        elif median.verdict == "improved":
            text = f"the service got faster ({said})"
        else:
            moved = f"({said}" + (f", {tail_said})" if tail_said else ")")
            too_few = median.ci is None and all(t.ci is None for t in tails)  # no percentile had blocks enough
            text = (f"{count(median.blocks, 'block')}: too few for any latency verdict at this alpha {moved}"
                    if too_few else f"no latency moved beyond what {count(median.blocks, 'block')} resolve " + moved)
        lines.append(f"{scenario}: {text}")
    return lines
