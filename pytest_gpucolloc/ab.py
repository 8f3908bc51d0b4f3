"""Paired A/B in one job (docs/ab.md): the same scenarios run by two arms (an interpreter or virtual environment, or a
git revision) on one machine, their pytest sessions at once. For each scenario both arms' workers are warm together
(``interleave.py``) and measured in windows, one arm's then the other's in random order; each block is a fresh set of
processes, and the unit of the statistics is a block's mean log-ratio log(B / A) (``ab_judge.py``), so that noise
moving both arms alike cancels. More blocks are run while a scenario is inconclusive, within its and the job's
budgets."""
from __future__ import annotations

import collections
import contextlib
import functools
import json
import math
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from . import history, interleave, report, shift, worker
from .ab_arms import ABError, Arm, unexpected_differences
from .ab_judge import Judgement, judge_blocks, judge_latency
from .logs import tail as log_tail
from .scratch import clean_stale_scratch, private_scratch
from .words import count


@dataclass
class ArmRun:
    """One arm's pytest session."""

    arm: str
    path: Path  # its --benchmark-json


@dataclass
class Settings:
    threshold: float = 0.02
    alpha: float = 0.005
    min_blocks: int = 3
    max_blocks: int = 12  # twelve: a service's latency tolerates one contrary block (shift.py)
    pairs_per_block: int = 5
    window_s: float = 1.0
    scenario_budget_s: float = 300.0
    budget_s: float = 3600.0  # the whole job
    alone: bool = False  # also measure each job alone in both arms (speedups); off: the A/B does not need them
    seed: int | None = None


class _Arms:
    """The controller's side of the arms' connections: one JSON line at a time from a named arm, or None once
    that arm has ended (its session closed the connection, or its pytest exited without connecting)."""

    def __init__(self, server: socket.socket, processes: dict[str, subprocess.Popen]):
        self.server, self.processes = server, processes
        self.sockets: dict[str, socket.socket] = {}
        self.buffers: dict[str, bytes] = {label: b"" for label in processes}
        self.lines: dict[str, collections.deque] = {label: collections.deque() for label in processes}
        self.ended: set[str] = set()
        self.unnamed: dict[socket.socket, bytes] = {}  # connected, not yet said which arm they are
        self.tests: dict[str, list[str]] = {}  # each arm's tests in its session's order, as its hello said

    def send(self, label: str, message: dict) -> None:
        with contextlib.suppress(OSError, KeyError):
            self.sockets[label].sendall((json.dumps(message) + "\n").encode())

    def receive(self, label: str) -> dict | None:
        while not self.lines[label]:
            if label in self.ended:
                return None
            if label not in self.sockets and self.processes[label].poll() is not None:
                self.ended.add(label)
                continue
            watched = [self.server, *self.unnamed, *self.sockets.values()]
            for ready in select.select(watched, [], [], 0.5)[0]:
                self._read(ready)
        return self.lines[label].popleft()

    def _read(self, ready: socket.socket) -> None:
        if ready is self.server:
            connection, _ = self.server.accept()
            self.unnamed[connection] = b""
            return
        chunk = ready.recv(65536)
        if ready in self.unnamed:
            self.unnamed[ready] += chunk
            if b"\n" in self.unnamed[ready] or not chunk:
                hello, _, rest = self.unnamed.pop(ready).partition(b"\n")
                said = json.loads(hello or b"{}")
                label = said.get("arm")
                if label not in self.processes or label in self.sockets:
                    ready.close()
                    return
                self.tests[label] = list(said.get("tests", []))
                self.sockets[label], self.buffers[label] = ready, rest
                self._split(label, b"")
            return
        label = next(name for name, sock in self.sockets.items() if sock is ready)
        if not chunk:
            self.ended.add(label)
        self._split(label, chunk)

    def _split(self, label: str, chunk: bytes) -> None:
        *lines, self.buffers[label] = (self.buffers[label] + chunk).split(b"\n")
        self.lines[label].extend(json.loads(line) for line in lines if line.strip())


