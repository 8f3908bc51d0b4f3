"""How the regression gate behaves on synthetic histories shaped like the H200 machine's noise.

    python studies/gate_simulation.py [--trials 2000] [--markdown]
Noise profiles: within-run CV of rounds and between-run CV of run means. 'gpu-bound' and 'launch-bound'
use FIELD_NOTES' round-to-round CVs (1%, 5-15%); 'h200-measured' uses call 3's numbers (rounds 5-7%,
runs of one job 18% apart, i.e. a between-run CV near 9%).
"""
import argparse
import sys
from pathlib import Path

from tabulate import tabulate

from pytest_gpucolloc.gate import Policy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the synthetic histories: tests/doubles
from doubles.gatesim import detection_rate  # noqa: E402

PROFILES = [
    ("gpu-bound", 0.01, 0.0),
    ("gpu-bound, 0.5% run-to-run", 0.01, 0.005),
    ("launch-bound 5%", 0.05, 0.0),
    ("launch-bound 10%", 0.10, 0.0),
    ("launch-bound 15%", 0.15, 0.0),
    ("launch-bound 10%, 2% run-to-run", 0.10, 0.02),
    ("h200-measured (6% rounds, 9% runs)", 0.06, 0.09),
]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    policy = Policy()
    rows = []
    for name, within, between in PROFILES:
        aa = detection_rate(0.0, within, between, trials=args.trials, seed=1)
        five = detection_rate(0.05, within, between, trials=args.trials, seed=2)
        at_mde = detection_rate(min(aa["median_mde"], 0.9), within, between, trials=args.trials, seed=3)
        two = detection_rate(0.02, within, between, trials=args.trials, seed=4)
        rows.append([name, f"{within:.0%}", f"{between:.1%}", f"{aa['rate']:.2%}", f"{two['rate']:.1%}",
                     f"{five['rate']:.1%}", f"{aa['median_mde']:.1%}", f"{at_mde['rate']:.1%}"])
    print(f"gate defaults: threshold {policy.threshold:.0%}, alpha {policy.alpha}, power {policy.power}, "
          f"{policy.runs} baseline runs, 10 rounds per run, {args.trials} trials per cell")
    print(tabulate(rows, headers=["noise profile", "round CV", "run CV", "A/A false alarms", "2% drop caught",
                                  "5% drop caught", "reported MDE", "caught at the reported MDE"],
                   tablefmt="github" if args.markdown else "simple"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
