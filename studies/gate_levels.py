"""What the gate can see in a saved history: per scenario, where the noise lives (rounds, processes, runs), the
smallest drop the gate detects with the newest runs as a baseline, and A/A judgements — every run of unchanged
code judged against the other unchanged runs (leave one out), which must never say "regressed".

Runs made with an injected slowdown (``--colloc-extra-step-every``) are told apart by their recorded workload
options and left out of the A/A judgements.
    python studies/gate_levels.py --storage HISTORY [--runs 5] [--json OUT.json] [--markdown OUT.md]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from tabulate import tabulate

from pytest_gpucolloc import gate, history
from pytest_gpucolloc.verdict import DEFAULT_RUNS


def _cv(values: list[float]) -> float | None:
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else None


def slowed(run: history.SavedRun, name: str) -> bool:
    return any(w.params.get("options", {}).get("extra_step_every") for w in run.scenarios[name].workers)


def levels(loaded: history.History, name: str, policy: gate.Policy) -> dict:
    runs = [r for r in loaded.runs if name in r.scenarios]
    plain = [r for r in runs if not slowed(r, name)]
    samples = [r.sample(name) for r in plain]
    sets = [s for sample in samples for s in sample.process_sets]
    within = [_cv(list(s)) for s in sets if len(s) > 1]
    between_processes = [_cv([statistics.fmean(s) for s in sample.process_sets]) for sample in samples
                         if len(sample.process_sets) > 1]
    baseline = samples[-policy.runs:]
    verdict = gate.decide(samples[-1], samples[:-1][-policy.runs:], policy) if len(samples) > policy.min_runs else None
    aa = [gate.decide(s, [o for o in samples if o is not s][-policy.runs:], policy).verdict for s in samples]
    judged_slowed = [(r.run_id, gate.decide(r.sample(name), samples[-policy.runs:], policy).to_dict())
                     for r in runs if slowed(r, name)]
    return {
        "scenario": name,
        "runs": len(runs),
        "throughput_median": statistics.median(s.throughput for s in samples),
        "round_cv_median": statistics.median(within) if within else None,
        "process_cv_median": statistics.median(between_processes) if between_processes else None,
        "repeats_per_run": statistics.fmean(len(s.process_sets) for s in samples),
        "run_cv": _cv([s.throughput for s in baseline]),
        "detectable_drop": verdict.mde if verdict else None,
        "noise": verdict.noise if verdict else None,
        "aa_verdicts": aa,
        "slowed_verdicts": judged_slowed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--storage", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    loaded = history.load(args.storage)
    for problem in loaded.problems:
        print(f"warning: {problem}", file=sys.stderr)
    policy = gate.Policy(runs=args.runs)
    names = list(dict.fromkeys(name for run in loaded.runs for name in run.scenarios))
    rows = [levels(loaded, name, policy) for name in names]

    def pct(value):
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.2f}%"

    table = tabulate([[history.short_name(r["scenario"]), r["runs"], f"{r['throughput_median']:,.0f}",
                       pct(r["round_cv_median"]), pct(r["process_cv_median"]), pct(r["run_cv"]),
                       pct(r["detectable_drop"]), (r["noise"] or {}).get("dominant", "-"),
                       f"{r['aa_verdicts'].count('regressed')} of {len(r['aa_verdicts'])} regressed "
                       f"({', '.join(sorted(set(r['aa_verdicts'])))})",
                       "; ".join(f"{v['verdict']} {v['change']:+.1%}" for _, v in r["slowed_verdicts"]) or "-"]
                      for r in rows],
                     headers=["scenario", "runs", "median samples/s", "round CV", "process CV", "run CV",
                              "detectable drop", "dominant noise", "A/A (leave one out)", "slowed run"],
                     tablefmt="github", disable_numparse=True)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
