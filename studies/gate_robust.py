"""The robust gate against the plain one, on synthetic histories with disturbed and cold runs injected and on
the saved H200 histories in docs/results.

    python studies/gate_robust.py [--trials 2000] [--only simulation|saved]
'plain' is the gate before disturbed runs were recognised: the last 5 comparable runs, no run left out.
"""
import argparse
import contextlib
import math
import sys
import tarfile
import tempfile
from pathlib import Path

from tabulate import tabulate

from pytest_gpucolloc import baseline, gate
from pytest_gpucolloc.history import load

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the synthetic histories: tests/doubles
from doubles.gatesim import detection_rate  # noqa: E402

PROFILES = [  # name, round CV, run-to-run CV
    ("user's bf16 transformer x2 (GPU-bound)", 0.004, 0.002),
    ("graphed ResNet26 (cuDNN heuristics)", 0.001, 0.001),
    ("launch-bound, 5% rounds", 0.05, 0.0),
]
INJECTED = [  # baseline runs, disturbed, cold
    (5, 0, 0), (5, 1, 0), (5, 1, 1), (10, 1, 2), (20, 2, 2),
]


@contextlib.contextmanager
def plain_gate():
    """The gate without its robust rules: the last 5 runs, nothing left out, no level shifts."""
    saved = baseline.ROUND_SPREAD_RATIO, baseline.CAP_SHARE_DROP, baseline.level_outliers
    baseline.ROUND_SPREAD_RATIO, baseline.CAP_SHARE_DROP = math.inf, math.inf
    baseline.level_outliers = lambda means, alpha=0, keep=3: {}
    try:
        yield gate.Policy(runs=5)
    finally:
        baseline.ROUND_SPREAD_RATIO, baseline.CAP_SHARE_DROP, baseline.level_outliers = saved


def simulation(trials: int) -> str:
    rows = []
    for name, within, between in PROFILES:
        for runs, disturbed, cold in INJECTED:
            cells = [name, runs, f"{disturbed} + {cold}"]
            for which in ("robust", "plain"):
                with (plain_gate() if which == "plain" else contextlib.nullcontext(gate.Policy())) as policy:
                    kw = dict(baseline_runs=runs, disturbed=disturbed, cold=cold, trials=trials, policy=policy)
                    aa = detection_rate(0.0, within, between, seed=1, **kw)
                    two = detection_rate(0.02, within, between, seed=2, **kw)
                    four = detection_rate(0.04, within, between, seed=3, **kw)
                cells += [f"{round(aa['rate'] * trials)} / {trials}", f"{two['rate']:.0%}", f"{four['rate']:.0%}",
                          f"{aa['median_mde']:.1%}"]
                if which == "robust":
                    cells.append(f"{aa['named']:.0%} / {aa['steady_left_out']:.1%}")
            rows.append(cells)
    headers = ["noise", "baseline runs", "disturbed + cold", "A/A regressed", "-2% caught", "-4% caught",
               "detectable drop", "injected named / a steady run left out",
               "plain: A/A regressed", "-2%", "-4%", "detectable drop"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


# Saved H200 histories: which runs were unchanged (A/A) and which carried an injected slowdown (docs/results/*/README).
SAVED = [
    ("2026-11-30-h200/gate-gpu-bound-vs-launch-bound/history.tar.gz", range(0, 6), [6], "-4.8%"),
    ("2026-12-01-h200-gate-cudnn-heuristics/history.tar.gz", range(0, 6), [6], "-2.9%"),
    ("2026-12-01-h200-gate-power-capped-and-graphed/call2-history.tar.gz", range(0, 6), [6], "-2.9%"),
    ("2026-12-02-h200-gate-gpu-bound-heuristics/history.tar.gz", range(0, 6), [6], "-2.9%"),
    ("2026-12-02-h200-ab-and-change-points/step-history.tar.gz", range(0, 4), [4, 5, 6, 7], "-2.9%"),
    ("2026-11-30-h200/xdist-two-gpus-and-gpu-bound-overhead/xdist-history.tar.gz", range(0, 3), [], ""),
    ("2026-12-02-h200-zoo-gate-and-ab/gate-history.tar.gz", range(0, 6), [6], "-3.8%"),  # user-written jobs
]


def saved_histories(root: Path) -> str:
    rows = []
    for archive, unchanged, slowed, size in SAVED:
        with tempfile.TemporaryDirectory() as folder:
            with tarfile.open(root / archive) as opened:
                opened.extractall(folder, filter="data")
            history = load(Path(folder))
            for name in dict.fromkeys(n for r in history.runs for n in r.scenarios):
                samples = history.samples(name)
                steady = [samples[i] for i in unchanged if i < len(samples)]
                for which in ("robust", "plain"):
                    with (plain_gate() if which == "plain" else contextlib.nullcontext(gate.Policy())) as policy:
                        # every unchanged run against the other unchanged runs (A/A), each slowed run against them
                        aa = [gate.decide(run, [r for r in steady if r is not run], policy) for run in steady]
                        hit = [gate.decide(samples[i], steady, policy) for i in slowed if i < len(samples)]
                    if which == "robust":
                        row = [archive.split("/")[0], name.split("::")[-1]]
                    row += [f"{sum(v.failed for v in aa)} / {len(aa)}",
                            ", ".join(sorted({v.verdict for v in aa})),
                            (f"{size}: " + ", ".join(v.verdict for v in hit)) if hit else "-"]
                    if which == "robust":
                        left = {run: why for v in aa + hit for run, why in v.left_out.items()}
                        row.append("; ".join(f"{run.split('_')[0]}: {why}" for run, why in sorted(left.items())) or "-")
                rows.append(row)
    headers = ["results", "scenario", "A/A regressed", "A/A verdicts", "slowed runs", "left out (robust)",
               "plain: A/A regressed", "A/A verdicts", "slowed runs"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--only", choices=("simulation", "saved"))
    args = parser.parse_args()
    if args.only != "saved":
        print(simulation(args.trials), "\n")
    if args.only != "simulation":
        print(saved_histories(Path(__file__).resolve().parents[1] / "docs" / "results"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
