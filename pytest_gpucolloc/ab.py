"""Paired A/B in one job: the same scenarios run by two arms (an interpreter or virtual environment, or a git
revision of the scenario code) on one machine, judged on paired log-ratios. Noise that moves both arms alike (the
machine's level, the physical GPU, drift over the job) cancels; history-based gating cannot do that.

Randomised multiple interleaved trials: both arms' pytest sessions run at once, and for each scenario both arms'
workers are warm at the same time (``interleave.py``). The controller measures one arm's workers for a short window
while the other arm's idle, then the other arm's, in random order: a pair of windows costs seconds. Each *block* is
a fresh set of processes in each arm, so that the noise between processes (large for launch-bound jobs) is measured:
the unit of the statistics is a block's mean log-ratio d = log(B / A), not a window.

With m blocks, mean m_d and standard error s/sqrt(m) (Student t, m - 1 degrees of freedom): ``regressed`` when B is
slower at one-sided p < alpha and by at least the threshold; ``improved`` likewise faster; ``unchanged`` when the
two-sided (1 - 2 alpha) interval of the change lies within the threshold; otherwise ``inconclusive``, and another
block is run, within the scenario's and the job's budgets.

A scenario with a serving job is also judged on its latency, lower being better, at p50 and at each higher percentile
its blocks hold requests enough for (p90, p99, p99.9): per block and arm the windows' histograms merged, d =
log(B / A) of the percentile, judged by signs (``shift.py``: the median block's change, the sign test's p, the
median's distribution-free interval), as a latency's ratios are heavy-tailed and one stalled block must not decide.
The same stopping rule. A service whose queue grew in a window (``serving.summary``'s rule) is not judged on latency: it
measured the queue.
"""
from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import random
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import history, interleave, machine, nvml, serving, shift, worker
from .outcome import Outcome
from .scratch import clean_stale_scratch, private_scratch

# What may differ between two interpreters' runs: the stack is the change being compared.
STACK_KEYS = {"python", "torch", "torchvision", "cuda_runtime", "cudnn", "plugin_version"}


class ABError(ValueError):
    """Bad input, found before anything runs (or the arms turned out to differ in more than the change)."""


@dataclass
class Arm:
    label: str  # "baseline" or "candidate"
    spec: str  # as the user gave it
    kind: str  # "interpreter" or "revision"
    python: str
    cwd: Path  # where its pytest runs
    revision: str | None = None  # the full commit, for a revision
    versions: dict = field(default_factory=dict)  # what its interpreter reports (plugin, torch, python)


PROBE = ("import json, platform, importlib.metadata as m\n"
         "out = {'python': platform.python_version()}\n"
         "for name in ('pytest-gpucolloc', 'pytest', 'pytest-benchmark', 'torch', 'torchvision'):\n"
         "    try:\n        out[name] = m.version(name)\n"
         "    except m.PackageNotFoundError:\n        out[name] = None\n"
         "try:\n    out['torchvision wants'] = [r for r in m.requires('torchvision') or [] if r.startswith('torch')]\n"
         "except m.PackageNotFoundError:\n    pass\n"
         "print(json.dumps(out))\n")


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode:
        raise ABError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"git {' '.join(args)} failed")
    return done.stdout.strip()


def _interpreter(spec: str) -> str | None:
    """The Python of ``spec`` when it names an interpreter or a virtual environment."""
    path = Path(spec)
    if path.is_dir() and (path / "bin" / "python").exists():
        return str(path / "bin" / "python")
    if path.is_file() and os.access(path, os.X_OK):
        return str(path)
    return None


def probe(python: str, label: str, spec: str) -> dict:
    try:
        done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=120)
    except OSError as error:
        raise ABError(f"--{label} {spec}: cannot run {python}: {error}") from None
    if done.returncode:
        raise ABError(f"--{label} {spec}: {python} failed: {done.stderr.strip()[-300:]}")
    versions = json.loads(done.stdout.strip().splitlines()[-1])
    missing = [name for name in ("pytest-gpucolloc", "pytest", "pytest-benchmark") if not versions.get(name)]
    if missing:
        raise ABError(f"--{label} {spec}: {python} lacks {', '.join(missing)}; install the plugin there "
                      f"({python} -m pip install pytest-gpucolloc, or -e this checkout)")
    mismatch = _torchvision_mismatch(versions)
    if mismatch:
        raise ABError(f"--{label} {spec}: {python} has {mismatch}: its workers would fail to import it; install the "
                      f"torchvision built for its torch ({python} -m pip install torchvision from the index its torch "
                      "came from, e.g. --index-url https://download.pytorch.org/whl/cu130)")
    return versions


