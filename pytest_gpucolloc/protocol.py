"""The worker protocol: what the controller (``pool.py``) and a training process (``worker.py``) say to each
other. Both sides use this module; neither builds or reads a message by hand.

A worker is started as ``python -m pytest_gpucolloc.worker``. Commands reach it as JSON lines on its stdin;
its messages leave as JSON lines on the file descriptor named by ``GPUCOLLOC_MSG_FD``:

    <- Spec                          first line: the job (workload, device, warm-up, CPU cores)
    -> Ready                         after warm-up (ended once the step time stops improving); the
                                     worker keeps training while it waits
    <- Measure(start, round_s, rounds)   ``start`` is a time.monotonic() instant shared by all workers
    -> Result                        rounds of (seconds, samples); the worker keeps training, unmeasured,
                                     so the others are measured under the same load
    <- Measure ... -> Result          again, as often as the controller wants more rounds
    <- Idle                          stop training until the next command (paired A/B: the other arm's
                                     workers are measured meanwhile, on a GPU this arm leaves alone)
    <- Stop                          (or stdin closing): exit
    -> Error                         on any failure, then exit 1

A worker that writes anything else on the channel fails with ``ProtocolError`` naming what it sent.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

MSG_FD_ENV = "GPUCOLLOC_MSG_FD"
MAX_MESSAGE_BYTES = 1 << 20  # a longer line on the channel is not one of ours


class ProtocolError(ValueError):
    """A message that is not what the protocol allows."""


# --- controller -> worker --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Spec:
    workload: dict  # workloads.Workload.to_dict()
    device: str  # "cuda" or "cpu"
    warmup_s: float
    warmup_steps: int
    image_size: int | None = None  # CPU smoke mode shrinks inputs
    cpus: list[int] | None = None
    threads: int | None = None


@dataclass(frozen=True)
class Measure:
    start: float
    round_s: float
    rounds: int


@dataclass(frozen=True)
class Idle:
    pass


@dataclass(frozen=True)
class Stop:
    pass


_COMMANDS = {kind.__name__.lower(): kind for kind in (Spec, Measure, Idle, Stop)}  # by name on the wire
Command = Spec | Measure | Idle | Stop


def encode_command(command: Command) -> bytes:
    return (json.dumps({"cmd": type(command).__name__.lower(), **dataclasses.asdict(command)}) + "\n").encode()


def decode_command(line: str) -> Command:
    data = json.loads(line)
    return _COMMANDS[data.pop("cmd")](**data)


# --- worker -> controller --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Connected:
    """The worker's device is set up (on a GPU its CUDA context is made: under MPS, its client has connected). On a
    GPU the pool starts the next worker only then, so that the clients connect in the scenario's order, not in a
    random one: started at once, a service beside two trainers under mps answered at one of two levels 12% apart,
    drawn as if by which client connected first (docs/serving.md; not yet measured with the order fixed)."""

    pid: int


@dataclass(frozen=True)
class Ready:
    """The worker is warm. What it saw of its device and software, for the record and the run's identity."""

    pid: int
    samples_per_step: int
    warmup_steps: int
    cpus: list[int]
    startup_phases_s: dict[str, float]  # import, cuda_context, build, cuda_graph_capture, first_step, warm_up
    torch: str | None = None
    torchvision: str | None = None
    cuda_runtime: str | None = None
    cudnn: int | None = None
    device_type: str | None = None
    cuda_visible_devices: str | None = None
    device_name: str | None = None
    sm_count: int | None = None
    total_memory: int | None = None
    device_uuid: str | None = None
    since_spawn_s: float | None = None  # set by the controller: spawn to warm


@dataclass(frozen=True)
class Result:
    rounds: list[tuple[float, int]]  # (seconds, samples) between two device synchronisations
    peak_memory_bytes: int | None = None  # PyTorch's peak of allocated tensors
    reserved_memory_bytes: int | None = None  # what PyTorch's allocator held at the end of measurement
    data_wait_s: list[float] | None = None  # per round: time spent waiting for the data loader (loader jobs)
    # per round, a serving job's request latencies (an encoded HDR histogram) and queue at its end (serving.py)
    latency: list[dict[str, Any]] | None = None


