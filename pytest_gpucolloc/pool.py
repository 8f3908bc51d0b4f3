"""Controller side of the workers (training processes): spawn with an explicit environment, start
measurement together, collect, and always stop every process (success, failure, timeout, Ctrl-C).
What is said to a worker and what it answers is ``protocol.py``."""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import itertools
import os
import selectors
import signal
import subprocess
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import phases, process_marks, protocol
from .environment import base_environment
from .forkserver import ForkServer
from .logs import tail
from .protocol import MSG_FD_ENV
from .workloads import ModelShape, Workload

_LIVE_POOLS: weakref.WeakSet[WorkerPool] = weakref.WeakSet()
_WORKER_NUMBERS = itertools.count()
CONNECT_TIMEOUT_S = 120.0  # spawn to a worker's device set up (a fresh interpreter imports torch first)


def connects_in_order(device: str) -> bool:
    """Whether a pool's workers start one after the other, each once the one before has set up its device: on a GPU
    (the order in which MPS's clients connect, not chosen, is the suspect for a service's two levels beside trainers:
    docs/serving.md); on the CPU nothing is shared that way."""
    return device != "cpu"


class WorkerFailed(RuntimeError):
    def __init__(self, label: str, summary: str, log_tail: str = "", error: protocol.Error | None = None):
        self.label, self.summary, self.log_tail, self.error = label, summary, log_tail, error
        text = f"worker {label} failed: {summary}\n--- last lines of {label}'s output ---\n"
        text += log_tail or "(it printed nothing)"
        super().__init__(text)


class ScenarioTimeout(RuntimeError):
    pass


@dataclass
class WorkerSlot:
    """One worker as a sharing mode decided it: its workload, environment and CPU cores."""

    workload: Workload
    env: dict[str, str] = field(default_factory=dict)
    cpus: tuple[int, ...] | None = None
    mode_facts: dict[str, Any] = field(default_factory=dict)  # the mode's limits and checks, recorded with the result