def _torchvision_mismatch(versions: dict) -> str | None:
    """torchvision names the torch it was built for (``torch==2.11.0``): another torch makes it fail at import."""
    from packaging.requirements import InvalidRequirement, Requirement

    torch = versions.get("torch")
    for text in versions.get("torchvision wants") or []:
        try:
            wanted = Requirement(text)
        except InvalidRequirement:
            continue
        if torch and wanted.name == "torch" and not wanted.specifier.contains(torch.split("+")[0], prereleases=True):
            return (f"torch {torch} beside torchvision {versions.get('torchvision')}, which wants "
                    f"torch{wanted.specifier}")
    return None


def resolve(spec: str, label: str, here: Path) -> Arm:
    """An arm from its SPEC: an interpreter, a virtual environment, or a git revision of the repository ``here``
    is in (its scenario code checked out later, in a temporary worktree)."""
    python = _interpreter(spec)
    if python:
        return Arm(label, spec, "interpreter", python, here, versions=probe(python, label, spec))
    if Path(spec).exists() or spec.startswith(("/", "./", "../", "~")):
        raise ABError(f"--{label} {spec}: not a Python interpreter or a virtual environment (DIR/bin/python)"
                      + ("" if Path(spec).exists() else ": no such file"))
    try:
        _git(here, "rev-parse", "--show-toplevel")
    except ABError:
        raise ABError(f"--{label} {spec}: a git revision needs a git repository, and {here} is not in one") from None
    try:
        revision = _git(here, "rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}")
    except ABError:
        raise ABError(f"--{label} {spec}: no such git revision") from None
    return Arm(label, spec, "revision", sys.executable, here, revision, probe(sys.executable, label, spec))


def check_pytest_args(pytest_args: list[str]) -> None:
    """An arm is one pytest session on one GPU, measured in turns with the other: pytest-xdist would split it."""
    if any(arg in ("-n", "--numprocesses", "--dist") or arg.startswith(("-n", "--numprocesses=", "--dist="))
           for arg in pytest_args):
        raise ABError("each arm is one pytest session measured in turns with the other: pytest-xdist (-n, --dist) "
                      "cannot run inside an arm; run one A/B per GPU instead")


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM (a CI job cancelled) unwinds like Ctrl-C: the arms are stopped, worktrees and sockets removed."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def check_clean(here: Path) -> None:
    """Revision arms check out committed code: uncommitted changes would be in neither arm."""
    changed = _git(here, "status", "--porcelain", "--untracked-files=no")
    if changed:
        files = ", ".join(line.split(maxsplit=1)[-1] for line in changed.splitlines()[:5])
        raise ABError(f"the working tree has uncommitted changes ({files}); neither revision arm would include "
                      "them: commit or stash them first")


def check_gpu_idle(device_args: list[str]) -> None:
    """A GPU that foreign processes use would load one arm and not the other."""
    if "--colloc-device=cpu" in device_args or nvml.init():
        return
    busy = {gpu.uuid: pids for gpu in nvml.gpus() if (pids := sorted(nvml.gpu_processes(gpu.uuid)))}
    if busy:
        raise ABError("the GPU is in use by other processes (" + "; ".join(
            f"{uuid}: pids {', '.join(map(str, pids))}" for uuid, pids in busy.items()) + "): an A/B needs it idle")


