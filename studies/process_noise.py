"""Where a job's between-process noise comes from: the same training step (the suite's own model code) in fresh
processes, one at a time, alternating variants (cuDNN autotuning on / off), each pinned to two cores. If
autotuning picks different convolution algorithms in different processes (its timings are noisy, the more so
when the job is launch-bound, and a graph freezes the choice), turning it off should shrink the spread between
processes.

    python studies/process_noise.py --workload resnet26-cifar10 --batch 128 [--graph] --processes 8 --json OUT
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = {"autotune": True, "heuristics": False}  # the workload's cudnn_autotune (torch.backends.cudnn.benchmark)


def child(args) -> None:
    os.sched_setaffinity(0, {2, 3})
    import torch

    from pytest_gpucolloc import models
    from pytest_gpucolloc.workloads import Workload

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    job = Workload(args.workload, batch_size=args.batch, cuda_graph=args.graph,
                   options={"cudnn_autotune": VARIANTS[args.variant]})
    step = models.build(job, device)
    if isinstance(step, models.GraphedStep):
        step.capture()
    end = time.monotonic() + args.warmup
    while time.monotonic() < end:
        step.train_step()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(args.rounds):
        start, steps = time.monotonic(), 0
        while time.monotonic() - start < 1.0:
            step.train_step()
            steps += 1
        torch.cuda.synchronize()
        rounds.append(steps * args.batch / (time.monotonic() - start))
    print(json.dumps({"variant": args.variant, "rounds": rounds}))


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="resnet26-cifar10")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--graph", action="store_true")
    parser.add_argument("--processes", type=int, default=8, help="fresh processes per variant")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="autotune", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0
    per_process: dict[str, list[float]] = {v: [] for v in VARIANTS}
    round_cvs: dict[str, list[float]] = {v: [] for v in VARIANTS}
    base = [sys.executable, __file__, "--child", "--workload", args.workload, "--batch", str(args.batch),
            "--rounds", str(args.rounds), "--warmup", str(args.warmup)] + (["--graph"] if args.graph else [])
    for _ in range(args.processes):
        for variant in VARIANTS:  # alternated, so drift over the call touches both alike
            out = subprocess.run(base + ["--variant", variant], capture_output=True, text=True, timeout=300)
            if out.returncode:
                print(out.stderr[-2000:], file=sys.stderr)
                return 1
            rounds = json.loads(out.stdout.strip().splitlines()[-1])["rounds"]
            per_process[variant].append(statistics.fmean(rounds))
            round_cvs[variant].append(cv(rounds))
            print(f"{variant}: {per_process[variant][-1]:,.0f} samples/s (round CV {round_cvs[variant][-1]:.2%})",
                  flush=True)
    summary = {v: {"processes": per_process[v], "mean": statistics.fmean(per_process[v]),
                   "between_process_cv": cv(per_process[v]), "round_cv_median": statistics.median(round_cvs[v])}
               for v in VARIANTS}
    for v, s in summary.items():
        print(f"{v}: mean {s['mean']:,.0f} samples/s, between-process CV {s['between_process_cv']:.2%}, "
              f"round CV {s['round_cv_median']:.2%}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "json"},
                                         "summary": summary}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
