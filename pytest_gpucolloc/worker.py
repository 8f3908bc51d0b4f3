"""Worker process: one training job of a scenario, started by ``pool.py`` as
``python -m pytest_gpucolloc.worker`` with an explicit environment; it speaks ``protocol.py``.

Rounds share absolute boundaries start + k*round_s across all workers; at each boundary the worker
synchronises the device once, so every sample counted in a round has really completed.
"""
from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import importlib.metadata
import os
import queue
import signal
import sys
import threading
import time
import traceback

from . import measure, protocol
from .workloads import BACK_TO_BACK, Workload


def _die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``sig`` to this process if its parent dies, so no worker can be orphaned."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG


class Channel:
    def __init__(self, fd: int):
        self._out = os.fdopen(fd, "w", buffering=1)
        self.commands: queue.Queue = queue.Queue()
        threading.Thread(target=self._read_commands, daemon=True).start()

    def _read_commands(self) -> None:
        # Raw reads of fd 0, not sys.stdin: a thread blocked inside sys.stdin holds its lock, and a process the
        # job forks (a DataLoader worker closes its sys.stdin at start) would wait for that lock for ever.
        buffer = b""
        while chunk := os.read(0, 65536):
            *lines, buffer = (buffer + chunk).split(b"\n")
            for line in lines:
                if line.strip():
                    self.commands.put(protocol.decode_command(line.decode()))
        self.commands.put(protocol.Stop())  # controller gone: stop

    def send(self, event: protocol.Event) -> None:
        self._out.write(protocol.encode_event(event))
        self._out.flush()


def stack_versions(torch, cuda: bool) -> dict:
    """torch's CUDA runtime and cuDNN versions; neither call touches the GPU (a run's identity reads them too)."""
    return {"cuda_runtime": torch.version.cuda, "cudnn": torch.backends.cudnn.version() if cuda else None}