@contextlib.contextmanager
def checked_out(arms: list[Arm], here: Path):
    """Revision arms get a temporary detached worktree each (the user's working tree is never touched);
    removed afterwards, whatever happens."""
    made: list[Path] = []
    try:
        top = Path(_git(here, "rev-parse", "--show-toplevel")) if any(a.kind == "revision" for a in arms) else here
        for arm in arms:
            if arm.kind != "revision" or arm.revision is None:
                continue
            folder = private_scratch() / arm.label  # a killed ab's is removed, and unregistered, by the next run
            _git(here, "worktree", "add", "--detach", "--quiet", str(folder), arm.revision)
            made.append(folder)
            arm.cwd = folder / here.resolve().relative_to(top)
        yield arms
    finally:
        for folder in made:
            subprocess.run(["git", "-C", str(here), "worktree", "remove", "--force", str(folder)], capture_output=True)
            shutil.rmtree(folder.parent, ignore_errors=True)


@dataclass
class ArmRun:
    """One arm's pytest session."""

    arm: str
    path: Path  # its --benchmark-json
    log: Path
    returncode: int
    machine: dict = field(default_factory=dict)


def unexpected_differences(arms: list[Arm], a: dict, b: dict) -> list[str]:
    """How the two arms' machines differ beyond the change being compared."""
    allowed = STACK_KEYS if any(arm.kind == "interpreter" for arm in arms) else set()
    keys = {key for key, _ in machine.DESCRIBED} - allowed
    return machine.differences({k: v for k, v in a.items() if k in keys}, {k: v for k, v in b.items() if k in keys})


@dataclass(kw_only=True)
class Judgement:
    scenario: str
    verdict: Outcome  # regressed | improved | unchanged | inconclusive
    pairs: int
    metric: str = "throughput"  # or a serving job's latency percentile ("p50", "p99", ...), lower is better
    change: float | None = None  # candidate vs baseline, a fraction (throughput: + is faster; latency: + is slower)
    ci: tuple[float, float] | None = None
    p_slower: float | None = None  # one-sided p of the candidate being worse
    detectable: float | None = None  # smallest worsening these pairs resolve (half-width of the interval)
    log_ratios: list[float] = field(default_factory=list)
    blocks: int = 0  # sets of fresh processes per arm (0: each ratio stands alone, e.g. alternated sessions)
    reason: str = ""
    ms: tuple[float, float] | None = None  # a latency's: baseline's and candidate's, medians over the blocks
    saturated: bool = False  # a service's queue grew: its latency is not judged
    final: bool = False  # inconclusive whatever more blocks say (too few requests a block for this percentile)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("scenario", "metric", "verdict", "pairs", "blocks", "change", "ci",
                                               "p_slower", "detectable", "reason", "log_ratios", "ms",
                                               "saturated")}


def judge(scenario: str, ratios: list[float], threshold: float, alpha: float,
          lower_is_better: bool = False) -> Judgement:
    """Each log-ratio an independent unit (a block's mean, or a session against its neighbours)."""
    from scipy import stats

    n = len(ratios)
    if n < 2:  # one unit shows a change but no spread to judge it by
        return Judgement(scenario=scenario, verdict="inconclusive", pairs=n,
                         change=math.exp(ratios[0]) - 1 if ratios else None, log_ratios=ratios,
                         reason="one unit has no spread to judge it by")
    mean, spread = statistics.fmean(ratios), statistics.stdev(ratios)
    error = spread / math.sqrt(n)
    critical = stats.t.ppf(1 - alpha, n - 1)
    low, high = mean - critical * error, mean + critical * error
    if error > 0:
        p_down, p_up = stats.t.cdf(mean / error, n - 1), stats.t.sf(mean / error, n - 1)
    else:
        p_down, p_up = float(mean >= 0), float(mean <= 0)
    p_worse, p_better = (p_up, p_down) if lower_is_better else (p_down, p_up)
    change = math.exp(mean) - 1
    worse_by = change if lower_is_better else -change
    bound = math.log(1 + threshold)
    verdict: Outcome
    if p_worse < alpha and worse_by >= threshold:
        verdict = "regressed"
    elif p_better < alpha and -worse_by >= threshold:
        verdict = "improved"
    elif -bound < low and high < bound:
        verdict = "unchanged"
    else:
        verdict = "inconclusive"
    detectable = math.exp(critical * error) - 1 if lower_is_better else 1 - math.exp(-critical * error)
    return Judgement(scenario=scenario, verdict=verdict, pairs=n, change=change,
                     ci=(math.exp(low) - 1, math.exp(high) - 1), p_slower=float(p_worse), detectable=detectable,
                     log_ratios=ratios)


