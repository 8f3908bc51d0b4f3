"""Cost of the telemetry sampler on measured throughput: the same scenario with the sampler on and off,
alternating, several times each.

    python ci/telemetry_overhead.py --json OUT.json [--repeats 3]
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

from pytest_gpucolloc import Workload, telemetry
from pytest_gpucolloc.modes.naive import NaiveMode
from pytest_gpucolloc.scenario import Settings, run_scenario
from pytest_gpucolloc.session import standalone_target


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    settings = Settings(rounds=5, round_s=1.0, warmup_s=3.0, warmup_steps=20, timeout_s=300)
    # Launch-bound and CPU-sensitive: the scenario most exposed to a busy controller.
    workloads = [Workload("resnet26-cifar10", batch_size=32)] * 2
    runs = {"on": [], "off": []}
    for _ in range(args.repeats):
        for state in ("off", "on"):
            with standalone_target("cuda") as target:
                sampler = telemetry.sampler_factory(target.gpu.uuid) if state == "on" else None
                result = run_scenario(workloads, NaiveMode(), target, settings, target.scratch, sampler)
            runs[state].append(result.aggregate_throughput)
            print(f"sampler {state}: {result.aggregate_throughput:,.0f} samples/s", flush=True)
    on, off = statistics.median(runs["on"]), statistics.median(runs["off"])
    summary = {"scenario": "naive 2x resnet26-cifar10/bs32, 5 rounds x 1 s", "runs": runs,
               "median_on": on, "median_off": off, "cost_pct": 100 * (off - on) / off,
               "spread_off_pct": 100 * (max(runs["off"]) - min(runs["off"])) / off}
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
