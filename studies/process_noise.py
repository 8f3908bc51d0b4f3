"""Where a job's between-process noise comes from: the same training step (the suite's own model code) in fresh
processes, one at a time, alternating variants, with what the host did meanwhile (the CPU time stolen by the
hypervisor, the process's involuntary context switches, the pinned cores' clock).

--compare cudnn (default): cuDNN autotuning on / off, pinned to two cores. If autotuning picks different
convolution algorithms in different processes (its timings are noisy, and a graph freezes the choice), turning it
off should shrink the spread between processes.
--compare cpus: autotuning on, pinned to one core, two cores or eight. A launch-bound eager job is one CPU thread
issuing kernels (and autograd's device thread): if the spread comes from threads sharing cores, more cores shrink it;
if from the host (stolen time, clock changes), they do not.

    python studies/process_noise.py --workload resnet26-cifar10 --batch 128 [--graph] [--compare cpus] \
        --processes 8 --json OUT
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

# Each variant: the workload's cudnn_autotune (torch.backends.cudnn.benchmark) and the cores the process is pinned to.
COMPARISONS = {
    "cudnn": {"autotune": (True, {2, 3}), "heuristics": (False, {2, 3})},
    "cpus": {"one-core": (True, {2}), "two-cores": (True, {2, 3}), "eight-cores": (True, set(range(2, 10)))},
}


def host_counters(cores: set[int]) -> dict:
    """Ticks stolen from this virtual machine (all CPUs), the process's involuntary context switches, and the mean
    clock of the pinned cores as /proc/cpuinfo reports it."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    mhz = [float(line.split(":")[1]) for line in Path("/proc/cpuinfo").read_text().splitlines()
           if line.startswith("cpu MHz")]
    return {"steal": fields[7] if len(fields) > 7 else 0, "total": sum(fields),
            "nivcsw": resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw,
            "mhz": statistics.fmean(mhz[c] for c in cores if c < len(mhz)) if mhz else None}


def child(args) -> None:
    autotune, cores = COMPARISONS[args.compare][args.variant]
    os.sched_setaffinity(0, cores)
    import torch

    from pytest_gpucolloc import models
    from pytest_gpucolloc.workloads import Workload

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    job = Workload(args.workload, batch_size=args.batch, cuda_graph=args.graph,
                   options={"cudnn_autotune": autotune})
    step = models.build(job, device)
    if isinstance(step, models.GraphedStep):
        step.capture()
    end = time.monotonic() + args.warmup
    while time.monotonic() < end:
        step.train_step()
    torch.cuda.synchronize()
    rounds, hosts = [], []
    for _ in range(args.rounds):
        before = host_counters(cores)
        start, steps = time.monotonic(), 0
        while time.monotonic() - start < 1.0:
            step.train_step()
            steps += 1
        torch.cuda.synchronize()
        rounds.append(steps * args.batch / (time.monotonic() - start))
        after = host_counters(cores)
        hosts.append({"steal_share": (after["steal"] - before["steal"]) / max(1, after["total"] - before["total"]),
                      "involuntary_switches": after["nivcsw"] - before["nivcsw"], "mhz": after["mhz"]})
    print(json.dumps({"variant": args.variant, "rounds": rounds, "host": hosts}))


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="resnet26-cifar10")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--graph", action="store_true")
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="cudnn")
    parser.add_argument("--processes", type=int, default=8, help="fresh processes per variant")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0
    variants = COMPARISONS[args.compare]
    per_process: dict[str, list[float]] = {v: [] for v in variants}
    round_cvs: dict[str, list[float]] = {v: [] for v in variants}
    hosts: dict[str, list[dict]] = {v: [] for v in variants}
    base = [sys.executable, __file__, "--child", "--compare", args.compare, "--workload", args.workload,
            "--batch", str(args.batch),
            "--rounds", str(args.rounds), "--warmup", str(args.warmup)] + (["--graph"] if args.graph else [])
    for _ in range(args.processes):
        for variant in variants:  # alternated, so drift over the call touches each alike
            out = subprocess.run(base + ["--variant", variant], capture_output=True, text=True, timeout=300)
            if out.returncode:
                print(out.stderr[-2000:], file=sys.stderr)
                return 1
            result = json.loads(out.stdout.strip().splitlines()[-1])
            rounds = result["rounds"]
            per_process[variant].append(statistics.fmean(rounds))
            round_cvs[variant].append(cv(rounds))
            hosts[variant] += result["host"]
            steal = max(h["steal_share"] for h in result["host"])
            print(f"{variant}: {per_process[variant][-1]:,.0f} samples/s (round CV {round_cvs[variant][-1]:.2%}, "
                  f"most stolen in a round {steal:.1%})", flush=True)
    summary = {v: {"processes": per_process[v], "mean": statistics.fmean(per_process[v]),
                   "between_process_cv": cv(per_process[v]), "round_cv_median": statistics.median(round_cvs[v]),
                   "steal_share_max": max(h["steal_share"] for h in hosts[v]),
                   "involuntary_switches_per_round_median": statistics.median(
                       h["involuntary_switches"] for h in hosts[v]),
                   "mhz": [h["mhz"] for h in hosts[v]]}
               for v in variants}
    for v, s in summary.items():
        print(f"{v}: mean {s['mean']:,.0f} samples/s, between-process CV {s['between_process_cv']:.2%}, "
              f"round CV {s['round_cv_median']:.2%}, stolen at most {s['steal_share_max']:.1%} of a round, "
              f"{s['involuntary_switches_per_round_median']:.0f} involuntary switches a round")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "json"},
                                         "summary": summary}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