ONE_BLOCK = "one block of processes: the noise between processes is not known yet"


def judge_blocks(scenario: str, blocks: list[list[float]], threshold: float, alpha: float) -> Judgement:
    """Windows paired within blocks of fresh processes: each block's mean log-ratio is one unit, so that a
    difference between two arms' processes is noise, not a verdict."""
    blocks = [block for block in blocks if block]
    judged = judge(scenario, [statistics.fmean(block) for block in blocks], threshold, alpha)
    judged.pairs, judged.blocks = sum(map(len, blocks)), len(blocks)
    judged.log_ratios = [x for block in blocks for x in block]
    if len(blocks) < 2:
        judged.reason = ONE_BLOCK
    return judged


def _queue_grew(window: dict) -> str | None:
    """Why a service's window shows a queue that grew instead of draining (``serving.summary``'s rule), or None."""
    offered, backlog = window.get("offered_rps"), window["backlog"]
    if not offered or not serving.queue_grew(backlog, offered):
        return None
    return (f"{backlog:,} requests still queued at a window's end ({backlog / offered:.1f} s of arrivals at "
            f"{offered:,.0f} requests/s)")


def merged(windows: list[dict]):
    """One arm's windows of a block, every request in one histogram."""
    histogram = serving.new_histogram()
    for window in windows:
        histogram.add(serving.decode(window["histogram"]))
    return histogram


