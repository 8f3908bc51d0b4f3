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


def load(root: Path, leave_out: Path | None = None, gpu: str | None = GPU):
    """Every saved run's GPU scenarios on ``gpu`` (None: on whatever GPU they ran)."""
    scenarios, files, runs = [], [], []
    for path in sorted(root.glob("**/*.json")):
        if leave_out and path.resolve().is_relative_to(leave_out.resolve()):
            continue
        try:
            run = history.read_run(path)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a pytest-benchmark run (a study's own JSON)
        mine = [s for s in run.scenarios.values() if gpu_of(s, run) is not None and gpu in (None, gpu_of(s, run))]
        if mine:
            scenarios += mine
            files.append(path)
            runs.append(run)
    return scenarios, files, runs


def gpu_of(scenario, run) -> str | None:
    return (scenario.gpu or {}).get("name") or run.machine.get("gpu_name")


def mix_name(mix: tuple) -> str:
    return " + ".join(f"{n}x {label}" if n > 1 else label for label, n in mix)


def best_mode(cells: dict) -> str:
    return max(cells, key=cells.get)


def summary(checks: list, title: str, noise_of: dict, gaps: list[float]) -> list[str]:
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
    lines += [""] + choice(checks, noise_of, gaps)[0]
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


def distances(values: list[float]) -> list[float]:
    """Each measurement's relative distance from the median of the other measurements of its mix and mode."""
    return [abs(v - statistics.median(values[:i] + values[i + 1:])) / statistics.median(values[:i] + values[i + 1:])
            for i, v in enumerate(values) if len(values) > 1]


STAND_IN_NOISE = 0.10  # where no mix was measured twice, 10% stands for the run-to-run noise


def noise(observations: list) -> tuple[dict, list[float]]:
    """Each mix and mode's run-to-run noise: the median distance of its measurements from the others' median where
    it was measured more than once, else the median over every such cell (pooled); and the pooled distances."""
    cells: dict[tuple, list[float]] = defaultdict(list)
    for o in observations:
        cells[(o.mix, o.mode)].append(sum(o.shares))
    gaps = [g for values in cells.values() for g in distances(values)]
    pooled = statistics.median(gaps) if gaps else STAND_IN_NOISE
    return {cell: statistics.median(distances(v)) if len(v) > 1 else pooled for cell, v in cells.items()}, gaps


def remeasured_hits(measured: dict, gaps: list[float], draws: int = 4000) -> float:
    """How often a fresh measurement of each mode (its median redrawn with a run-to-run distance of these data, up or
    down) names the same best mode: what even a model that knew the medians exactly could score."""
    import numpy as np

    rng = np.random.default_rng(0)
    modes = list(measured)
    noisy = np.array([measured[m] for m in modes]) * (1 + rng.choice(gaps, (draws, len(modes)))
                                                       * rng.choice([-1, 1], (draws, len(modes))))
    return float(np.mean(noisy.argmax(axis=1) == modes.index(best_mode(measured))))


def choice(checks: list, noise_of: dict, gaps: list[float]) -> tuple[list[str], dict]:
    """The best mode chosen by the held-out predictions against the measured best, judged against the noise."""
    by_mix: dict[tuple, dict] = defaultdict(dict)
    for c in checks:
        by_mix[c.mix][c.mode] = c
    complete = {mix: cells for mix, cells in sorted(by_mix.items()) if len(cells) == len(predict.PREDICTED_MODES)}
    counts: dict[str, float] = defaultdict(float)
    rows = []
    for mix, cells in complete.items():
        measured = {m: c.measured for m, c in cells.items()}
        chosen, best = best_mode({m: c.predicted for m, c in cells.items()}), best_mode(measured)
        second = sorted(measured, key=measured.get)[-2]
        tie = max(noise_of[(mix, best)], noise_of[(mix, chosen)])
        decisive = measured[best] > measured[second] * (1 + max(noise_of[(mix, best)], noise_of[(mix, second)]))
        # what advise would say, with the ratio errors of the other mixes only (strictly held out)
        others = [c for c in checks if c.mix != mix]
        found = [predict.Prediction(m, c.predicted, None, None, {}, c.kind, None, 0, "", None)
                 for m, c in cells.items()]
        named = [p.mode for p, _ in predict.within_error(found, others)]
        counts["exact"] += chosen == best
        counts["within"] += measured[chosen] >= measured[best] * (1 - tie)
        counts["decisive"] += decisive
        counts["decisive right"] += decisive and chosen == best
        pooled = measured[best] > measured[second] * (1 + statistics.median(gaps))
        counts["decisive pooled"] += pooled
        counts["decisive pooled right"] += pooled and chosen == best
        counts["oracle"] += remeasured_hits(measured, gaps)
        counts["named one"] += len(named) == 1
        counts["named one right"] += named == [best]
        counts["tied has best"] += len(named) > 1 and best in named
        for mode in predict.PREDICTED_MODES:
            counts[f"always {mode}"] += best == mode
        spread = ", ".join(f"{m} {measured[m]:.2f}x ±{noise_of[(mix, m)]:.0%} / {cells[m].predicted:.2f}x"
                           for m in predict.PREDICTED_MODES)
        verdict = "hit" if chosen == best else ("within noise" if measured[chosen] >= measured[best] * (1 - tie)
                                                else "**miss**")
        rows.append(f"| {mix_name(mix)} | {spread} | {best}{' (decisive)' if decisive else ''} | {chosen} | "
                    f"{verdict} | {' / '.join(named)} |")
    n = len(complete)
    lines = [f"Best mode (of {', '.join(predict.PREDICTED_MODES)}), over the **{n}** mixes measured under all three:",
             "",
             f"- the prediction's best is the measured best in **{counts['exact']:.0f} of {n}** "
             f"({counts['exact'] / n:.0%}; the target, 8 of 10, is "
             + (f"**{'met' if counts['exact'] >= 0.8 * n else 'not met'}**);" if n >= 10 else
                f"not judged on {n} mix{'es' if n > 1 else ''});"),
             "- always answering one mode would score: " + ", ".join(
                 f"{m} {counts[f'always {m}']:.0f}" for m in predict.PREDICTED_MODES) + f" of {n};",
             f"- a fresh measurement of each mode names the same best as these medians in about "
             f"**{counts['oracle']:.0f} of {n}** (each median redrawn with this data's run-to-run distances): what a "
             "model that knew every median exactly would score against a new measurement;",
             f"- the chosen mode is within the noise of the measured best (the larger run-to-run noise of the two "
             f"cells: their own where measured more than once, else the pooled {statistics.median(gaps):.1%}) in "
             f"**{counts['within']:.0f} of {n}**;",
             f"- decisive mixes (the best beats the next by more than the noise of both): "
             f"**{counts['decisive']:.0f}**; the prediction picks their best in "
             f"**{counts['decisive right']:.0f} of {counts['decisive']:.0f}** (with the pooled "
             f"noise for every mix: {counts['decisive pooled right']:.0f} of {counts['decisive pooled']:.0f});",
             f"- `advise`'s rule (name one best only when the predicted gap to the next exceeds the held-out error of "
             f"that ratio, over the other mixes): it names one in **{counts['named one']:.0f} of {n}** mixes and is "
             f"right in **{counts['named one right']:.0f}** of them; in the other {n - counts['named one']:.0f} it "
             f"says \"within the model's error: measure it\" (the measured best among the modes it names there: "
             f"{counts['tied has best']:.0f}).", "",
             "| mix | per mode: measured ±noise / predicted | measured best | predicted best | pick | advise names |",
             "|---|---|---|---|---|---|", *rows, ""]
    return lines, {**counts, "mixes": n}


def unseen_mixes(observations: list, profiles: dict) -> list:
    """Fit on N copies of one job (and the matrix's ResNet26 + ResNet152 pair), predict every other mix."""
    return fitted_on([o for o in observations if len(set(o.jobs)) == 1 or set(o.jobs) in (
        {"resnet26-cifar10/bs32", "resnet152-imagenet/bs32"}, {"resnet26-cifar10/bs128", "resnet152-imagenet/bs128"})],
        observations, profiles)


def fitted_on(seen: list, observations: list, profiles: dict) -> list:
    """Fit on the ``seen`` observations only, predict every other mix of ``observations``."""
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
    parser.add_argument("--new", type=Path, help="a folder of runs measured after the model (research/new-mixes): "
                        "its mixes are predicted by the model fitted on every other run, never on them")
    args = parser.parse_args()
    scenarios, files, runs = load(args.results, leave_out=args.new)
    if args.new:
        new_scenarios, _, new_runs = load(args.new, gpu=None)
        new_gpus = {gpu_of(s, r) for r in new_runs for s in r.scenarios.values()} - {None}
        if not new_scenarios:
            parser.error(f"--new {args.new}: no saved GPU run there")
    profiles = predict.profiles_of(scenarios)
    observations = predict.observations_of(scenarios)
    checks = predict.held_out(observations, profiles)
    unseen = unseen_mixes(observations, profiles)
    noise_of, gaps = noise(observations)
    measured_gap = statistics.median(gaps) if gaps else None
    gaps = gaps or [STAND_IN_NOISE]
    picked = choice(checks, noise_of, gaps)[1]
    unprofiled = sorted({j for o in observations for j in o.jobs if j not in profiles})
    lines = ["# The collocation model on held-out H200 mixes", "",
             f"`python studies/predict_held_out.py{f' --new {args.new}' if args.new else ''} --out "
             f"{args.out or 'docs/results/2026-12-03-h200-collocation-model.md'}`: a "
             f"re-analysis on a CPU, no device call, of every saved pytest-benchmark run under docs/results/ on an "
             f"{GPU} ({len(files)} files, "
             f"{len(observations)} measured scenarios of two or more jobs under {', '.join(predict.PREDICTED_MODES)}, "
             f"{len({o.mix for o in observations if all(j in profiles for j in o.jobs)})} distinct mixes of profiled "
             f"jobs; {len(profiles)} jobs profiled alone with telemetry). Not predicted (no profile with telemetry "
             f"alone in the saved runs): {', '.join(unprofiled) or 'none'}.", "",
             "The model (`pytest_gpucolloc/predict.py`), per mode: share of job i = 1 / ((1 + overhead x (n - 1)) x "
             "max(1, demand, slice_weight x n x SM activity of job i alone)), demand = sm_weight x sum of SM activity "
             "alone + dram_weight x sum of DRAM bandwidth alone + graph_weight x number of CUDA-graphed jobs. Fitted "
             "on every mix:", "", "| mode | overhead per neighbour | SM weight | DRAM weight | graph weight "
             "| slice weight | mixes |", "|---|---|---|---|---|---|---|"]
    for mode in predict.PREDICTED_MODES:
        model = predict.fit(observations, profiles, mode)
        if model:
            lines.append(f"| {mode} | {model.overhead:.3f} | {model.sm_weight:.2f} | {model.dram_weight:.2f} | "
                         f"{model.graph_weight:.2f} | {model.slice_weight:.2f} | {model.mixes} |")
    errors = statistics.median(abs(c.error) for c in checks)
    groups: dict[tuple, list] = defaultdict(list)
    for c in checks:
        groups[(c.kind, c.mode)].append(abs(c.error))
    bad = [f"{kind} under {mode} ({statistics.median(e):.0%})" for (kind, mode), e in sorted(groups.items())
           if statistics.median(e) > predict.MEASURE_ABOVE]
    lines += ["", "## Verdict", "",
              f"- Median absolute error of the predicted aggregate speedup on held-out mixes: **{errors:.1%}** "
              f"(target <= 10%: {'met' if errors <= 0.10 else 'not met'}).",
              f"- Best mode chosen (section 1): the measured best in **{picked['exact']:.0f} of {picked['mixes']}** "
              f"held-out mixes: the target (8 of 10) is "
              f"**{'met' if picked['exact'] >= 0.8 * picked['mixes'] else 'not met'}**. Always answering "
              f"mps-partitioned scores {picked['always mps-partitioned']:.0f}; a fresh measurement agrees "
              f"with these measured medians on the best mode in only about {picked['oracle']:.0f}: most mixes' "
              f"modes are within the noise of measuring (decisive mixes: {picked['decisive']:.0f}, picked in "
              f"{picked['decisive right']:.0f}). `advise` names one best mode only where the model can tell "
              f"({picked['named one']:.0f} of {picked['mixes']} held out, right in {picked['named one right']:.0f}) "
              "and otherwise says \"within the model's error: measure it\".",
              f"- Predicted badly (median error above {predict.MEASURE_ABOVE:.0%}; `advise` says \"measure it\" "
              "there): " + (", ".join(bad) or "none") + ". Graphed jobs hold the GPU for their whole time slice, "
              "which their SM activity alone (30-48%) does not say: the graph term catches it under naive, not under "
              "the MPS modes.",
              "- Before the per-job slice and graph terms (the model of 2026-12-03, same runs and command): 9.2% "
              "median error, the measured best picked in 20 of 39 mixes, 6 of 7 decisive ones (pooled noise).",
              "- A job's share differs from its neighbours' only through its own slice (n x its SM activity alone); "
              "the per-job errors in the table show where that misses.",
              "- New mixes measured after the model: section 5." if args.new else
              "- No new mix was measured on an H200 for this (no device was available to this work).",
              "", "## 1. Leave one mix out", ""]
    lines += summary(checks, "Each mix left out of the fit in turn", noise_of, gaps)
    lines += ["## 2. Mixes never seen: fitted on N copies of one job, asked for the paper's mixes", ""]
    lines += summary(unseen, "Fitted on homogeneous mixes and ResNet26 + ResNet152 only", noise_of, gaps)
    lines += ["## 3. The noise it is judged against", "",
              (f"Two measurements of the same mix and mode (other runs, other H200s) differ by a median of "
               f"**{measured_gap:.1%}** ({len(gaps)} measurements, each against the median of the others): a "
               "prediction cannot be judged finer than that." if measured_gap is not None else
               "No mix and mode was measured twice in these runs: the noise is not known (10% stands for it above)."),
              "",
              ("New mixes measured after the model: section 5. " if args.new else
               "New mixes measured on an H200 for this study: **none** (no device was available to this work); the "
               "held-out checks above are the evidence. ")
              + "The command that measures a mix the model predicts is the one `advise` prints "
              "(`GPUCOLLOC_MIX=... pytest benchmarks/test_mix.py --gpu-mode=...`).", "",
              "## 4. What `advise` says for a mix nobody measured", ""]
    for asked in ASKED:
        answer = advisor.predicted(advisor.parse_jobs(asked), runs)
        lines += [f"`pytest-gpucolloc advise <these runs> --jobs '{asked}'`:", "```", *answer["predicted_lines"],
                  "```", ""]
    if args.new:
        own = predict.profiles_of(new_scenarios)  # jobs profiled alone in the new runs; the others as before
        new_observations = predict.observations_of(new_scenarios)
        fresh = predict.held_out(new_observations, {**profiles, **own}, observations, profiles)
        unpredicted = sorted({mix_name(o.mix) for o in new_observations
                              if not all(j in profiles or j in own for j in o.jobs)})
        lines += [f"## 5. New mixes, measured after the model (`--new {args.new}`, {', '.join(sorted(new_gpus))})",
                  "", f"The model fitted on the {len(observations)} {GPU} scenarios above, never on these; each new "
                  "mix's jobs' profiles (speed, SM activity and DRAM bandwidth alone) from the new runs themselves, "
                  "on the GPU they ran on, else from the " + GPU + " runs (" + (", ".join(sorted(set(profiles)
                  - set(own))) or "none") + f"). A different GPU makes it a harder test: the fitted overheads and "
                  f"weights are the {GPU}'s, and so are the profiles of a mix whose jobs all come from there. "
                  "Not predicted (a job profiled nowhere): "
                  + ("; ".join(unpredicted) or "none") + ".", ""]
        pooled = defaultdict(lambda: statistics.median(gaps), noise_of)  # a cell the H200 never measured: pooled
        lines += summary(fresh, "New mixes", pooled, gaps) if fresh else ["No new mix of profiled jobs.", ""]
        lines += table(fresh) + [""]
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
