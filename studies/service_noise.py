"""Where a service's latency noise comes from: a user's service (zoo/services.py) at a fixed rate, alone, in fresh
processes one at a time, alternating variants, through the suite's own request schedule (serving.Requests,
serving.serve_rounds). Between sessions the decoder's p50 alone moved 6.0-8.9 ms (docs/serving.md): if a variant
shrinks the spread between processes, the noise lives where that variant differs.

Variants (``--variants``, in this order by default):
  five-cores   pinned to 5 cores, 5 threads (what --colloc-cpus=auto gives each of three workers on 16 cores)
  two-cores    pinned to 2 cores, 2 threads (what each of six workers gets: ab's two arms of three)
  one-core     pinned to one core, one thread
  spin         five cores; each wait for the next arrival spun, never slept (no idle core to wake)
  graphed      five cores; Workload(cuda_graph=True): the forward pass replayed as one CUDA graph (no launches)
  no-aslr      spin, started with address-space randomisation off and PYTHONHASHSEED=0 (every process one layout)
Per process: a warm-up at the rate, then rounds of 1 s; each round's p50/p90/p99, and the host-side time of
serve_step (its kernel launches, before synchronising) against the answered time, over 50 requests.

``--beside N`` runs each service process beside N of the zoo's GPU-bound transformer trainers under a private MPS
daemon (pinned to cores of their own, as --colloc-cpus=auto places them), started anew for each of ``--epochs``
epochs, the trainers' own start alternating plain and no-aslr: a level that moves between a service's processes
within an epoch lives in the service's process; one that moves only between epochs lives in the trainers'.

    python studies/service_noise.py --service decoder --batch 8 --rate 50 --processes 6 --json OUT.json
    python studies/service_noise.py --beside 2 --epochs 4 --processes 2 --variants spin,no-aslr,graphed --json OUT.json

``--orders`` (with ``--beside``) runs ``--processes`` trials per order instead, each with its trainers started anew:
the service's CUDA context (its MPS client) made before the trainers' (service-first), after them (trainers-first),
or at the same time (together, as a scenario's workers start): whether the order in which the clients connect sets
the service's level.

    python studies/service_noise.py --beside 2 --orders service-first,trainers-first,together --processes 4

``--daemon-cores free,core0`` (with ``--beside``) starts a new MPS daemon each epoch instead of one for the study,
alternating where it may run: anywhere (free, as a test's daemon starts), or on core 0 only (the controller's core,
which no worker gets); after each service process, the cores the daemon's threads last ran on and their CPU time.

    python studies/service_noise.py --beside 2 --epochs 8 --processes 2 --variants spin --daemon-cores free,core0
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIVE, TWO, ONE = set(range(1, 6)), {1, 2}, {1}
VARIANTS = {"five-cores": (FIVE, False, False), "two-cores": (TWO, False, False), "one-core": (ONE, False, False),
            "spin": (FIVE, True, False),
            "graphed": (FIVE, False, True), "no-aslr": (FIVE, True, False)}  # cores, spin, cuda_graph
TRAINER_CORES = [set(range(6, 11)), set(range(11, 16)), set(range(1, 6))]


def no_aslr(command: list[str]) -> tuple[list[str], dict[str, str]]:
    """The command started with one address-space layout for every process, and one hash seed."""
    return ["setarch", os.uname().machine, "-R", *command], {"PYTHONHASHSEED": "0"}


def trainer(args) -> None:
    """One of the zoo's GPU-bound trainers, stepping until killed."""
    os.sched_setaffinity(0, TRAINER_CORES[args.index] & os.sched_getaffinity(0) or os.sched_getaffinity(0))
    sys.path.insert(0, str(REPO))
    import torch

    from pytest_gpucolloc import models
    from pytest_gpucolloc.workloads import Workload

    torch.cuda.set_device(0)
    step = models.build(Workload("zoo.models:transformer_encoder", batch_size=32, precision="bf16"),
                        torch.device("cuda", 0))
    print("ready", flush=True)
    while True:
        step.train_step()