def judge_latency(scenario: str, blocks: list[dict[str, list[dict]]], labels: tuple[str, str], threshold: float,
                  alpha: float) -> list[Judgement]:
    """A serving job's latency, lower is better, at each percentile its blocks resolve (``serving.JUDGED``): per
    block, each arm's windows merged (every request counts) and the block's log(candidate / baseline) of the
    percentile one unit, judged by signs (``shift.judge``) so that one disturbed block cannot decide. Not judged when
    a window of either arm saturated, but ``regressed`` when the candidate's queue grew in most blocks (at least
    two) and the baseline's never did."""
    pairs = sum(len(block.get(label, [])) for block in blocks for label in labels) // 2
    grew = {label: [(number, why) for number, block in enumerate(blocks, 1)
                    for why in map(_queue_grew, block.get(label, [])) if why] for label in labels}
    behind = {number for number, _ in grew[labels[1]]}  # blocks in which the candidate's queue grew
    if len(behind) >= max(2, math.ceil(len(blocks) / 2)) and not grew[labels[0]]:
        # in most blocks the candidate cannot keep up where the baseline does (one block: a stall, not judged)
        number, why = grew[labels[1]][0]
        return [Judgement(scenario=scenario, metric="latency", verdict="regressed", pairs=pairs, blocks=len(blocks),
                          saturated=True,
                          reason=f"the {labels[1]}'s service saturated in {len(behind)} of {len(blocks)} blocks "
                                 f"(block {number}: {why}) at a rate the {labels[0]}'s served without a queue: it can "
                                 "no longer keep up")]
    for label in labels:
        if grew[label]:
            number, why = grew[label][0]
            return [Judgement(scenario=scenario, metric="latency", verdict="inconclusive", pairs=pairs,
                              blocks=len(blocks), saturated=True,
                              reason=f"latency not judged: the {label}'s service saturated in block {number}, "
                                     f"{why}; its latency measured the queue, not the job (lower its rate)")]
    histograms = [tuple(merged(block.get(label, [])) for label in labels) for block in blocks]
    histograms = [pair for pair in histograms if all(h.get_total_count() for h in pair)]
    judgements = []
    for percentile in serving.JUDGED:
        # the blocks whose arms both hold requests enough for this percentile (p50: every block)
        usable = [pair for pair in histograms if percentile == serving.JUDGED[0]
                  or serving.resolves(min(h.get_total_count() for h in pair), percentile)]
        if percentile != serving.JUDGED[0] and len(usable) < shift.units_needed(alpha):
            if percentile == 99:  # the tail a reader looks for: why it has no verdict (more blocks will not help)
                fewest = min((h.get_total_count() for pair in histograms for h in pair), default=0)
                judgements.append(Judgement(
                    scenario=scenario, metric="p99", verdict="inconclusive", pairs=pairs, blocks=len(usable),
                    final=True,
                    reason=f"blocks hold as few as {fewest} requests an arm, too few for p99 in "
                           f"{len(histograms) - len(usable)} of {len(histograms)} blocks "
                           f"({serving.TAIL_REQUESTS / (1 - percentile / 100):.0f} needed): more --ab-pairs or "
                           "longer --ab-window-seconds"))
            continue  # too few requests a block to say anything of this tail (p50 is always said)
        values = [tuple(h.get_value_at_percentile(percentile) / 1000 for h in pair) for pair in usable]
        ratios = [math.log(c / b) for b, c in values if b > 0 and c > 0]
        found = shift.judge(ratios, threshold, alpha)
        judged = Judgement(scenario=scenario, metric=serving.name(percentile), verdict=found.verdict, pairs=pairs,
                           blocks=len(ratios), change=found.change, ci=found.ci, p_slower=found.p_worse,
                           detectable=found.detectable, log_ratios=ratios)
        if values:
            judged.ms = (statistics.median(b for b, _ in values), statistics.median(c for _, c in values))
        if found.ci is None and ratios:
            judged.reason = (f"{len(ratios)} block{'s' * (len(ratios) != 1)} cannot resolve a change at this alpha "
                             f"(signs need {shift.units_needed(alpha)}); {found.above} of {len(ratios)} rose")
        judgements.append(judged)
    return judgements


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

    def push_back(self, label: str, message: dict) -> None:
        self.lines[label].appendleft(message)

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
            if first is not None and first == second and first[1:] == (0, 0) \
                    and time.monotonic() - self.began >= self.settings.budget_s:
                for label in self.labels:  # a new scenario once the job's budget is spent: skipped, saying why
                    self.arms.send(label, {"do": "skip", "why": f"the A/B's budget of {self.settings.budget_s / 60:g} "
                                                                "minutes was spent before this scenario"})
                self.skipped.append(first[0])
                continue
            if first is not None and first == second:
                self._pair(first)
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
            self.arms.push_back(label, message)
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
                rate[label], served[label] = float(answer["throughput"]), answer.get("latency")
            ratios.append(math.log(rate[candidate] / rate[baseline]))
            windows = {label: window for label, window in served.items() if window}
            if len(windows) == len(self.labels):  # kept in pairs, as the throughput's windows
                for label, window in windows.items():
                    latency[label].append(window)
        return ratios, latency

    def judged(self, test: str, name: str) -> list[Judgement]:
        """``test``'s throughput judgement, and its serving job's latency judgements when it has one."""
        settings = self.settings
        judgements = [judge_blocks(name, self.blocks.get(test, []), settings.threshold, settings.alpha)]
        if test in self.latency:
            judgements += judge_latency(name, self.latency[test], self.labels, settings.threshold, settings.alpha)
        return judgements

    def _clock(self) -> str:
        return f"{(time.monotonic() - self.began) / 60:.1f} of the A/B's {self.settings.budget_s / 60:g} minutes"

    def _progress(self, test: str) -> None:
        """A line when a block ends: the running verdict of each measure so far, and the time spent."""
        name = history.short_name(test)
        if test not in self.blocks:
            self.say(f"{name}: block measured no pair of windows (an arm's scenario failed or ended; see its log)")
            return
        verdicts = "; ".join(
            f"{j.metric} {'-' if j.change is None else f'{j.change:+.1%}'}"
            + ("" if j.ci is None else f" [{j.ci[0]:+.1%}, {j.ci[1]:+.1%}]") + f" {j.verdict} so far"
            for j in self.judged(test, name))
        self.say(f"{name}: block {len(self.blocks[test])} done: {verdicts}; {self.spent[test]:.0f} s of its "
                 f"{self.settings.scenario_budget_s / 60:g} minutes, {self._clock()}")

    def _want_more(self, test: str, block_s: float) -> bool:
        settings, blocks = self.settings, self.blocks.get(test, [])
        if len(blocks) >= settings.max_blocks:
            return False
        if self.spent[test] + block_s > settings.scenario_budget_s \
                or time.monotonic() - self.began + block_s > settings.budget_s:
            self.say(f"{test}: no more blocks within the budget ({len(blocks)} so far, {block_s:.0f} s each)")
            self.cut_short.add(test)
            return False
        if len(blocks) < settings.min_blocks:
            return True
        return any(j.verdict == "inconclusive" and not (j.saturated or j.final) for j in self.judged(test, test))


