"""Worker process: one training job of a scenario.

Started by ``pool.py`` as ``python -m pytest_gpucolloc.worker`` with an explicit environment.
Protocol: the first stdin line is the job spec (JSON); messages go out as JSON lines on the file
descriptor named by ``GPUCOLLOC_MSG_FD``; further stdin lines are commands.

    -> {"event": "ready", ...}        after warm-up; the worker keeps training while it waits
    <- {"cmd": "measure", "start": T, "round_s": S, "rounds": R}   T is a time.monotonic() instant
    -> {"event": "result", "rounds": [[seconds, samples], ...], ...}
       the worker keeps training (unmeasured) so the others are measured under the same load
    <- {"cmd": "stop"}                or stdin closing: exit
    -> {"event": "error", ...}        on any failure, then exit 1

Rounds share absolute boundaries T + k*S across all workers; at each boundary the worker
synchronises the device once, so every sample counted in a round has really completed.
"""
from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import queue
import signal
import sys
import threading
import time
import traceback

from .pool import MSG_FD_ENV  # the controller side owns the protocol's names; it never imports this module


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process if the controller dies, so no worker can be orphaned."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Channel:
    def __init__(self, fd: int):
        self._out = os.fdopen(fd, "w", buffering=1)
        self.commands: queue.Queue = queue.Queue()
        threading.Thread(target=self._read_commands, daemon=True).start()

    def _read_commands(self) -> None:
        for line in sys.stdin:
            line = line.strip()
            if line:
                self.commands.put(json.loads(line))
        self.commands.put({"cmd": "stop"})  # controller gone: stop

    def send(self, **message) -> None:
        self._out.write(json.dumps(message) + "\n")
        self._out.flush()

    def poll(self) -> dict | None:
        try:
            return self.commands.get_nowait()
        except queue.Empty:
            return None


def stack_versions(torch, cuda: bool) -> dict:
    """torch's CUDA runtime and cuDNN versions; neither call touches the GPU (a run's identity reads them too)."""
    return {"cuda_runtime": torch.version.cuda, "cudnn": torch.backends.cudnn.version() if cuda else None}


def device_report(torch, device) -> dict:
    report = {
        "torch": torch.__version__,
        **stack_versions(torch, device.type == "cuda"),
        "device_type": device.type,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    try:
        import torchvision

        report["torchvision"] = torchvision.__version__
    except ImportError:
        report["torchvision"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        report.update(
            device_name=props.name,
            sm_count=props.multi_processor_count,
            total_memory=props.total_memory,
            device_uuid=str(getattr(props, "uuid", "")) or None,
        )
    return report


def training_device(torch, kind: str, threads: int | None):
    """The device a worker trains on, set up as for every worker (CPU threads, cuDNN autotuning), with its
    CUDA context created; and the matching synchronise function."""
    device = torch.device("cuda", 0) if kind == "cuda" else torch.device(kind)
    if threads:
        torch.set_num_threads(threads)
    if device.type != "cuda":
        return device, (lambda: None)
    torch.backends.cudnn.benchmark = True
    torch.cuda.set_device(device)
    torch.zeros(1, device=device)  # creates the CUDA context (an MPS client connects here)
    return device, torch.cuda.synchronize


def run(spec: dict, channel: Channel) -> int:
    # Where start-up time goes (an MPS client's context, cuDNN autotuning, ...): seconds per phase.
    phases: dict[str, float] = {}
    mark = time.monotonic()

    def phase_done(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        phases[name], mark = now - mark, now

    if spec.get("cpus"):
        os.sched_setaffinity(0, spec["cpus"])
    import torch

    from . import models
    from .workloads import Workload

    phase_done("import")
    workload = Workload.from_dict(spec["workload"])
    device, sync = training_device(torch, spec["device"], spec.get("threads"))
    if device.type == "cuda":
        phase_done("cuda_context")

    step = models.build(workload, device, spec.get("image_size"))
    samples_per_step = int(getattr(step, "samples_per_step", workload.batch_size))
    sync()
    phase_done("build")

    # Warm-up: autotuning, allocator growth, clocks ramping up.
    warmup_start = time.monotonic()
    warmup_steps = 0
    while warmup_steps < spec["warmup_steps"] or time.monotonic() - warmup_start < spec["warmup_s"]:
        step.train_step()
        warmup_steps += 1
        if warmup_steps % 8 == 0:
            sync()
    sync()
    phase_done("warm_up")
    ready = device_report(torch, device)
    ready.update(pid=os.getpid(), cpus=sorted(os.sched_getaffinity(0)), warmup_steps=warmup_steps,
                 samples_per_step=samples_per_step, startup_phases_s=phases)
    channel.send(event="ready", **ready)

    # Keep training until told when to measure: all workers stay under load meanwhile.
    command = None
    while command is None:
        step.train_step()
        command = channel.poll()
    if command["cmd"] == "stop":
        return 0

    start, round_s, n_rounds = command["start"], command["round_s"], command["rounds"]
    while time.monotonic() < start:
        step.train_step()
    sync()
    rounds: list[list[float]] = []
    last = time.monotonic()
    boundary = start + round_s
    steps = 0
    while len(rounds) < n_rounds:
        step.train_step()
        steps += 1
        if time.monotonic() >= boundary:
            sync()
            now = time.monotonic()
            rounds.append([now - last, steps * samples_per_step])
            last, steps = now, 0
            boundary += round_s
            while boundary <= now:  # a step longer than a round: skip boundaries already passed
                boundary += round_s
    cuda = device.type == "cuda"
    channel.send(event="result", rounds=rounds,
                 peak_memory_bytes=torch.cuda.max_memory_allocated(device) if cuda else None,
                 reserved_memory_bytes=torch.cuda.memory_reserved(device) if cuda else None)

    # Unmeasured cool-down: keep the load on until every worker has finished measuring.
    while channel.poll() is None:
        step.train_step()
    return 0


def describe_error(exc: BaseException) -> dict:
    info = {"type": type(exc).__name__, "message": str(exc)[-2000:], "traceback": traceback.format_exc()[-4000:]}
    if type(exc).__name__ == "OutOfMemoryError":
        try:
            import torch

            info["memory_allocated_bytes"] = torch.cuda.memory_allocated()
            info["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated()
            free, total = torch.cuda.mem_get_info()
            info["device_free_bytes"], info["device_total_bytes"] = free, total
        except Exception:  # the report must go out even if the device is unusable
            pass
    return info


def main() -> int:
    _die_with_parent()
    faulthandler.enable()  # a crash in native code (segfault) still leaves a Python traceback in the log
    channel = Channel(int(os.environ[MSG_FD_ENV]))
    try:
        spec = channel.commands.get(timeout=60)
        if "workload" not in spec:  # closed before a job arrived
            return 0
        return run(spec, channel)
    except BaseException as exc:  # report everything, including KeyboardInterrupt, to the controller
        traceback.print_exc()  # into the worker's log first, so the controller's tail of it is complete
        sys.stderr.flush()
        channel.send(event="error", **describe_error(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main())
