"""The arm side of an interleaved A/B (``pytest-gpucolloc ab``): this pytest session is one of two arms that run
the same scenarios at the same time, and the ``ab`` controller decides when each arm's workers train.

For each block of a scenario (a fresh set of worker processes) the arm asks the controller before it starts its
workers, says when they are warm and idle, then measures one short window whenever told to, the other arm's workers
idling meanwhile (docs/ab.md).

Messages are JSON lines on a Unix socket named by ``GPUCOLLOC_AB_SOCKET``:

    arm -> {"arm": label, "tests": [nodeid, ...]}     once, on connecting: the session's tests in order
    arm -> {"event": "start", "key": [test, block, phase]}
    <- {"do": "go"} | {"do": "solo"} | {"do": "skip", "why": ...}   solo: no partner for this key, measure as
                                                      usual; skip: the A/B's budget is spent
    arm -> {"event": "ready"}                         workers warm and idle
    <- {"do": "measure", "window_s": s}  arm -> {"event": "measured", "throughput": samples/s}   (repeated;
                                                      throughput of the training jobs, and a serving job's
                                                      "latency": {"histogram", "backlog", "offered_rps"})
    <- {"do": "done", "more": bool}                   more: start another block of this test
"""
from __future__ import annotations

import json
import os
import socket
import time

import pytest

from . import measure, protocol
from .pool import WorkerPool

SOCKET_ENV = "GPUCOLLOC_AB_SOCKET"
ARM_ENV = "GPUCOLLOC_AB_ARM"
LEAD_S = 0.5  # workers train this long after idling before their window opens (the GPU's pipeline refills)


class Link:
    """This session's connection to the ``ab`` controller."""

    def __init__(self, path: str, arm: str, tests: list[str]):
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.connect(path)
        self._file = self._socket.makefile("rw", buffering=1)
        self._send({"arm": arm, "tests": tests})  # the controller pairs a test only with one the other arm will reach
        self.more: dict[str, bool] = {}  # test -> whether the controller wants another block of it

    def _send(self, message: dict) -> None:
        self._file.write(json.dumps(message) + "\n")
        self._file.flush()

    def _receive(self) -> dict:
        line = self._file.readline()
        if not line:
            raise ConnectionError("the ab controller closed the connection")
        return json.loads(line)

    def start(self, test: str, block: int, phase: int) -> bool:
        """Wait for this arm's turn to start the workers of ``test``'s block; False when it has no partner."""
        self._send({"event": "start", "key": [test, block, phase]})
        answer = self._receive()
        if answer["do"] == "skip":
            pytest.skip(answer.get("why", "the A/B controller skipped it"))
        if answer["do"] != "go":
            self.more[test] = False
        return answer["do"] == "go"

    def serve(self, test: str, pool: WorkerPool, timeout_s: float) -> tuple[list[protocol.Result], str] | None:
        """Idle the warm workers, then measure a window whenever the controller says, until it is done: every window
        as a round of each worker, and how it ended; None when the other arm failed first (this one measures alone)."""
        pool.idle()
        self._send({"event": "ready"})
        merged: list[protocol.Result] = []
        while (order := self._receive())["do"] == "measure":
            results = pool.measure(time.monotonic() + LEAD_S, order["window_s"], 1,
                                   timeout_s=order["window_s"] + timeout_s)
            pool.idle()
            self._send(measured(pool, results))
            merged = results if not merged else [protocol.joined(old, new) for old, new in zip(merged, results)]
        self.more[test] = bool(order.get("more"))
        return (merged, f"interleaved with the other arm: {len(merged[0].rounds)} windows") if merged else None


def measured(pool: WorkerPool, results: list[protocol.Result]) -> dict:
    """One window as the controller judges it: the training jobs' samples/s (a serving job answers requests at its
    rate: it is judged by its latency, which travels along)."""
    jobs = [slot.workload for slot in pool.slots]
    throughput = measure.counted_aggregate([list(r.rounds) for r in results], [job.serves for job in jobs])[0]
    message: dict = {"event": "measured", "throughput": throughput}
    for result, job in zip(results, jobs):
        if job.serves and result.latency:
            offered = job.rate if isinstance(job.rate, (int, float)) else None  # None: back to back, no queue
            message["latency"] = {**result.latency[-1], "offered_rps": offered}
    return message


_link: Link | None = None


def link(tests: list[str]) -> Link | None:
    """The connection when this session is an arm of ``ab`` (made on first use, with ``tests`` in order), else None."""
    global _link
    path = os.environ.get(SOCKET_ENV)
    if _link is None and path:
        _link = Link(path, os.environ.get(ARM_ENV, "arm"), tests)
    return _link