def draw_latency(latency: dict[str, list[dict[str, list[dict]]]], labels: tuple[str, str], out: Path, say) -> None:
    """Each serving scenario's latency distribution per arm, every block's requests merged, as latency-TEST.png."""
    from . import latency_plot  # matplotlib loads only where a service was A/B'd
    from .plots import slug  # matplotlib, as above

    for test, blocks in latency.items():
        curves = {label: merged([w for block in blocks for w in block.get(label, [])]) for label in labels}
        name = history.short_name(test)
        path = out / f"latency-{slug(test)}.png"
        try:
            latency_plot.save(latency_plot.figure(curves, f"{name}: latency per arm, {len(blocks)} blocks"), path)
        except (OSError, ValueError) as error:  # a picture never costs the verdicts
            say(f"{name}: the latency picture could not be drawn ({error})")
            continue
        say(f"{name}: latency distribution per arm in {path}")


ARM_GRACE_S = 5.0  # an interrupted arm's time to stop its workers itself; then it is killed: ab acts within seconds


def _interrupt_if_ab_dies() -> None:
    """In an arm, before exec: SIGTERM (its session unwinds as on Ctrl-C) when the ab controller dies, even by
    SIGKILL. What the arms leave, the next run removes (scratch.clean_stale_scratch)."""
    worker._die_with_parent(signal.SIGTERM)


def _stop_arms(processes: dict[str, subprocess.Popen]) -> None:
    """Ctrl-C, SIGTERM or an error here: each arm still running is interrupted, and SIGKILLed with its process group
    after ARM_GRACE_S (its fork server then ends its workers); what killed arms left in scratch directories is
    removed."""
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
    """Both arms' pytest sessions at once, kept in step by the coordinator; judged when both have ended. Progress
    goes to ``say``: where the arms' logs are, then a line as each block starts and ends."""
    out.mkdir(parents=True, exist_ok=True)
    for label in (baseline.label, candidate.label):  # an earlier A/B's arm files would read as this one's
        (out / f"{label}.json").unlink(missing_ok=True)
    tag = "ab-" + time.strftime("%Y%m%dT%H%M%S")
    folder = private_scratch()  # short: a Unix socket path holds at most 107 bytes; a killed ab's: see scratch.py
    arms = {baseline.label: baseline, candidate.label: candidate}
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
                    # a session of their own: a Ctrl-C reaches the controller only, which stops them once
                    processes[label] = subprocess.Popen(_arm_command(arm, pytest_args, settings, out, tag),
                                                        cwd=arm.cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                        start_new_session=True, preexec_fn=_interrupt_if_ab_dies)
            coordinator = Coordinator(_Arms(server, processes), (baseline.label, candidate.label), settings, say)
            coordinator.run()
        for process in processes.values():
            process.wait()
    finally:
        _stop_arms(processes)
        shutil.rmtree(folder, ignore_errors=True)
    if coordinator.latency:  # every block's windows, by arm: the latency pictures and any later replay
        (out / "latency-windows.json").write_text(json.dumps(coordinator.latency))  # by test id
        draw_latency(coordinator.latency, (baseline.label, candidate.label), out, say)
    if coordinator.unpaired:
        say("measured in one arm only (no verdict): " + ", ".join(coordinator.unpaired))
    if coordinator.skipped:
        say("not started, the job's budget was spent (no verdict): " + ", ".join(coordinator.skipped))
    if not coordinator.blocks:
        codes = ", ".join(f"{label} {process.returncode}" for label, process in processes.items())
        failed = [label for label, process in processes.items() if process.returncode not in (0, 5)]
        tail = "".join(f"\nthe {label} arm's log ends:\n{logs[label].read_text(errors='replace')[-800:]}"
                       for label in failed)
        raise ABError("no scenario was measured in both arms: every selected test was skipped or failed, or records "
                      f"no pytest-gpucolloc scenario (pytest exited: {codes}; see {logs[baseline.label]} and "
                      f"{logs[candidate.label]})" + tail)
    runs = []
    for label in arms:
        path = out / f"{label}.json"
        code = processes[label].returncode
        if code not in (0, 1) or not path.exists():
            raise ABError(f"the {label} arm's pytest exited {code}; its output ends:\n"
                          f"{logs[label].read_text()[-1500:]}")
        runs.append(ArmRun(label, path, logs[label], code, history.read_run(path).machine))
    changes = unexpected_differences([baseline, candidate], runs[0].machine, runs[1].machine)
    if changes:
        raise ABError("the arms ran on machines that differ in more than the change being compared: "
                      + "; ".join(changes))
    judgements = []
    for test in coordinator.blocks:
        for judged in coordinator.judged(test, history.short_name(test)):
            if judged.verdict == "inconclusive" and not (judged.saturated or judged.final) \
                    and test in coordinator.cut_short:
                blocks = f"{judged.blocks} block{'s' * (judged.blocks != 1)}"
                judged.reason = "; ".join(filter(None, [judged.reason, f"a budget stopped it after {blocks}: raise "
                                                       "--ab-scenario-minutes or --ab-budget-minutes"]))
            judgements.append(judged)
    return judgements, runs