class Coordinator:
    """Keeps the two arms in step, scenario by scenario, and collects each block's paired windows."""

    def __init__(self, arms: _Arms, labels: tuple[str, str], settings: Settings, say):
        self.arms, self.labels, self.settings, self.say = arms, labels, settings, say
        self.random = random.Random(settings.seed)
        self.blocks: dict[str, list[list[float]]] = {}  # test -> per block, the windows' log(candidate / baseline)
        self.latency: dict[str, list[dict[str, list[dict]]]] = {}  # test -> per block, a serving job's windows by arm
        self.spent: dict[str, float] = {}  # test -> seconds of its blocks so far
        self.unpaired: list[str] = []
        self.skipped: list[str] = []  # scenarios not started: the job's budget was spent
        self.cut_short: set[str] = set()  # scenarios a budget stopped while they were inconclusive
        self.began = time.monotonic()

    def run(self) -> None:
        waiting: dict[str, tuple] = {}  # an arm's start held until the other arm reaches that test
        while True:
            keys = {label: waiting.pop(label, None) or self._next_start(label) for label in self.labels}
            if all(key is None for key in keys.values()):
                return
            first, second = keys.values()
            if first is not None and first == second:
                if first[1:] != (0, 0) or time.monotonic() - self.began < self.settings.budget_s:
                    self._pair(first)
                    continue
                for label in self.labels:  # a new scenario once the job's budget is spent: skipped, saying why
                    self.arms.send(label, {"do": "skip", "why": f"the A/B's budget of {self.settings.budget_s / 60:g} "
                                                                "minutes was spent before this scenario"})
                self.skipped.append(first[0])
                continue
            for label, key in keys.items():  # a new test the other arm has ahead waits for it
                other = next(name for name in self.labels if name != label)
                if key is not None and key[1:] == (0, 0) and self._ahead(other, key[0], keys[other]):
                    waiting[label] = key
            if len(waiting) == len(self.labels):  # each has the other's test ahead (tests in different orders)
                waiting.clear()
            for label, key in keys.items():  # a scenario only one arm has (or reached): measured as usual
                if key is not None and label not in waiting:
                    self.arms.send(label, {"do": "solo"})
                    self.unpaired.append(f"{key[0]} ({label} only)")

    def _ahead(self, label: str, test: str, current: tuple | None) -> bool:
        """Whether arm ``label``, now starting ``current``, will start ``test`` later in its session."""
        order = self.arms.tests.get(label, [])
        return current is not None and test in order and current[0] in order \
            and order.index(test) > order.index(current[0])

    def _next_start(self, label: str) -> tuple | None:
        while (message := self.arms.receive(label)) is not None:
            if message.get("event") == "start":
                return tuple(message["key"])
        return None

    def _expect(self, label: str, event: str) -> dict | None:
        """The arm's next message when it is ``event``; otherwise None: the arm has ended, or its scenario failed and
        it moved on (that message is kept for later, and nothing more is said to the arm about this block)."""
        message = self.arms.receive(label)
        if message is not None and message.get("event") == event:
            return message
        if message is not None:
            self.arms.lines[label].appendleft(message)
        self.lost.add(label)
        return None

    def _pair(self, key: tuple) -> None:
        test, began = key[0], time.monotonic()
        self.say(f"{history.short_name(test)}: block {len(self.blocks.get(test, [])) + 1}: both arms warming up "
                 f"({self._clock()})")
        order = list(self.labels)
        self.random.shuffle(order)
        self.lost: set[str] = set()
        told: list[str] = []
        for label in order:  # one arm warms up at a time, on a GPU the other leaves alone
            self.arms.send(label, {"do": "go"})
            told.append(label)
            if self._expect(label, "ready") is None:
                break
        ratios, latency = self._windows() if not self.lost else ([], {})
        if ratios:
            self.blocks.setdefault(test, []).append(ratios)
            if any(latency.values()):
                self.latency.setdefault(test, []).append(latency)
        self.spent[test] = self.spent.get(test, 0.0) + time.monotonic() - began
        self._progress(test)
        more = bool(ratios) and not self.lost and self._want_more(test, time.monotonic() - began)
        for label in self.labels:
            if label not in self.lost:  # a warm arm without windows measures on its own
                self.arms.send(label, {"do": "done", "more": more} if label in told else {"do": "solo"})

    def _windows(self) -> tuple[list[float], dict[str, list[dict]]]:
        """The block's pairs of windows: each pair's log(candidate / baseline) throughput, and each arm's serving
        job's latency per window (none without a serving job)."""
        baseline, candidate = self.labels
        ratios: list[float] = []
        latency: dict[str, list[dict]] = {label: [] for label in self.labels}
        for _ in range(self.settings.pairs_per_block):
            order = list(self.labels)
            self.random.shuffle(order)
            rate, served = {}, {}
            for label in order:
                self.arms.send(label, {"do": "measure", "window_s": self.settings.window_s})
                answer = self._expect(label, "measured")
                if answer is None:
                    return ratios, latency
                rate[label], served[label] = float(answer["throughput"]), answer.get("latency") or {}
            ratios.append(math.log(rate[candidate] / rate[baseline]))
            if all(served.values()):  # kept in pairs, as the throughput's windows
                for label, window in served.items():
                    latency[label].append(window)
        return ratios, latency

    def judged(self, test: str, name: str) -> list[Judgement]:
        """``test``'s throughput judgement, and its serving job's latency judgements when it has one."""
        settings = self.settings
        judgements = [judge_blocks(name, self.blocks.get(test, []), settings.threshold, settings.alpha)]
        if test in self.latency:
            judgements += judge_latency(name, self.latency[test], self.labels, settings.threshold, settings.alpha,
                                        looks=settings.max_blocks)
        return judgements

    def _clock(self) -> str:
        return f"{(time.monotonic() - self.began) / 60:.1f} minutes of the A/B's {self.settings.budget_s / 60:g}"

    def _progress(self, test: str) -> None:
        """A line when a block ends: the running verdict of each measure so far, and the time spent."""
        name = history.short_name(test)
        if test not in self.blocks:
            self.say(f"{name}: block measured no pair of windows (an arm's scenario failed or ended; see its log)")
            return
        verdicts = "; ".join(
            f"{j.metric} {'-' if j.change is None else f'{j.change:+.1%}'}"
            + ("" if j.ci is None else f" {report.interval(j.ci)}") + f" {j.verdict} so far"
            for j in self.judged(test, name))
        self.say(f"{name}: block {len(self.blocks[test])} done: {verdicts}; {self.spent[test]:.0f} s of its "
                 f"{self.settings.scenario_budget_s / 60:g} minutes, {self._clock()}")

    def _want_more(self, test: str, block_s: float) -> bool:
        settings, blocks = self.settings, self.blocks.get(test, [])
        if len(blocks) == 1 and test in self.latency:  # said after the first block, not once the budget is spent
            needed = shift.units_needed(shift.per_look_alpha(settings.alpha, settings.max_blocks, True))
            fit = max(1, min(settings.max_blocks, int(settings.scenario_budget_s // block_s)))
            if fit < needed:
                self.say(f"{test}: about {count(fit, 'block')} fit (a block took {block_s:.0f} s; "
                         f"--ab-scenario-minutes {settings.scenario_budget_s / 60:g}, --ab-max-blocks "
                         f"{settings.max_blocks}), and a latency verdict needs {needed} blocks: raise them to judge "
                         "its latency")
        if len(blocks) >= settings.max_blocks:
            return False
        if len(blocks) >= settings.min_blocks and not any(
                j.verdict == "inconclusive" and not (j.saturated or j.final) for j in self.judged(test, test)):
            return False  # decided: the budget is not what ended it
        if self.spent[test] + block_s > settings.scenario_budget_s \
                or time.monotonic() - self.began + block_s > settings.budget_s:
            self.say(f"{test}: no more blocks within the budget ({len(blocks)} so far, {block_s:.0f} s each)")
            self.cut_short.add(test)
            return False
        return True


ARM_GRACE_S = 5.0  # an interrupted arm's time to stop its workers itself; then it is killed: ab acts within seconds


def _stop_arms(processes: dict[str, subprocess.Popen]) -> None:
    """Each arm still running is interrupted, then SIGKILLed with its process group after ARM_GRACE_S (its fork
    server then ends its workers); what killed arms left in scratch directories is removed."""
    running = [process for process in processes.values() if process.poll() is None]
    for process in running:
        process.send_signal(signal.SIGINT)
    deadline = time.monotonic() + ARM_GRACE_S
    for process in running:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    if running:
        clean_stale_scratch()


def _arm_command(arm: Arm, pytest_args: list[str], settings: Settings, out: Path, tag: str) -> list[str]:
    """The arm's pytest, saving into the A/B's own folder (after the user's arguments: ours win): an arm is measured
    in turns with the other, so its run must never become a baseline or a comparison in the user's history."""
    own = [] if settings.alone else ["--colloc-alone=off"]  # before the user's: theirs win
    return [arm.python, "-m", "pytest", *own, *pytest_args, "-p", "no:cacheprovider", "-q",
            f"--benchmark-json={out / (arm.label + '.json')}", f"--benchmark-storage=file://{out / 'storage'}",
            f"--benchmark-save={tag}-{arm.label}"]


def run(baseline: Arm, candidate: Arm, pytest_args: list[str], settings: Settings, out: Path,
        say=print) -> tuple[list[Judgement], list[ArmRun]]:
    """Both arms' pytest sessions at once, kept in step by the coordinator; judged when both have ended."""
    labels = (baseline.label, candidate.label)
    arms = dict(zip(labels, (baseline, candidate)))
    out.mkdir(parents=True, exist_ok=True)
    for label in labels:  # an earlier A/B's arm files would read as this one's
        (out / f"{label}.json").unlink(missing_ok=True)
    tag = "ab-" + time.strftime("%Y%m%dT%H%M%S")
    folder = private_scratch()  # short: a Unix socket path holds at most 107 bytes; a killed ab's: see scratch.py
    processes: dict[str, subprocess.Popen] = {}
    logs = {label: out / f"{label}.log" for label in arms}
    say("A/B: each arm's pytest writes to " + ", ".join(f"{logs[label]} ({label})" for label in arms)
        + f"; budget {settings.budget_s / 60:g} minutes ({settings.scenario_budget_s / 60:g} per scenario)")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(str(folder / "ab.sock"))
            server.listen(2)
            for label, arm in arms.items():
                env = {**os.environ, interleave.SOCKET_ENV: str(folder / "ab.sock"), interleave.ARM_ENV: label}
                with open(logs[label], "w") as log:
                    # a session of their own: a Ctrl-C reaches the controller only, which stops them once; SIGTERM
                    # (unwinding as on Ctrl-C) when the controller dies, even by SIGKILL
                    processes[label] = subprocess.Popen(
                        _arm_command(arm, pytest_args, settings, out, tag), cwd=arm.cwd, env=env, stdout=log,
                        stderr=subprocess.STDOUT, start_new_session=True,
                        preexec_fn=functools.partial(worker._die_with_parent, signal.SIGTERM))
            coordinator = Coordinator(_Arms(server, processes), labels, settings, say)
            coordinator.run()
        for process in processes.values():
            process.wait()
    finally:
        _stop_arms(processes)
        shutil.rmtree(folder, ignore_errors=True)
    if coordinator.latency:  # every block's windows, by arm: the latency pictures and any later replay
        (out / "latency-windows.json").write_text(json.dumps(coordinator.latency))  # by test id
        from . import latency_plot  # matplotlib loads only where a service was A/B'd

        latency_plot.draw_ab(coordinator.latency, labels, out, say)
    if coordinator.unpaired:
        say("measured in one arm only (no verdict): " + ", ".join(coordinator.unpaired))
    if coordinator.skipped:
        say("not started, the job's budget was spent (no verdict): " + ", ".join(coordinator.skipped))
    if not coordinator.blocks:
        codes = ", ".join(f"{label} {process.returncode}" for label, process in processes.items())
        failed = [label for label, process in processes.items() if process.returncode not in (0, 5)]
        tail = "".join(f"\nthe {label} arm's log ends:\n{log_tail(logs[label], 12)}" for label in failed)
        if not failed:  # skipped: the session summary's own lines say why (an mps scenario on the CPU, ...)
            skips = [line for line in logs[baseline.label].read_text(errors="replace").splitlines()
                     if line.startswith("skipped ")]
            tail = "".join(f"\n{line}" for line in skips[:3]) + ("\n..." if len(skips) > 3 else "")
        raise ABError("no scenario was measured in both arms: every selected test was skipped or failed, or records "
                      f"no pytest-gpucolloc scenario (pytest exited: {codes}; see {logs[baseline.label]} and "
                      f"{logs[candidate.label]})" + tail)
    runs = [ArmRun(label, out / f"{label}.json") for label in labels]
    for run in runs:
        if (code := processes[run.arm].returncode) not in (0, 1) or not run.path.exists():
            raise ABError(f"the {run.arm} arm's pytest exited {code}; its output ends:\n"
                          f"{logs[run.arm].read_text()[-1500:]}")
    if changes := unexpected_differences([baseline, candidate], *(history.read_run(run.path).machine for run in runs)):
        raise ABError("the arms ran on machines that differ in more than the change being compared: "
                      + "; ".join(changes))
    judgements = []
    for test in coordinator.blocks:
        for judged in coordinator.judged(test, history.short_name(test)):
            if judged.verdict == "inconclusive" and not (judged.saturated or judged.final) \
                    and test in coordinator.cut_short:
                judged.reason = "; ".join(filter(None, [judged.reason, f"a budget stopped it after "
                                                       f"{count(judged.blocks, 'block')}: raise "
                                                       "--ab-scenario-minutes or --ab-budget-minutes"]))
            judgements.append(judged)
    return judgements, runs