def device_report(torch, device) -> dict:
    report = {"torch": torch.__version__, **stack_versions(torch, device.type == "cuda"), "device_type": device.type,
              "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    vision = sys.modules.get("torchvision")  # imported by the job, or its version as installed: importing it
    try:  # only to say its version cost each worker a second of CPU (it imports torch._dynamo and sympy)
        report["torchvision"] = vision.__version__ if vision else importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        report["torchvision"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        report.update(device_name=props.name, sm_count=props.multi_processor_count, total_memory=props.total_memory,
                      device_uuid=str(getattr(props, "uuid", "")) or None)
    return report


def training_device(torch, kind: str, threads: int | None):
    """The device a worker trains on (CPU threads set, CUDA context created) and its synchronise function. cuDNN's
    settings are the job's: the named workloads set autotuning (``cudnn_autotune``), a user's step its own."""
    device = torch.device("cuda", 0) if kind == "cuda" else torch.device(kind)
    if threads:
        torch.set_num_threads(threads)
    if device.type != "cuda":
        return device, (lambda: None)
    torch.cuda.set_device(device)
    torch.zeros(1, device=device)  # creates the CUDA context (an MPS client connects here)
    return device, torch.cuda.synchronize


def warm_up(spec: protocol.Spec, channel: Channel):
    """Build the job and warm it up (autotuning, allocator growth, clocks ramping up): the step, its synchronise
    function, the device and the Ready message (where start-up time went: an MPS client's context, cuDNN, ...)."""
    phases: dict[str, float] = {}
    mark = time.monotonic()

    def phase_done(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        phases[name], mark = now - mark, now

    if spec.cpus:
        os.sched_setaffinity(0, spec.cpus)
    import torch

    from . import models  # torch: imported in the worker, never in the controller

    phase_done("import")
    workload = Workload.from_dict(spec.workload)
    device, sync = training_device(torch, spec.device, spec.threads)
    channel.send(protocol.Connected(pid=os.getpid()))  # the pool starts the next worker now (protocol.Connected)
    if device.type == "cuda":
        phase_done("cuda_context")
    step = models.build(workload, device, spec.image_size)
    samples_per_step = getattr(step, "samples_per_step", workload.batch_size)
    if isinstance(samples_per_step, bool) or not isinstance(samples_per_step, int) \
            or not 1 <= samples_per_step <= protocol.MAX_SAMPLES_PER_STEP:
        raise ValueError(f"{workload.model}: samples_per_step must be a positive whole number of at most "
                         f"{protocol.MAX_SAMPLES_PER_STEP:,}, got {str(samples_per_step)[:40]}")
    sync()
    phase_done("build")
    if isinstance(step, models.GraphedStep):
        step.capture()
        sync()
        phase_done("cuda_graph_capture")

    step.train_step()  # on its own, to show what the first step costs: cuDNN autotuning, lazy kernel loading
    sync()
    phase_done("first_step")
    warmup_steps = 1 + warm_until_steady(step, sync, spec)
    phase_done("warm_up")
    ready = protocol.Ready(pid=os.getpid(), cpus=sorted(os.sched_getaffinity(0)), warmup_steps=warmup_steps,
                           samples_per_step=samples_per_step, startup_phases_s=phases, **device_report(torch, device))
    return step, sync, device, ready


WARMUP_WINDOW_S = 0.25
WARMUP_FLOOR_S = 1.0


def warm_until_steady(step, sync, spec: protocol.Spec) -> int:
    """Train at least ``spec.warmup_steps`` steps, then until the step time has stopped improving (after
    WARMUP_FLOOR_S) or ``spec.warmup_s`` has passed. Returns the number of steps."""
    start = window_start = time.monotonic()
    steps = window_steps = 0
    rates: list[float] = []  # steps per second of successive windows, each ended by a synchronisation
    floor_s = min(WARMUP_FLOOR_S, spec.warmup_s)
    while True:
        step.train_step()
        steps += 1
        window_steps += 1
        now = time.monotonic()
        if now - window_start >= WARMUP_WINDOW_S:
            sync()
            now = time.monotonic()
            rates.append(window_steps / (now - window_start))
            window_start, window_steps = now, 0
        elapsed = now - start
        if steps >= spec.warmup_steps and (elapsed >= spec.warmup_s
                                           or (elapsed >= floor_s and measure.stopped_rising(rates))):
            break
    sync()
    return steps


def measure_rounds(step, sync, command: protocol.Measure, samples_per_step: int, data_wait=lambda: None
                   ) -> tuple[list[tuple[float, int]], list[float] | None]:
    """Train through the rounds of ``command``; at each shared boundary synchronise once and count. Also, per round,
    the time spent waiting for the data loader (``data_wait()``: its running total; None: no loader)."""
    while time.monotonic() < command.start:
        step.train_step()
    sync()
    rounds: list[tuple[float, int]] = []
    waits: list[float] = []
    waited = data_wait()
    last = time.monotonic()
    boundary = command.start + command.round_s
    steps = 0
    while len(rounds) < command.rounds:
        step.train_step()
        steps += 1
        if time.monotonic() >= boundary:
            sync()
            now = time.monotonic()
            rounds.append((now - last, steps * samples_per_step))
            if waited is not None:
                total = data_wait()
                waits.append(total - waited)
                waited = total
            last, steps = now, 0
            boundary += command.round_s
            while boundary <= now:  # a step longer than a round: skip boundaries already passed
                boundary += command.round_s
    return rounds, (waits if waited is not None else None)


def run(spec: protocol.Spec, channel: Channel) -> int:
    step, sync, device, ready = warm_up(spec, channel)  # imports torch after setting the CPU affinity
    channel.send(ready)
    import torch

    from . import models  # torch: imported in the worker, never in the controller

    job = Workload.from_dict(spec.workload)
    rate = job.rate
    if isinstance(rate, str) and rate != BACK_TO_BACK:
        raise ValueError(f"a serving job's rate {rate!r} reached the worker unresolved")
    cuda = device.type == "cuda"
    requests = None
    if rate is not None:  # a serving job
        from . import serving  # hdrhistogram only where a worker serves

        # spinning on cores of its own takes nothing from others; in CPU smoke mode those cores do the work itself
        requests = serving.Requests(step.train_step, sync, rate if isinstance(rate, (int, float)) else None,
                                    spin=bool(spec.cpus) and cuda, arrivals=job.arrivals)
    command = _train_until_told(step, channel, requests)  # all workers stay under load until told when to measure
    continuing = False  # the next Measure adds rounds to the last one (a service's schedule and queue go on)
    while not isinstance(command, protocol.Stop):
        if isinstance(command, protocol.Idle):  # leave the device alone until the next command
            sync()
            command = channel.commands.get()
            continuing = False
            continue
        if not isinstance(command, protocol.Measure):
            raise protocol.ProtocolError(f"unexpected command {command!r}")
        latency = waits = None
        if requests is not None:
            rounds, latency = serving.serve_rounds(requests, command.start, command.round_s, command.rounds,
                                                   ready.samples_per_step, fresh=not continuing)
        else:
            rounds, waits = measure_rounds(step, sync, command, ready.samples_per_step,
                                           lambda: models.data_wait_s(step))
        channel.send(protocol.Result(rounds=rounds, data_wait_s=waits, latency=latency,
                                     peak_memory_bytes=torch.cuda.max_memory_allocated(device) if cuda else None,
                                     reserved_memory_bytes=torch.cuda.memory_reserved(device) if cuda else None))
        # Unmeasured: keep the load on until every worker has finished measuring and the controller decides.
        command = _train_until_told(step, channel, requests, restart=False)
        continuing = True
    return 0


def _train_until_told(step, channel: Channel, requests=None, restart: bool = True
                      ) -> protocol.Command:
    """Train (or serve at the job's rate: from now, or on the schedule it keeps with ``restart=False``) until a command
    arrives; a service waits for its next request and a command at once, so a slow rate never delays a command."""
    if requests is not None and restart:
        requests.restart(time.monotonic())
    while True:
        if requests is None:
            step.train_step()
        else:
            wait = requests.next_arrival() - time.monotonic()
            if wait > requests.SPIN_S:
                with contextlib.suppress(queue.Empty):
                    return channel.commands.get(timeout=wait - requests.SPIN_S)
            requests.serve_one()
        with contextlib.suppress(queue.Empty):
            return channel.commands.get_nowait()


def describe_error(exc: BaseException) -> protocol.Error:
    details = {}
    if type(exc).__name__ == "OutOfMemoryError":
        with contextlib.suppress(Exception):  # the report must go out even if the device is unusable
            import torch

            details["memory_allocated_bytes"] = torch.cuda.memory_allocated()
            details["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated()
            free, total = torch.cuda.mem_get_info()
            details["device_free_bytes"], details["device_total_bytes"] = free, total
    return protocol.Error(type(exc).__name__, str(exc)[-2000:], traceback.format_exc()[-4000:], details)


def main() -> int:
    _die_with_parent()
    faulthandler.enable()  # a crash in native code (segfault) still leaves a Python traceback in the log
    fd = int(os.environ[protocol.MSG_FD_ENV])
    os.set_inheritable(fd, False)  # a process the workload starts must not hold the channel open
    channel = Channel(fd)
    try:
        spec = channel.commands.get(timeout=60)
        if not isinstance(spec, protocol.Spec):  # closed before a job arrived
            return 0
        return run(spec, channel)
    except BaseException as exc:  # report everything, including KeyboardInterrupt, to the controller
        traceback.print_exc()  # into the worker's log first, so the controller's tail of it is complete
        sys.stderr.flush()
        channel.send(describe_error(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main())
