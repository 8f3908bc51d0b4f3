"""How well the collocation model (pytest_gpucolloc/predict.py) predicts mixes it never saw, on the saved H200 runs.

    python studies/predict_held_out.py [--out docs/results/2026-12-03-h200-collocation-model.md] [--results DIR]

Reads every pytest-benchmark JSON under docs/results/ (or --results; read-only), keeps the NVIDIA H200's GPU
scenarios, and
1. leaves each measured mix out in turn (every mode and run of it), fits the model on the others and predicts it;
2. fits on the homogeneous mixes (N copies of one job) and the ResNet26 + ResNet152 pair only, and predicts the
   paper's 14 mixed experiments, which it never saw (the closest to "new mixes" these saved runs allow);
3. says how far two measurements of the same mix and mode are apart (the noise a prediction is judged against).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_gpucolloc import advisor, history, predict  # noqa: E402

GPU = "NVIDIA H200"


ASKED = ["resnet152-imagenet/bs32,resnet50-imagenet64/bs128*2,resnet26-cifar10/bs128*4",
         "resnet26-cifar10/bs32/graph/cudnn-heuristics*5"]  # two mixes nobody measured: what advise says


def load(root: Path):
    scenarios, files, runs = [], [], []
    for path in sorted(root.glob("**/*.json")):
        try:
            run = history.read_run(path)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a pytest-benchmark run (a study's own JSON)
        mine = [s for s in run.scenarios.values()
                if ((s.gpu or {}).get("name") or run.machine.get("gpu_name")) == GPU]
        if mine:
            scenarios += mine
            files.append(path)
            runs.append(run)
    return scenarios, files, runs


def mix_name(mix: tuple) -> str:
    return " + ".join(f"{n}x {label}" if n > 1 else label for label, n in mix)


def best_mode(cells: dict) -> str:
    return max(cells, key=cells.get)


def summary(checks: list, title: str, gap: float) -> list[str]:
    errors = [abs(c.error) for c in checks]
    jobs = [abs(c.predicted_shares[label] / c.measured_shares[label] - 1) for c in checks for label, _ in c.mix]
    lines = [f"**{title}**: {len(checks)} predictions of {len({c.mix for c in checks})} mixes; median absolute "
             f"error of the aggregate speedup **{statistics.median(errors):.1%}** (mean {statistics.mean(errors):.1%}, "
             f"{sum(e <= 0.10 for e in errors)} of {len(errors)} within 10%); of each job's share of its speed alone "
             f"{statistics.median(jobs):.1%} ({len(jobs)} jobs' shares).", "",
             "| mode | kind of mix | predictions | median abs error | worst |", "|---|---|---|---|---|"]
    groups: dict[tuple, list] = defaultdict(list)
    for c in checks:
        groups[(c.mode, c.kind)].append(abs(c.error))
    for (mode, kind), errs in sorted(groups.items()):
        lines.append(f"| {mode} | {kind} | {len(errs)} | {statistics.median(errs):.1%} | {max(errs):.0%} |")
    by_mix: dict[tuple, dict] = defaultdict(dict)
    for c in checks:
        by_mix[c.mix][c.mode] = c
    complete = {mix: cells for mix, cells in by_mix.items() if len(cells) == len(predict.PREDICTED_MODES)}
    right = within = clear = clear_right = 0
    for cells in complete.values():
        chosen = best_mode({m: c.predicted for m, c in cells.items()})
        measured = {m: c.measured for m, c in cells.items()}
        right += chosen == best_mode(measured)
        within += measured[chosen] >= 0.9 * max(measured.values())
        first, second = sorted(measured.values(), reverse=True)[:2]
        if first > second * (1 + gap):  # a best mode the noise of measuring cannot swap
            clear += 1
            clear_right += chosen == best_mode(measured)
    lines += ["", f"Best mode (of {', '.join(predict.PREDICTED_MODES)}) chosen by the prediction: the measured best in "
              f"**{right} of {len(complete)}** mixes measured under all three; within 10% of the measured best in "
              f"**{within} of {len(complete)}**. Where the measured best beats the next mode by more than the noise "
              f"of measuring ({gap:.1%}, section 3), the prediction picks it in **{clear_right} of {clear}**.", ""]
    return lines


def table(checks: list) -> list[str]:
    lines = ["| mix | kind | mode | predicted speedup | measured (runs) | error "
             "| per-job share: predicted / measured |",
             "|---|---|---|---|---|---|---|"]
    for c in sorted(checks, key=lambda c: (c.kind, mix_name(c.mix), c.mode)):
        shares = ", ".join(f"{label.split('/')[0].replace('-cifar10', '').replace('-imagenet64', '-64px')}"
                           f"{'/' + '/'.join(label.split('/')[1:])}: {c.predicted_shares[label]:.2f} / "
                           f"{c.measured_shares[label]:.2f}" for label, _ in c.mix)
        flag = "**" if abs(c.error) > 0.15 else ""
        lines.append(f"| {mix_name(c.mix)} | {c.kind} | {c.mode} | {c.predicted:.2f}x | {c.measured:.2f}x "
                     f"({c.measurements}) | {flag}{c.error:+.0%}{flag} | {shares} |")
    return lines


def noise(observations: list) -> tuple[float | None, int]:
    """Each measurement's distance from the median of the other measurements of its mix and mode."""
    cells: dict[tuple, list[float]] = defaultdict(list)
    for o in observations:
        cells[(o.mix, o.mode)].append(sum(o.shares))
    gaps = []
    for values in cells.values():
        for i, value in enumerate(values):
            rest = values[:i] + values[i + 1:]
            if rest:
                gaps.append(abs(value - statistics.median(rest)) / statistics.median(rest))
    return (statistics.median(gaps) if gaps else None), len(gaps)