class _Worker:
    def __init__(self, label: str, slot: WorkerSlot, spec: protocol.Spec, log_path: Path, forkserver: ForkServer):
        self.label, self.slot, self.log_path = label, slot, log_path
        read_fd, write_fd = os.pipe()
        env = {**base_environment(), **slot.env, MSG_FD_ENV: str(write_fd)}
        self.mark = process_marks.new_mark(f"{label}-{next(_WORKER_NUMBERS)}")
        env[process_marks.MARK_ENV] = self.mark  # inherited by whatever the worker execs
        if slot.cpus:
            env["OMP_NUM_THREADS"] = str(len(slot.cpus))
        self.spawned_at = time.monotonic()
        mark_fd = process_marks.mark_descriptor(self.mark)  # the worker keeps it open, and every fork of it
        try:
            # started by the session's fork server (forked, or exec'd fresh), in a session of its own: Ctrl-C
            # reaches the controller only, and what the worker leaves orphaned becomes the server's to end
            with open(log_path, "wb") as log:
                self.process = forkserver.spawn(env, log.fileno(), write_fd, mark_fd, _uses_vision(spec))
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(mark_fd)
            os.close(write_fd)
        self.messages_fd = read_fd  # -1 once closed
        self.pending: list[protocol.Event] = []  # messages read before anyone waited for them
        self.connected_at: float | None = None  # when it said its device was set up
        self.stdin = self.process.stdin  # a pipe: the fork server's
        self._buffer = b""
        self.send(spec)

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, command: protocol.Command) -> None:
        with contextlib.suppress(BrokenPipeError, ValueError):  # it died; the message loop reports why
            self.stdin.write(protocol.encode_command(command))
            self.stdin.flush()

    def read_messages(self) -> list[protocol.Event] | None:
        """Messages that have arrived (call when the fd is readable); None once the worker closed it.
        Raises ProtocolError for anything on the channel that is not a message."""
        chunk = os.read(self.messages_fd, 65536)
        if not chunk:
            return None
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        if len(self._buffer) > protocol.MAX_MESSAGE_BYTES:
            raise protocol.ProtocolError(f"an unterminated message of over {protocol.MAX_MESSAGE_BYTES:,} bytes")
        return [protocol.decode_event(line) for line in lines if line.strip()]

    def failure(self, error: protocol.Error | None = None, summary: str | None = None) -> WorkerFailed:
        """Why the worker failed: its error message, a summary the caller knows, or how it ended."""
        try:  # let it finish writing its log before the tail is taken
            code = self.process.wait(timeout=1 if summary else 5 if error else 10)
        except subprocess.TimeoutExpired:
            code = None
        if summary is None and error is not None:
            summary = f"{error.type}: {error.message}"
        elif summary is None:
            summary = ("closed its message pipe but kept running" if code is None else f"exited with code {code}"
                       if code >= 0 else f"killed by {signal.Signals(-code).name}")
        return WorkerFailed(self.label, summary, tail(self.log_path), error)

    def stop(self, grace_s: float) -> None:
        """After a Stop command (``WorkerPool.close``): grace, then SIGTERM, then SIGKILL to its process group."""
        for sig, wait_s in ((None, grace_s), (signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
            if sig is not None:
                try:
                    os.killpg(self.process.pid, sig)
                except ProcessLookupError:
                    break
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=wait_s)
                break
        with contextlib.suppress(OSError):
            self.stdin.close()
        if self.messages_fd >= 0:
            os.close(self.messages_fd)
            self.messages_fd = -1


class WorkerPool:
    """Workers of one phase of a scenario (all running at the same time)."""

    def __init__(self, slots: list[WorkerSlot], *, device: str, warmup_s: float, warmup_steps: int,
                 log_dir: Path, forkserver: ForkServer, image_size: int | None = None, label_offset: int = 0,
                 timeout_s: float = CONNECT_TIMEOUT_S):
        self.slots, self.label_offset = slots, label_offset
        # each worker started once the one before has set up its device (protocol.Connected): on a GPU
        self.in_order = connects_in_order(device)
        self.timeout_s = timeout_s  # for each worker to set up its device, when they start in order
        self.forkserver = forkserver  # forkserver.shared(): forks each worker, or execs it fresh
        self.spec: dict[str, Any] = dict(device=device, warmup_s=warmup_s, warmup_steps=warmup_steps,
                                         image_size=image_size)  # what every worker's Spec shares
        self.log_dir = Path(log_dir)
        self.workers: list[_Worker] = []

    def __enter__(self) -> WorkerPool:
        _LIVE_POOLS.add(self)
        try:
            for i, slot in enumerate(self.slots):
                label = f"w{self.label_offset + i}"
                spec = protocol.Spec(workload=slot.workload.to_dict(), cpus=list(slot.cpus) if slot.cpus else None,
                                     threads=len(slot.cpus) if slot.cpus else None, **self.spec)
                self.workers.append(_Worker(label, slot, spec, self.log_dir / f"{label}.log", self.forkserver))
                if self.in_order and i < len(self.slots) - 1:  # GPU clients connect in the slots' order
                    self._collect(protocol.Connected, self.timeout_s, "its device", self.workers[-1:])
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    def _collect(self, event: type, timeout_s: float, what: str, workers: list[_Worker] | None = None) -> list:
        """An ``event`` message from every worker (of ``workers``, else all); any worker's error, death or malformed
        message fails at once."""
        workers = self.workers if workers is None else workers
        results: dict[int, object] = {}
        selector = selectors.DefaultSelector()
        for i, worker in enumerate(workers):
            kept = next((m for m in worker.pending if isinstance(m, event)), None)  # read while waiting for another
            if kept is not None:
                worker.pending.remove(kept)
                results[i] = kept
            else:
                selector.register(worker.messages_fd, selectors.EVENT_READ, i)
        deadline = time.monotonic() + timeout_s
        try:
            while len(results) < len(workers):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    waiting = [w.label for i, w in enumerate(workers) if i not in results]
                    raise ScenarioTimeout(
                        f"timed out after {timeout_s:.0f}s waiting for {what} of {', '.join(waiting)}"
                        + "".join(f"\n--- last lines of {w.label} ---\n{tail(w.log_path, 10)}"
                                  for i, w in enumerate(workers) if i not in results))
                phases.tick(len(results))  # a terminal's progress line, about once a second
                ready = selector.select(timeout=min(remaining, 1.0))
                for key, _ in ready:
                    self._receive(workers[key.data], key.data, event, results, selector)
                # A worker that exited while a child of its own still holds its message pipe open never
                # closes the channel: its exit is seen here instead (after reading what it sent).
                for i, worker in enumerate(workers):
                    if i not in results and worker.process.poll() is not None:
                        if selector.select(timeout=0):
                            continue  # it said something last: read that first
                        raise worker.failure()
        finally:
            selector.close()
        return [results[i] for i in range(len(workers))]

    def _receive(self, worker: _Worker, index: int, event: type, results: dict, selector) -> None:
        try:
            messages = worker.read_messages()
        except protocol.ProtocolError as error:
            raise worker.failure(summary=f"wrote on its message channel what is not a message: {error}") from error
        if messages is None:
            raise worker.failure()
        for message in messages:
            if isinstance(message, protocol.Error):
                raise worker.failure(message)
            if isinstance(message, protocol.Ready):  # its start-up time, spawn to warm
                message = dataclasses.replace(message, since_spawn_s=time.monotonic() - worker.spawned_at)
            if isinstance(message, protocol.Connected):
                worker.connected_at = time.monotonic()
            if isinstance(message, event) and index not in results:
                results[index] = message
                selector.unregister(worker.messages_fd)
            elif not isinstance(message, (protocol.Connected, event)):  # kept for the _collect that waits for it
                worker.pending.append(message)

    def wait_ready(self, timeout_s: float) -> list[protocol.Ready]:
        return self._collect(protocol.Ready, timeout_s, "warm-up")

    def measure(self, start: float, round_s: float, rounds: int, timeout_s: float) -> list[protocol.Result]:
        for worker in self.workers:
            worker.send(protocol.Measure(start, round_s, rounds))
        return self._collect(protocol.Result, timeout_s, "measurement")

    def idle(self) -> None:
        """Every worker stops training until its next command (a paired A/B measures the other arm meanwhile)."""
        for worker in self.workers:
            worker.send(protocol.Idle())

    def close(self, grace_s: float = 5.0) -> None:
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.send(protocol.Stop())
        for worker in self.workers:
            worker.stop(grace_s)
        # and whatever they started, in their process groups or not (own sessions, orphans), is gone on return
        process_marks.kill_marked({worker.mark for worker in self.workers}, {worker.pid for worker in self.workers})
        _LIVE_POOLS.discard(self)


def _uses_vision(spec: protocol.Spec) -> bool:
    """Whether the worker imports torchvision: a named image workload does; on a GPU any job is taken to (a user's
    model usually does, and its start-up counts there); a user's job on the CPU imports what it needs itself."""
    return spec.device != "cpu" or isinstance(Workload.from_dict(spec.workload).shape, ModelShape)


@atexit.register
def _stop_all_workers() -> None:
    for pool in list(_LIVE_POOLS):
        pool.close(grace_s=1.0)
