"""Cost of the telemetry sampler on measured throughput, paired within one run.

Separate runs of the same scenario differ by far more than 0.5% on a shared machine, so comparing a run
with the sampler against a run without cannot resolve a 0.5% cost. Here one scenario is measured for many
rounds and the sampler is switched on for every other round (ABBA order, so a slow drift cancels): the
same workers, processes and cuDNN choices are compared with themselves. A new sampler is started for each
pair of sampled rounds, so its start-up is counted too (the real sampler starts once per scenario).

    python studies/telemetry_overhead.py --json OUT.json [--rounds 80] [--round-seconds 1]
"""
import argparse
import contextlib
import faulthandler
import json
import statistics
import sys
from pathlib import Path

from scipy import stats

from pytest_gpucolloc import Workload, telemetry
from pytest_gpucolloc.device import standalone_target
from pytest_gpucolloc.modes.mps import MpsMode
from pytest_gpucolloc.modes.naive import NaiveMode
from pytest_gpucolloc.scenario import Settings, run_scenario

SCENARIOS = {
    # GPU-bound: rounds agree to ~0.2%, so a small cost on the GPU side is resolved.
    "naive 1x resnet152-imagenet/bs128": (NaiveMode, [Workload("resnet152-imagenet", batch_size=128)]),
    # Launch-bound and CPU-sensitive: the most exposed to a busy controller, but noisy (5-10% per round).
    "naive 2x resnet26-cifar10/bs32": (NaiveMode, [Workload("resnet26-cifar10", batch_size=32)] * 2),
    "mps 7x resnet26-cifar10/bs128": (MpsMode, [Workload("resnet26-cifar10", batch_size=128)] * 7),
}


def sampled(round_index: int) -> bool:
    """ABBA: off, on, on, off, off, on, on, off, ..."""
    return (round_index + 1) // 2 % 2 == 1


class AlternatingSampler:
    """One telemetry sampler per block of sampled rounds (1-2, 5-6, ...): never two at once."""

    def __init__(self, gpu_uuid: str, window: tuple[float, float], pids, rounds: int):
        start, end = window
        length = (end - start) / rounds
        blocks = [k for k in range(rounds) if sampled(k) and not (k > 0 and sampled(k - 1))]
        self.samplers = [telemetry.Sampler(gpu_uuid, (start + k * length, start + min(k + 2, rounds) * length), pids)
                         for k in blocks]
        self.stack = contextlib.ExitStack()

    def __enter__(self):
        for sampler in self.samplers:
            self.stack.enter_context(sampler)
        return None  # the scenario records no telemetry of its own

    def __exit__(self, *exc):
        self.stack.close()
        errors = [s.error for s in self.samplers if s.error]
        if errors:
            raise RuntimeError(f"sampler failed: {errors[0]}")
        if not all(s.instant for s in self.samplers):
            raise RuntimeError("a sampled round took no sample: the comparison would be meaningless")


def measure(name: str, rounds: int, round_s: float) -> dict:
    mode, workloads = SCENARIOS[name]
    settings = Settings(rounds=rounds, round_s=round_s, warmup_s=3.0, warmup_steps=20, timeout_s=300)
    with standalone_target("cuda") as target:
        factory = lambda window, pids, slots=(): AlternatingSampler(target.gpu.uuid, window, pids, rounds)  # noqa: E731
        result = run_scenario(workloads, mode(), target, settings, target.scratch, factory)
    on = [x for k, x in enumerate(result.aggregate_rounds) if sampled(k)]
    off = [x for k, x in enumerate(result.aggregate_rounds) if not sampled(k)]
    test = stats.ttest_ind(off, on, equal_var=False)
    interval = test.confidence_interval(0.95)
    mean_off = statistics.fmean(off)
    return {"scenario": f"{name}, {rounds} rounds x {round_s:g} s, sampler on in rounds 1,2,5,6,...",
            "mean_off": mean_off, "mean_on": statistics.fmean(on),
            "cost_pct": 100 * (mean_off - statistics.fmean(on)) / mean_off,
            "cost_pct_95ci": [100 * interval.low / mean_off, 100 * interval.high / mean_off],
            "round_cv_off_pct": 100 * statistics.stdev(off) / mean_off, "p_value": test.pvalue,
            "rounds_on": on, "rounds_off": off}


def main() -> int:
    faulthandler.enable()
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path)
    parser.add_argument("--rounds", type=int, default=80)
    parser.add_argument("--round-seconds", type=float, default=1.0)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), action="append")
    args = parser.parse_args()
    results = []
    for name in args.scenario or SCENARIOS:
        summary = measure(name, args.rounds, args.round_seconds)
        low, high = summary["cost_pct_95ci"]
        print(f"{name}: sampler off {summary['mean_off']:,.0f}, on {summary['mean_on']:,.0f} samples/s; "
              f"cost {summary['cost_pct']:+.2f}% (95% CI {low:+.2f}% .. {high:+.2f}%), "
              f"round CV {summary['round_cv_off_pct']:.1f}%", flush=True)
        results.append(summary)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