def child(args) -> None:
    cores, spin, graph = VARIANTS[args.variant]
    cores = cores & os.sched_getaffinity(0) or os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    sys.path.insert(0, str(REPO))  # zoo.services
    import torch

    from pytest_gpucolloc import models, serving
    from pytest_gpucolloc.workloads import Workload

    if spin:
        serving.SPIN_S = float("inf")  # wait_until never sleeps
    torch.set_num_threads(len(cores))
    cuda = args.device == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)
    if args.hold:  # its context made: wait for the trainers (--orders)
        print("context", flush=True)
        sys.stdin.readline()
    job = Workload(f"zoo.services:{args.service}", batch_size=args.batch, precision="bf16", rate=args.rate,
                   cuda_graph=graph and cuda)
    step = models.build(job, device)
    if isinstance(step, models.GraphedStep):
        step.capture()
    sync()
    requests = serving.Requests(step.train_step, sync, args.rate)
    serving.serve_rounds(requests, time.monotonic(), args.warmup, 1, 1)
    steal0, switches0 = steal(), resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
    _, latencies = serving.serve_rounds(requests, time.monotonic(), 1.0, args.rounds, 1)
    steal1, switches1 = steal(), resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
    merged = serving.new_histogram()
    rounds = []
    for entry in latencies:
        histogram = serving.decode(entry["histogram"])
        merged.add(histogram)
        rounds.append({f"p{q}": histogram.get_value_at_percentile(q) / 1000 for q in (50, 90, 99)})
    launch, answered = [], []
    for _ in range(50):
        begin = time.monotonic()
        step.train_step()
        launched = time.monotonic()
        sync()
        launch.append(launched - begin)
        answered.append(time.monotonic() - begin)
        time.sleep(1 / args.rate)
    print(json.dumps({"variant": args.variant, "cores": sorted(cores), "rounds": rounds,
                      **{f"p{q}": merged.get_value_at_percentile(q) / 1000 for q in (50, 90, 99)},
                      "launch_ms": 1000 * statistics.median(launch), "answered_ms": 1000 * statistics.median(answered),
                      "steal_share": (steal1[0] - steal0[0]) / max(1, steal1[1] - steal0[1]),
                      "involuntary_switches": switches1 - switches0}))