def in_words(judgements: list[Judgement]) -> list[str]:
    """Per serving scenario, which part of its latency distribution moved: "the service got slower (p50 +17%), its
    tail too (p99 +12%)", or only its tail, or neither beyond noise."""
    lines = []
    for scenario in dict.fromkeys(j.scenario for j in judgements):
        by = {j.metric: j for j in judgements if j.scenario == scenario}
        median = by.get("p50")
        tails = [by[m] for m in ("p99.9", "p99", "p90") if m in by and by[m].change is not None]
        # the tail that regressed, else the highest one judged
        tail = next((t for t in tails if t.verdict == "regressed"), tails[0] if tails else None)
        if median is None or median.change is None:
            continue
        said = f"{median.metric} {median.change:+.1%}"
        tail_said = f"{tail.metric} {tail.change:+.1%}" if tail is not None and tail.change is not None else None
        tail_verdict = tail.verdict if tail is not None else None
        if median.verdict == "regressed":
            text = f"the service got slower ({said})" + (
                "" if tail_said is None else f", its tail too ({tail_said})" if tail_verdict == "regressed"
                else f"; its tail {tail_verdict} ({tail_said})")
        elif tail_verdict == "regressed":
            text = f"only its tail got worse ({tail_said}); the median {median.verdict} ({said})"
        elif median.verdict == "improved":
            text = f"the service got faster ({said})"
        else:
            text = f"no latency moved beyond what {median.blocks} blocks resolve ({said}" + (
                f", {tail_said})" if tail_said else ")")
        lines.append(f"{scenario}: {text}")
    return lines


HEADERS = ["scenario", "measure", "verdict", "blocks", "pairs", "change (candidate vs baseline)", "interval",
           "p (slower)", "detectable worsening", "why"]


def _measure(judged: Judgement) -> str:
    if judged.metric == "throughput":
        return judged.metric
    if judged.ms is None:
        return judged.metric
    return f"{judged.metric} {judged.ms[0]:.3g} -> {judged.ms[1]:.3g} ms"


def table(judgements: list[Judgement], fmt: str = "simple") -> str:
    from tabulate import tabulate

    rows = [[j.scenario, _measure(j), j.verdict, str(j.blocks), str(j.pairs),
             "-" if j.change is None else f"{j.change:+.2%}",
             "-" if j.ci is None else f"[{j.ci[0]:+.2%}, {j.ci[1]:+.2%}]",
             "-" if j.p_slower is None else f"{j.p_slower:.2g}",
             "-" if j.detectable is None else f"{j.detectable:.2%}", j.reason or "-"] for j in judgements]
    return tabulate(rows, headers=HEADERS, tablefmt=fmt, disable_numparse=True)