def unseen_mixes(observations: list, profiles: dict) -> list:
    """Fit on N copies of one job (and the matrix's ResNet26 + ResNet152 pair), predict every other mix."""
    seen = [o for o in observations if len(set(o.jobs)) == 1 or set(o.jobs) in (
        {"resnet26-cifar10/bs32", "resnet152-imagenet/bs32"}, {"resnet26-cifar10/bs128", "resnet152-imagenet/bs128"})]
    seen_mixes = {o.mix for o in seen}
    found = []
    for check in predict.held_out(observations, profiles):
        if check.mix in seen_mixes:
            continue
        model = predict.fit(seen, profiles, check.mode)
        if model is None:
            continue
        jobs = [label for label, n in check.mix for _ in range(n)]
        shares = model.shares([profiles[j] for j in jobs])
        found.append(predict.HeldOut(check.mix, check.mode, check.kind, sum(shares), check.measured,
                                     dict(zip(jobs, shares)), check.measured_shares, check.measurements))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="write the markdown here (default: print it)")
    parser.add_argument("--results", type=Path, default=ROOT / "docs" / "results", help="saved runs, read-only "
                        "(default docs/results)")
    args = parser.parse_args()
    scenarios, files, runs = load(args.results)
    profiles = predict.profiles_of(scenarios)
    observations = predict.observations_of(scenarios)
    checks = predict.held_out(observations, profiles)
    unseen = unseen_mixes(observations, profiles)
    measured_gap, gaps = noise(observations)
    gap = 0.10 if measured_gap is None else measured_gap  # no mix measured twice: 10% stands for the noise
    unprofiled = sorted({j for o in observations for j in o.jobs if j not in profiles})
    lines = ["# The collocation model on held-out H200 mixes", "",
             "`python studies/predict_held_out.py --out docs/results/2026-12-03-h200-collocation-model.md`: no device "
             f"call; every saved pytest-benchmark run under docs/results/ on an {GPU} ({len(files)} files, "
             f"{len(observations)} measured scenarios of two or more jobs under {', '.join(predict.PREDICTED_MODES)}, "
             f"{len({o.mix for o in observations if all(j in profiles for j in o.jobs)})} distinct mixes of profiled "
             f"jobs; {len(profiles)} jobs profiled alone with telemetry). Not predicted (no profile with telemetry "
             f"alone in the saved runs): {', '.join(unprofiled) or 'none'}.", "",
             "The model (`pytest_gpucolloc/predict.py`), per mode: share = 1 / ((1 + overhead x (n - 1)) x max(1, "
             "sm_weight x sum of SM activity alone + dram_weight x sum of DRAM bandwidth alone)). Fitted on every "
             "mix:", "", "| mode | overhead per neighbour | SM weight | DRAM weight | mixes |", "|---|---|---|---|---|"]
    for mode in predict.PREDICTED_MODES:
        model = predict.fit(observations, profiles, mode)
        if model:
            lines.append(f"| {mode} | {model.overhead:.3f} | {model.sm_weight:.2f} | {model.dram_weight:.2f} | "
                         f"{model.mixes} |")
    errors = statistics.median(abs(c.error) for c in checks)
    groups: dict[tuple, list] = defaultdict(list)
    for c in checks:
        groups[(c.kind, c.mode)].append(abs(c.error))
    bad = [f"{kind} under {mode} ({statistics.median(e):.0%})" for (kind, mode), e in sorted(groups.items())
           if statistics.median(e) > predict.MEASURE_ABOVE]
    lines += ["", "## Verdict", "",
              f"- Median absolute error of the predicted aggregate speedup on held-out mixes: **{errors:.1%}** "
              f"(target <= 10%: {'met' if errors <= 0.10 else 'not met'}).",
              "- Best mode chosen: see section 1; the target (8 of 10 held-out mixes) is **not met** as an exact pick "
              "(the three modes are within the noise of measuring in most mixes), met where one mode is clearly best.",
              f"- Predicted badly (median error above {predict.MEASURE_ABOVE:.0%}; `advise` says \"measure it\" "
              "there): " + (", ".join(bad) or "none") + ". Graphed jobs keep the GPU busy in their time slice, so "
              "under naive they share it as if GPU-bound, which their SM activity alone (30-48%) does not say; "
              "GPU-bound ResNet152 bs128 mixes are few (3) and the equal share per job misses how unevenly they share.",
              "- Every job of a mix is predicted the same share; the per-job errors in the table show where that "
              "misses (ResNet152 bs128 beside ResNet26 bs128 under mps-partitioned: 0.96 predicted, 0.64 measured).",
              "- No new mix was measured on an H200 for this (no device was available to this work).",
              "", "## 1. Leave one mix out", ""] + summary(checks, "Each mix left out of the fit in turn", gap)
    lines += ["## 2. Mixes never seen: fitted on N copies of one job, asked for the paper's mixes", ""]
    lines += summary(unseen, "Fitted on homogeneous mixes and ResNet26 + ResNet152 only", gap)
    lines += ["## 3. The noise it is judged against", "",
              (f"Two measurements of the same mix and mode (other runs, other H200s) differ by a median of "
               f"**{measured_gap:.1%}** ({gaps} measurements, each against the median of the others): a prediction "
               "cannot be judged finer than that." if measured_gap is not None else
               "No mix and mode was measured twice in these runs: the noise is not known (10% stands for it above)."),
              "",
              "New mixes measured on an H200 for this study: **none** (no device was available to this work); the "
              "held-out checks above are the evidence. The command that measures a mix the model predicts is the "
              "one `advise` prints (`GPUCOLLOC_MIX=... pytest benchmarks/test_mix.py --gpu-mode=...`).", "",
              "## 4. What `advise` says for a mix nobody measured", ""]
    for asked in ASKED:
        answer = advisor.predicted(advisor.parse_jobs(asked), runs)
        lines += [f"`pytest-gpucolloc advise <these runs> --jobs '{asked}'`:", "```", *answer["predicted_lines"],
                  "```", ""]
    lines += ["## Every held-out prediction (leave one mix out)", "", "Errors above 15% in bold.", ""]
    lines += table(checks)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
