"""Which statistic should judge a service's latency in ab: the blocks' mean log-ratio by Student t (the earlier
rule), signed ranks (Wilcoxon), or signs (the rule now, ``shift.py``), on
1. simulated blocks under ab's stopping rule (judged after each block from the 3rd to the 12th): A/A false alarms and
   the share of +10% rises caught, blocks heavy-tailed as on H200s (a process's level moves p50 by ~6%, t with 3
   degrees of freedom; one block in 20 stalled in either arm, 1.5-5x);
2. one stalled block: n - 1 blocks +10%, one at 0.2x;
3. the real H200 blocks of docs/results/2026-12-03-h200-serving-verdicts (each ab's latency-windows.json);
4. a level per fork server, as measured on an H100 (docs/results/2026-12-06-serving-arrivals-and-ab-server: p50 at
   one of two levels, 12.7% apart under mps, the higher in 4 of 6 sessions; 3% apart, the A/A's offset under
   mps-partitioned; blocks otherwise with an SD of 1.7%): drawn once per arm (one server an arm, as ab did) or anew
   in every block (a server a block, as it does now), by the sign rule.
    python studies/latency_verdicts.py [--trials 3000] [--markdown FILE]
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import random
import statistics
import tarfile
import tempfile
from pathlib import Path

from scipy import stats

from pytest_gpucolloc import ab_judge, serving, shift

ROOT = Path(__file__).resolve().parent.parent
EVIDENCE = ROOT / "docs" / "results" / "2026-12-03-h200-serving-verdicts"
ALPHA, THRESHOLD = 0.005, 0.02


def by_t(ratios: list[float]) -> str:
    return ab_judge.judge("s", ratios, THRESHOLD, ALPHA, lower_is_better=True).verdict


def by_ranks(ratios: list[float]) -> str:
    if len(ratios) < 2 or all(d == 0 for d in ratios):
        return "inconclusive"
    p_up = stats.wilcoxon(ratios, alternative="greater").pvalue
    p_down = stats.wilcoxon(ratios, alternative="less").pvalue
    centre = statistics.median((a + b) / 2 for i, a in enumerate(ratios) for b in ratios[i:])
    bound = math.log(1 + THRESHOLD)
    return "regressed" if p_up < ALPHA and centre >= bound else "improved" if p_down < ALPHA and centre <= -bound \
        else "inconclusive"


def by_signs(ratios: list[float]) -> str:
    return shift.judge(ratios, THRESHOLD, ALPHA).verdict


RULES = {"t on the mean (before)": by_t, "signed ranks": by_ranks, "signs (now)": by_signs}


def block(rng: random.Random, change: float) -> float:
    d = math.log(1 + change) + 0.06 * rng.gauss(0, 1) / math.sqrt(rng.gammavariate(1.5, 2) / 3)
    if rng.random() < 0.05:
        d += rng.choice([-1, 1]) * math.log(rng.uniform(1.5, 5))
    return d


HIGH_SHARE, WITHIN = 4 / 6, 0.017


def level(rng: random.Random, apart: float) -> float:
    return math.log(1 + apart) if rng.random() < HIGH_SHARE else 0.0


def leveled(rng: random.Random, change: float, apart: float, per_arm: tuple | None) -> float:
    """A block's log-ratio with each arm's server level: ``per_arm`` holds the arms' levels drawn once, else anew."""
    base, cand = per_arm or (level(rng, apart), level(rng, apart))
    return math.log(1 + change) + cand - base + rng.gauss(0, WITHIN)


def sequential(rule, rng: random.Random, change: float, draw=block) -> str:
    ratios = [draw(rng, change) for _ in range(2)]
    verdict = "inconclusive"
    for _ in range(3, 13):
        ratios.append(draw(rng, change))
        verdict = rule(ratios)
        if verdict != "inconclusive":
            break
    return verdict


def real_blocks() -> list[tuple[str, str, dict]]:
    """(call, part, latency windows by scenario) of every ab kept in the evidence folder."""
    found = []
    for archive in sorted(EVIDENCE.glob("*/ab-*-out.tar.gz")):
        with tempfile.TemporaryDirectory() as folder, tarfile.open(archive) as tar:
            tar.extractall(folder, filter="data")
            windows = next(Path(folder).rglob("latency-windows.json"), None)
            if windows is not None:
                found.append((archive.parent.name, archive.name.split("-out")[0], json.loads(windows.read_text())))
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=3000)
    parser.add_argument("--markdown")
    args = parser.parse_args()
    lines = [f"Simulated, {args.trials} A/A and {args.trials // 5} +10% sequences per rule (alpha {ALPHA}, "
             f"threshold {THRESHOLD:.0%}, blocks 3-12):", "",
             "| rule | A/A regressed | A/A improved | +10% regressed | 11 of 12 blocks +10%, one 0.2x | "
             "9 of 10, one 0.2x |", "|---|---|---|---|---|---|"]
    for name, rule in RULES.items():
        rng = random.Random(7)
        aa = [sequential(rule, rng, 0.0) for _ in range(args.trials)]
        rise = [sequential(rule, rng, 0.10) for _ in range(args.trials // 5)]
        stalled = [rule([0.10 + 0.001 * i for i in range(n - 1)] + [math.log(0.2)]) for n in (12, 10)]
        lines.append(f"| {name} | {aa.count('regressed') / len(aa):.2%} | {aa.count('improved') / len(aa):.2%} | "
                     f"{rise.count('regressed') / len(rise):.0%} | {stalled[0]} | {stalled[1]} |")
    lines += ["", "The H200 blocks (each ab's blocks as measured; p50 and p99 of each arm per block):", "",
              "| call | ab | percentile | blocks | rose | " + " | ".join(RULES) + " |",
              "|---|---|---|---|---|" + "---|" * len(RULES)]
    for call, part, scenarios in real_blocks():
        for blocks in scenarios.values():
            for percentile in (50, 99):
                ratios = []
                for one in blocks:
                    base, cand = (serving.merged(one[arm]).get_value_at_percentile(percentile) for arm in
                                  ("baseline", "candidate"))
                    ratios.append(math.log(cand / base))
                lines.append(f"| {call} | {part} | p{percentile} | {len(ratios)} | {sum(d > 0 for d in ratios)} | "
                             + " | ".join(rule(ratios) for rule in RULES.values()) + " |")
    lines += ["", f"A level per fork server (the higher {HIGH_SHARE:.0%} of the time; blocks otherwise with an SD of "
              f"{WITHIN:.1%}), signs, {args.trials} sequences each:", "",
              "| levels apart | servers | A/A regressed | A/A improved | +10% regressed | +20% regressed |",
              "|---|---|---|---|---|---|"]
    for apart in (0.127, 0.03):
        for name, once in (("one an arm (before)", True), ("one a block (now)", False)):
            rng = random.Random(11)
            found = {}
            for change in (0.0, 0.10, 0.20):
                found[change] = []
                for _ in range(args.trials):
                    arms = (level(rng, apart), level(rng, apart)) if once else None
                    draw = functools.partial(leveled, apart=apart, per_arm=arms)
                    found[change].append(sequential(by_signs, rng, change, draw))
            lines.append(f"| {apart:.1%} | {name} | {found[0.0].count('regressed') / args.trials:.1%} | "
                         f"{found[0.0].count('improved') / args.trials:.1%} | "
                         f"{found[0.10].count('regressed') / args.trials:.0%} | "
                         f"{found[0.20].count('regressed') / args.trials:.0%} |")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")


if __name__ == "__main__":
    main()