def joined(first: Result, more: Result) -> Result:
    """One worker's result over two batches of rounds (the controller asked for more)."""
    waits = None if first.data_wait_s is None or more.data_wait_s is None else first.data_wait_s + more.data_wait_s
    latency = None if first.latency is None or more.latency is None else first.latency + more.latency
    return dataclasses.replace(more, rounds=list(first.rounds) + list(more.rounds), data_wait_s=waits,
                               latency=latency)


@dataclass(frozen=True)
class Error:
    type: str
    message: str
    traceback: str = ""
    details: dict[str, Any] = field(default_factory=dict)  # e.g. device memory at an out-of-memory error


Event = Connected | Ready | Result | Error
_EVENTS = {kind.__name__.lower(): kind for kind in (Connected, Ready, Result, Error)}


def encode_event(event: Event) -> str:
    return json.dumps({"event": type(event).__name__.lower(), **dataclasses.asdict(event)}) + "\n"


# Samples a training step may say it processes: far above any batch (and batch times sequence length), far below
# what would make a throughput meaningless (a user workload's 10**30 would be saved as ~1e32 samples/s).
MAX_SAMPLES_PER_STEP = 2**32


def _number(value, what: str, integer: bool = False, low: float = 0.0, high: float = 2**63) -> float:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or not low <= value <= high:
        raise ProtocolError(f"{what} must be a {'whole ' if integer else ''}number from {low:g} to {high:,}, "
                            f"got {str(value)[:40]}")
    return value


def _check(event: Event) -> None:
    if isinstance(event, (Connected, Ready)):
        _number(event.pid, "pid", integer=True, low=1)
    if isinstance(event, Ready):
        _number(event.samples_per_step, "samples_per_step", integer=True, low=1, high=MAX_SAMPLES_PER_STEP)
    elif isinstance(event, Result):
        if not isinstance(event.rounds, list) or not event.rounds:
            raise ProtocolError(f"rounds must be a non-empty list, got {str(event.rounds)[:80]}")
        for entry in event.rounds:
            if not isinstance(entry, (list, tuple)) or len(entry) != 2:
                raise ProtocolError(f"a round must be [seconds, samples], got {str(entry)[:80]}")
            seconds, samples = entry
            if _number(seconds, "a round's seconds") <= 0:
                raise ProtocolError(f"a round's seconds must be positive, got {seconds!r}")
            _number(samples, "a round's samples", integer=True)
        if event.data_wait_s is not None:
            if not isinstance(event.data_wait_s, list) or len(event.data_wait_s) != len(event.rounds):
                raise ProtocolError("data_wait_s must list one number per round")
            for seconds in event.data_wait_s:
                _number(seconds, "a round's data wait")
        if event.latency is not None:
            from .serving import check_round  # hdrhistogram only where a worker serves

            if not isinstance(event.latency, list) or len(event.latency) != len(event.rounds):
                raise ProtocolError("latency must list one entry per round")
            for latencies in event.latency:
                if (problem := check_round(latencies)) is not None:
                    raise ProtocolError(problem)


def decode_event(line: bytes) -> Event:
    """One line from a worker's channel, checked; ProtocolError says what was wrong with it."""
    if len(line) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"a message of {len(line):,} bytes (at most {MAX_MESSAGE_BYTES:,})")
    try:
        data = json.loads(line)
        event = _EVENTS[data.pop("event")](**data)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ProtocolError(f"not a protocol message ({type(error).__name__}): {line[:120]!r}") from None
    _check(event)
    if isinstance(event, Result):
        event = dataclasses.replace(event, rounds=[(seconds, samples) for seconds, samples in event.rounds])
    return event