def steal() -> tuple[int, int]:
    """Ticks stolen from this virtual machine, and all ticks (all CPUs)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (fields[7] if len(fields) > 7 else 0), sum(fields)


def start_trainers(count: int, way: str, env: dict[str, str]) -> list[subprocess.Popen]:
    """``count`` trainers, each stepping once it prints "ready"; the warm-up is theirs before any service starts."""
    trainers = []
    for index in range(count):
        command = [sys.executable, __file__, "--trainer", "--index", str(index)]
        command, extra = no_aslr(command) if way == "no-aslr" else (command, {})
        trainers.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env={**env, **extra}))
    for process in trainers:
        if process.stdout is None or process.stdout.readline().strip() != "ready":
            raise RuntimeError("a trainer did not start")
    time.sleep(5.0)
    return trainers


def ordered_trial(order: str, base: list[str], args, env: dict[str, str]) -> dict:
    """One service process (spin) beside ``args.beside`` trainers, all started anew, contexts made in ``order``."""
    service = None

    def start_service() -> subprocess.Popen:
        return subprocess.Popen(base + ["--variant", "spin", "--hold"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, env=env)

    def connected(process: subprocess.Popen) -> None:
        if process.stdout is None or process.stdout.readline().strip() != "context":
            raise RuntimeError("the service did not make its context")

    trainers: list[subprocess.Popen] = []
    try:
        if order == "service-first":
            service = start_service()
            connected(service)
            trainers = start_trainers(args.beside, "plain", env)
        elif order == "trainers-first":
            trainers = start_trainers(args.beside, "plain", env)
            service = start_service()
            connected(service)
        else:  # together: every client connects at once, as a scenario's workers do
            service = start_service()
            trainers = start_trainers(args.beside, "plain", env)
            connected(service)
        assert service.stdin is not None and service.stdout is not None
        service.stdin.write("go\n")
        service.stdin.flush()
        out = service.stdout.read()
        if service.wait(timeout=300):
            raise RuntimeError(f"the service failed ({order})")
        return {**json.loads(out.strip().splitlines()[-1]), "order": order}
    finally:
        for process in trainers + ([service] if service else []):
            process.kill()
            process.wait()


def start_daemon(cores: str | None):
    """A private MPS daemon, started from this process pinned as named (its server inherits the control's cores)."""
    from pytest_gpucolloc.mps_daemon import MpsDaemon

    mine = os.sched_getaffinity(0)
    if cores == "core0":
        os.sched_setaffinity(0, {0})
    try:
        return MpsDaemon(Path(tempfile.mkdtemp(prefix="noise-mps-")), None).start()
    finally:
        os.sched_setaffinity(0, mine)


def daemon_threads(daemon) -> list[dict]:
    """Each thread of the daemon's processes (control and server): the core it last ran on, its CPU seconds."""
    tick, threads = os.sysconf("SC_CLK_TCK"), []
    for pid in daemon.daemon_pids():
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # ended meanwhile
                continue
            threads.append({"pid": pid, "tid": int(task.name), "core": int(fields[36]),
                            "cpu_s": (int(fields[11]) + int(fields[12])) / tick})
    return threads


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--service", default="decoder", choices=["decoder", "vit"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rate", type=float, default=50)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--processes", type=int, default=5, help="fresh processes per variant")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--minutes", type=float, default=8.0, help="no process starts after this long")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--beside", type=int, default=0, choices=[0, 1, 2, 3], help="trainers beside, under MPS")
    parser.add_argument("--epochs", type=int, default=1, help="with --beside: trainers started anew this often")
    parser.add_argument("--daemon-cores", help="with --beside: a new MPS daemon each epoch, placed as named in turn")
    parser.add_argument("--orders", help="with --beside: trials per order of the clients' connections (see above)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trainer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0
    if args.trainer:
        trainer(args)
        return 0
    variants = args.orders.split(",") if args.orders else args.variants.split(",")
    unknown = set(variants) - ({"service-first", "trainers-first", "together"} if args.orders else set(VARIANTS))
    if args.orders and not args.beside:
        parser.error("--orders needs --beside")
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    deadline = time.monotonic() + 60 * args.minutes
    processes: dict[str, list[dict]] = {v: [] for v in variants}
    base = [sys.executable, __file__, "--child", "--service", args.service, "--batch", str(args.batch),
            "--rate", str(args.rate), "--rounds", str(args.rounds), "--warmup", str(args.warmup),
            "--device", args.device]
    placements = args.daemon_cores.split(",") if args.daemon_cores else [None]
    if set(placements) - {None, "free", "core0"}:
        parser.error("--daemon-cores takes free and core0")
    daemon = start_daemon(None) if args.beside else None
    env = {**os.environ, **(daemon.client_env() if daemon else {})}
    try:
        for trial in range(args.processes if args.orders else 0):
            for order in variants:  # alternated
                if time.monotonic() > deadline:
                    break
                result = ordered_trial(order, base, args, env)
                result.update(epoch=trial, trainers="plain")
                processes[order].append(result)
                print(f"trial {trial} {order}: p50 {result['p50']:.2f} ms, p90 {result['p90']:.2f}, p99 "
                      f"{result['p99']:.2f}; rounds' p50 {[round(r['p50'], 2) for r in result['rounds']]}", flush=True)
        for epoch in range(0 if args.orders else args.epochs):
            placement = placements[epoch % len(placements)]
            if args.daemon_cores and daemon:  # a new daemon each epoch
                daemon.stop()
                daemon = start_daemon(placement)
                env = {**os.environ, **daemon.client_env()}
            trainers_way = "no-aslr" if epoch % 2 and not args.daemon_cores else "plain"
            trainers = start_trainers(args.beside, trainers_way, env)
            try:
                for _ in range(args.processes):
                    if time.monotonic() > deadline:
                        break
                    for variant in variants:  # alternated, so drift over the call touches each alike
                        command, extra = no_aslr(base + ["--variant", variant]) if variant == "no-aslr" else (
                            base + ["--variant", variant], {})
                        out = subprocess.run(command, capture_output=True, text=True, timeout=300,
                                             env={**env, **extra})
                        if out.returncode:
                            print(out.stderr[-3000:], file=sys.stderr)
                            return 1
                        result = json.loads(out.stdout.strip().splitlines()[-1])
                        result.update(epoch=epoch, trainers=trainers_way if args.beside else None, daemon=placement,
                                      daemon_threads=daemon_threads(daemon) if daemon else [])
                        processes[variant].append(result)
                        threads = result["daemon_threads"]
                        print(f"epoch {epoch} ({trainers_way} trainers x{args.beside}, daemon {placement}; its threads "
                              f"on cores {sorted({t['core'] for t in threads})}, "
                              f"{sum(t['cpu_s'] for t in threads):.1f} CPU s) {variant}: p50 "
                              f"{result['p50']:.2f} ms, p90 {result['p90']:.2f}, p99 {result['p99']:.2f}; rounds' p50 "
                              f"{[round(r['p50'], 2) for r in result['rounds']]}; serve_step launches "
                              f"{result['launch_ms']:.2f} ms of {result['answered_ms']:.2f} ms answered; stolen "
                              f"{result['steal_share']:.1%}", flush=True)
            finally:
                for process in trainers:
                    process.kill()
                    process.wait()
    finally:
        if daemon:
            daemon.stop()
    summary = {}
    for variant, results in processes.items():
        if not results:
            continue
        p50s = [r["p50"] for r in results]
        summary[variant] = {
            "processes": len(results), "p50_ms": p50s, "p50_mean": statistics.fmean(p50s),
            "p50_between_process_cv": cv(p50s), "p90_between_process_cv": cv([r["p90"] for r in results]),
            "p50_round_cv_median": statistics.median(cv([x["p50"] for x in r["rounds"]]) for r in results),
            "launch_ms_median": statistics.median(r["launch_ms"] for r in results),
            "answered_ms_median": statistics.median(r["answered_ms"] for r in results),
            "steal_share_max": max(r["steal_share"] for r in results)}
        if args.daemon_cores:  # the service's p50 by where its daemon ran
            summary[variant]["p50_by_daemon"] = {p: [round(r["p50"], 3) for r in results if r.get("daemon") == p]
                                                 for p in placements}
        epochs = [[r["p50"] for r in results if r["epoch"] == e] for e in range(args.epochs)]
        epochs = [e for e in epochs if e]
        if len(epochs) > 1:  # where the level lives: between a service's processes, or between trainers' epochs
            summary[variant].update(
                p50_within_epoch_cv=statistics.fmean(cv(e) for e in epochs),
                p50_between_epoch_cv=cv([statistics.fmean(e) for e in epochs]))
        s = summary[variant]
        print(f"{variant}: p50 {s['p50_mean']:.2f} ms mean of {len(results)} processes, between processes CV "
              f"{s['p50_between_process_cv']:.1%} (p90 {s['p90_between_process_cv']:.1%}), rounds CV "
              f"{s['p50_round_cv_median']:.1%}; launches {s['launch_ms_median']:.2f} of {s['answered_ms_median']:.2f} "
              f"ms; stolen at most {s['steal_share_max']:.1%}" + (f"; p50 by daemon {s['p50_by_daemon']}"
                                                                     if "p50_by_daemon" in s else ""))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "json"},
                                         "summary": summary, "processes": processes}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
