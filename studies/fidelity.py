"""Harness fidelity: one worker measured through the suite vs the hand-written loop (studies/raw_loop.py),
same model, same GPU, same call, alternating so drift hits both alike.

    python studies/fidelity.py --json OUT.json [--repeats 2]
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from pytest_gpucolloc import Workload
from pytest_gpucolloc.device import standalone_target
from pytest_gpucolloc.modes.naive import NaiveMode
from pytest_gpucolloc.scenario import Settings, run_scenario

CASES = [("resnet26", "resnet26-cifar10", 128), ("resnet50", "resnet50-imagenet64", 32)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--round-seconds", type=float, default=2.0)
    args = parser.parse_args()
    settings = Settings(rounds=args.rounds, round_s=args.round_seconds, warmup_s=args.warmup,
                        warmup_steps=20, timeout_s=300)
    rows = []
    for arch, name, batch in CASES:
        raw, suite = [], []
        for _ in range(args.repeats):
            done = subprocess.run([sys.executable, str(Path(__file__).with_name("raw_loop.py")), arch, str(batch),
                                   "--warmup", str(args.warmup), "--seconds", str(args.rounds * args.round_seconds)],
                                  capture_output=True, text=True, check=True)
            raw.append(json.loads(done.stdout.strip().splitlines()[-1])["samples_per_s"])
            with standalone_target("cuda") as target:
                result = run_scenario([Workload(name, batch_size=batch)], NaiveMode(), target, settings, target.scratch)
            suite.append(result.aggregate_throughput)
        ratio = statistics.median(suite) / statistics.median(raw)
        rows.append({"workload": f"{name}/bs{batch}", "raw_samples_per_s": raw, "suite_samples_per_s": suite,
                     "ratio_suite_over_raw": ratio, "cpu_placement": result.cpu_note})
        print(f"{name}/bs{batch}: raw {statistics.median(raw):,.0f}  suite {statistics.median(suite):,.0f}  "
              f"ratio {ratio:.3f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
