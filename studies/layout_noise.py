"""Is a host-bound eager model's speed a draw of each process's memory layout? (docs/serving.md, "Where the noise
lives": a service's p50 sits at a level per process, or per fork server, and its latency is Python issuing kernels.)

    python studies/layout_noise.py [--processes 12] [--json OUT]

Runs the same small eager model (10 blocks of Linear 64 + GELU + LayerNorm, batch 1, one thread, on core 0: all host
overhead, no GPU) in fresh interpreters, alternating three ways of starting them: plain (address space layout
randomised, as every worker is), with randomisation off (``setarch -R``: every process gets the same layout), and
forked from one parent that imported torch (as ``--colloc-spawn=forkserver``'s workers are; a new parent per pair).
Each process times 5 rounds of 400 forward passes after 300 of warm-up. Prints, per way, the spread between
processes (CV of their medians) against the spread between rounds within a process, and how far apart processes
started next to each other are: two forks of one parent, two of different parents, two fresh ones.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

CHILD = r"""
import os, sys, time, json
os.sched_setaffinity(0, {0})
import torch
torch.set_num_threads(1)

def measure():
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64)) for _ in range(10)]
    model = torch.nn.Sequential(*blocks).eval()
    x = torch.randn(1, 8, 64)
    rounds = []
    with torch.no_grad():
        for _ in range(300):
            model(x)
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(400):
                model(x)
            rounds.append((time.perf_counter() - start) / 400 * 1e6)
    return rounds

if sys.argv[1] == "fork":  # a parent that imported torch forks two children, as a fork server forks workers
    found = []
    for _ in range(2):
        read, write = os.pipe()
        if os.fork() == 0:
            os.write(write, json.dumps(measure()).encode())
            os._exit(0)
        os.close(write)
        found.append(json.loads(os.read(read, 65536)))
        os.wait()
    print(json.dumps(found))
else:
    print(json.dumps([measure()]))
"""


def run(way: str) -> list[list[float]]:
    command = [sys.executable, "-c", CHILD, way]
    if way == "no-aslr":
        command = ["setarch", platform.machine(), "-R", *command]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=12, help="processes per way (default 12)")
    parser.add_argument("--json", help="write every process's rounds here")
    args = parser.parse_args()
    ways = ("plain", "no-aslr", "fork")
    found: dict[str, list[list[float]]] = {way: [] for way in ways}
    for i in range(args.processes):
        for way in ways if i % 2 == 0 else reversed(ways):  # alternate: drift touches every way alike
            if way != "fork" or i % 2 == 0:  # a fork parent gives two processes
                found[way] += run(way)
    print("| way | processes | median us a pass | CV between processes | range | median CV between rounds |")
    print("|---|---|---|---|---|---|")
    for way, processes in found.items():
        medians = [statistics.median(rounds) for rounds in processes]
        within = statistics.median(statistics.stdev(r) / statistics.mean(r) for r in processes)
        print(f"| {way} | {len(medians)} | {statistics.median(medians):.1f} | "
              f"{statistics.stdev(medians) / statistics.mean(medians):.1%} | "
              f"{min(medians):.1f}-{max(medians):.1f} | {within:.1%} |")
    def gap(processes: list[list[float]], first: int) -> float:  # median gap of neighbours (first, first + 1), ...
        medians = [statistics.median(rounds) for rounds in processes]
        return statistics.median(abs(medians[i] / medians[i + 1] - 1) for i in range(first, len(medians) - 1, 2))

    print(f"\nmedian gap between neighbours in time: forked siblings (one parent) {gap(found['fork'], 0):.1%}, forks "
          f"of two parents {gap(found['fork'], 1):.1%}, plain {gap(found['plain'], 0):.1%}, no-aslr "
          f"{gap(found['no-aslr'], 0):.1%}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"host": os.uname().nodename, "processes": found}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
