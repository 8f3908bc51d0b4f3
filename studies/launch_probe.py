"""What one kernel launch costs a process under two sharing modes (default naive vs mps), to explain why a
launch-bound training job alone or with one or two others is not faster under MPS.

Each repeat starts, for each mode in turn, one fresh probe process with exactly the environment that mode gives
its workers (under mps: a client of a private daemon, verified as the suite verifies workers) and measures:
- enqueue_us: CPU time per launch of a tiny kernel (x.add_(1) on one element, 20,000 in a row, no sync);
- per_kernel_us: the same loop until the GPU has finished it (throughput of back-to-back tiny kernels);
- round_trip_us: one launch plus synchronize (median of 2,000);
- step_s and kernels_per_step: the training step of --workload alone, synchronised after every step (median
  over --seconds (3) after warm-up; kernel launches per step counted with torch.profiler), so a per-launch
  difference can be scaled to a step; step_issue_s and step_drain_s split it into the CPU's time to issue the step
  and the GPU's tail after the last launch;
- pipelined_step_s: steps issued back to back for --seconds with one synchronise at the end, as workers run.

    python studies/launch_probe.py --modes naive,mps --repeats 4 --json OUT.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from mode_ab import ab_parser, compare, machine_of, two_modes  # studies/ is on sys.path when run as a script

from pytest_gpucolloc import Workload, protocol
from pytest_gpucolloc.cpu_affinity import CpuPolicy, assign_cpus
from pytest_gpucolloc.device import standalone_target
from pytest_gpucolloc.environment import base_environment
from pytest_gpucolloc.modes import MODES

LAUNCHES = 20_000
METRICS = ("enqueue_us", "per_kernel_us", "round_trip_us", "step_s", "step_issue_s", "step_drain_s",
           "pipelined_step_s", "kernels_per_step")


def probe(device: str, workload: Workload, cpus: list[int], seconds: float) -> None:
    """The probe process, set up as a worker is (cores, threads): report readiness, wait until the controller has
    checked how it is attached, measure (each timed window ``seconds`` long, the warm-up two thirds of that)."""
    os.sched_setaffinity(0, cpus)
    import torch

    from pytest_gpucolloc.models import build
    from pytest_gpucolloc.worker import training_device

    dev, sync = training_device(torch, device, len(cpus))
    cuda = dev.type == "cuda"
    x = torch.zeros(1, device=dev)
    sync()
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count if cuda else None
    print(json.dumps({"pid": os.getpid(), "sm_count": sm_count}), flush=True)
    sys.stdin.readline()

    for _ in range(2_000):  # warm-up
        x.add_(1)
    sync()
    enqueue, per_kernel = [], []
    for _ in range(5):
        begin = time.perf_counter()
        for _ in range(LAUNCHES):
            x.add_(1)
        queued = time.perf_counter()
        sync()
        done = time.perf_counter()
        enqueue.append((queued - begin) / LAUNCHES * 1e6)
        per_kernel.append((done - begin) / LAUNCHES * 1e6)
    round_trip = []
    for _ in range(2_000):
        begin = time.perf_counter()
        x.add_(1)
        sync()
        round_trip.append((time.perf_counter() - begin) * 1e6)

    step = build(workload, dev)
    warm_until = time.perf_counter() + 2 * seconds / 3
    while time.perf_counter() < warm_until:
        step.train_step()
    sync()
    # A step that waits for the GPU at its end (as a loop that reads the loss every step does), split into the
    # CPU's time to issue it and the GPU's tail after the last launch; then steps issued back to back with one
    # synchronise at the end (as the suite's workers run).
    step_times, issue_times, drain_times = [], [], []
    measure_until = time.perf_counter() + seconds
    while time.perf_counter() < measure_until:
        begin = time.perf_counter()
        step.train_step()
        issued = time.perf_counter()
        sync()
        done = time.perf_counter()
        step_times.append(done - begin)
        issue_times.append(issued - begin)
        drain_times.append(done - issued)
    steps, begin = 0, time.perf_counter()
    while time.perf_counter() < begin + seconds:
        step.train_step()
        steps += 1
    sync()
    pipelined_step_s = (time.perf_counter() - begin) / steps
    print(json.dumps({"enqueue_us": statistics.median(enqueue), "per_kernel_us": statistics.median(per_kernel),
                      "round_trip_us": statistics.median(round_trip), "step_s": statistics.median(step_times),
                      "step_issue_s": statistics.median(issue_times), "step_drain_s": statistics.median(drain_times),
                      "pipelined_step_s": pipelined_step_s,
                      "kernels_per_step": kernels_per_step(step, cuda)}), flush=True)


def kernels_per_step(step, cuda: bool) -> float | None:
    """Kernel launches of one training step, counted from the CUDA runtime/driver calls torch.profiler sees."""
    if not cuda:
        return None
    from torch.profiler import ProfilerActivity, profile

    steps = 5
    try:  # CUPTI may refuse to trace (e.g. some MPS setups): then the count comes from the other mode
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step.train_step()
    except RuntimeError as error:
        print(f"kernel count unavailable: {error}", file=sys.stderr)
        return None
    launches = sum(e.count for e in prof.key_averages() if "LaunchKernel" in e.key)
    return launches / steps or None


def run_probe(mode, device: str, workload: Workload, seconds: float) -> dict:
    """One probe process under ``mode``, attached as that mode attaches its workers."""
    with standalone_target(device) as target, mode.provision([workload], target) as prov:
        slot = prov.phases[0][0]
        env = {**base_environment(), **slot.env}
        cpus = assign_cpus(1, CpuPolicy()).cpus[0] or sorted(os.sched_getaffinity(0))  # as a lone worker's
        child = subprocess.Popen([sys.executable, __file__, "--child", "--device", device, "--workload",
                                  workload.model, "--batch", str(workload.batch_size),
                                  "--cpus", ",".join(map(str, cpus)), "--seconds", str(seconds)],
                                 env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            ready = json.loads(child.stdout.readline() or "null")
            if ready is None:
                raise RuntimeError(f"the probe exited with code {child.wait()} before it was ready")
            report = protocol.Ready(pid=ready["pid"], samples_per_step=1, warmup_steps=0, cpus=cpus,
                                    startup_phases_s={}, sm_count=ready["sm_count"])
            prov.check_workers([slot], [report])  # mps: a client of our daemon; naive: of none
            child.stdin.write("go\n")
            child.stdin.flush()
            result = json.loads(child.stdout.readline() or "null")
            if child.wait(timeout=120) != 0 or result is None:
                raise RuntimeError(f"the probe failed (exit code {child.returncode})")
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    return result


def main() -> int:
    parser = ab_parser(__doc__)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cpus", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=3.0, help="each timed window of the step (default 3)")
    args = parser.parse_args()
    workload = Workload(args.workload, batch_size=args.batch)
    if args.child:
        probe(args.device, workload, [int(c) for c in args.cpus.split(",")], args.seconds)
        return 0
    names = two_modes(parser, args.modes)
    where = machine_of(args.device, names)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for _ in range(args.repeats):
        for name in names:
            result = run_probe(MODES[name](), args.device, workload, args.seconds)
            runs[name].append(result)
            print(f"{name}: " + ", ".join(f"{k} {v:.4g}" for k, v in result.items() if v is not None), flush=True)
    summary = {"workload": workload.label, "repeats": args.repeats, "machine": where,
               "runs": runs, "metrics": {}}
    for metric in METRICS:
        values = {name: [r[metric] for r in runs[name] if r[metric] is not None] for name in names}
        if all(values.values()):
            summary["metrics"][metric] = compare(values)
    # How much of the step-time difference the per-launch difference alone would explain.
    metrics, (a, b) = summary["metrics"], names
    counts = [r["kernels_per_step"] for name in names for r in runs[name] if r["kernels_per_step"]]
    kernels = statistics.median(counts) if counts else None
    if kernels and "enqueue_us" in metrics and "step_s" in metrics:
        extra_s = (metrics["enqueue_us"]["medians"][b] - metrics["enqueue_us"]["medians"][a]) * 1e-6 * kernels
        summary["step_change_from_launch_cost_pct"] = 100 * extra_s / metrics["step_s"]["medians"][a]
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
