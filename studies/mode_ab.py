"""Two sharing modes on the same scenario, alternating A, B, A, B, ... in one call, so that a difference
between them is judged against their own run-to-run spread (single runs of a launch-bound job on a shared
machine differ by ~10%).

    python studies/mode_ab.py --modes naive,mps --workload resnet26-cifar10 --batch 32 --processes 1 --repeats 4
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

from scipy import stats

from pytest_gpucolloc import Workload, machine, telemetry
from pytest_gpucolloc.device import standalone_target
from pytest_gpucolloc.modes import MODES, parse_modes
from pytest_gpucolloc.scenario import Settings, run_scenario


def ab_parser(doc: str) -> argparse.ArgumentParser:
    """The options every A/B script shares: two modes, one workload, repeats, device, JSON output."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="naive,mps", help="two modes, comma-separated")
    parser.add_argument("--workload", default="resnet26-cifar10")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", type=Path)
    return parser


def two_modes(parser: argparse.ArgumentParser, text: str) -> list[str]:
    try:
        names = parse_modes(text)
    except ValueError as error:
        parser.error(str(error))
    if len(names) != 2:
        parser.error("--modes takes exactly two modes")
    return names


def machine_of(device: str, names: list[str]) -> dict:
    """What the script measures on (GPU, driver, versions), as a saved run's machine_info records it; exits
    with the reason when one of the modes cannot run there, before anything is started."""
    with standalone_target(device) as target:
        for name in names:
            if reason := MODES[name]().unavailable_reason(target):
                sys.exit(f"{name} cannot run here: {reason}")
        return machine.identity(target.gpu, None)


def compare(runs: dict[str, list[float]]) -> dict:
    """Medians of the two modes' runs, B relative to A, and a two-sided Mann-Whitney rank test."""
    (a_name, a), (b_name, b) = runs.items()
    return {"medians": {a_name: statistics.median(a), b_name: statistics.median(b)},
            "b_vs_a_pct": 100 * (statistics.median(b) / statistics.median(a) - 1),
            "mann_whitney_p": stats.mannwhitneyu(a, b, alternative="two-sided").pvalue}


def main() -> int:
    parser = ab_parser(__doc__)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    names = two_modes(parser, args.modes)
    where = machine_of(args.device, names)
    modes = [MODES[name]() for name in names]
    workloads = [Workload(args.workload, batch_size=args.batch)] * args.processes
    settings = Settings(rounds=args.rounds, round_s=1.0, warmup_s=2.0, warmup_steps=10, timeout_s=180)
    runs: dict[str, list[float]] = {name: [] for name in names}
    sm_activity: dict[str, list] = {name: [] for name in names}  # how busy the GPU was (NVML GPM)
    for _ in range(args.repeats):
        for name, mode in zip(names, modes):
            with standalone_target(args.device) as target:
                sampler = telemetry.sampler_factory(target.gpu) if target.gpu else None
                result = run_scenario(workloads, mode, target, settings, target.scratch, sampler)
            runs[name].append(result.aggregate_throughput)
            sm_activity[name].append(next((t.get("sm_activity_pct") for t in result.telemetry), None))
            print(f"{name}: {result.aggregate_throughput:,.0f} samples/s, SM activity {sm_activity[name][-1]}",
                  flush=True)
    summary = {"scenario": f"{args.processes}x {args.workload}/bs{args.batch}, {args.rounds} rounds x 1 s",
               "machine": where,
               "runs": runs, "sm_activity_pct": sm_activity, **compare(runs)}
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
