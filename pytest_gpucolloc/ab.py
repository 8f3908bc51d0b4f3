"""Paired A/B in one job: the same scenarios run by two arms (an interpreter or virtual environment, or a git
revision of the scenario code), each run a fresh pytest process, the arms alternating A B B A ... on the same
machine, and each scenario judged on its paired log-ratios. Noise that moves both arms of a pair alike (the
machine's level, the physical GPU, the time of day) cancels; history-based gating cannot do that.

A pair's log-ratio d = log(B / A). With n pairs, mean m and standard error s/sqrt(n) (Student t, n - 1 degrees
of freedom): ``regressed`` when B is slower at one-sided p < alpha and by at least the threshold; ``improved``
likewise faster; ``unchanged`` when the two-sided (1 - 2 alpha) interval of the change lies within the threshold;
otherwise ``inconclusive``, and more pairs are run, up to a budget.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import history, machine

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
         "for name in ('pytest-gpucolloc', 'pytest', 'pytest-benchmark', 'torch'):\n"
         "    try:\n        out[name] = m.version(name)\n"
         "    except m.PackageNotFoundError:\n        out[name] = None\n"
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
                      "(pip install pytest-gpucolloc, or -e this checkout)")
    return versions


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


def check_clean(here: Path) -> None:
    """Revision arms check out committed code: uncommitted changes would be in neither arm."""
    changed = _git(here, "status", "--porcelain", "--untracked-files=no")
    if changed:
        files = ", ".join(line.split(maxsplit=1)[-1] for line in changed.splitlines()[:5])
        raise ABError(f"the working tree has uncommitted changes ({files}); neither revision arm would include "
                      "them: commit or stash them first")


def check_gpu_idle(device_args: list[str]) -> None:
    """A GPU that foreign processes use would load one arm and not the other."""
    from . import nvml

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
        top = Path(_git(here, "rev-parse", "--show-toplevel")) if any(a.kind == "revision" for a in arms) else None
        for arm in arms:
            if arm.kind != "revision":
                continue
            folder = Path(tempfile.mkdtemp(prefix="gc-ab-")) / arm.label
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
    arm: str
    pair: int
    throughputs: dict[str, float]  # scenario (test name) -> aggregate samples/s (geometric mean over its rounds)
    machine: dict
    path: Path
    returncode: int


def run_arm(arm: Arm, pair: int, pytest_args: list[str], out: Path, storage: Path, tag: str) -> ArmRun:
    """One fresh pytest process of ``arm``; its run is saved to ``storage`` named as a pair of this A/B."""
    path = out / f"{arm.label}-{pair:03d}.json"
    command = [arm.python, "-m", "pytest", *pytest_args, "-p", "no:cacheprovider", "-q",
               f"--benchmark-json={path}", f"--benchmark-storage=file://{storage}",
               f"--benchmark-save={tag}-pair{pair:03d}-{arm.label}"]
    log = out / f"{arm.label}-{pair:03d}.log"
    with open(log, "w") as handle:
        done = subprocess.run(command, cwd=arm.cwd, stdout=handle, stderr=subprocess.STDOUT)
    if done.returncode not in (0, 1) or not path.exists():
        tail = log.read_text()[-1500:]
        raise ABError(f"the {arm.label} arm's pytest exited {done.returncode} (pair {pair}); its output ends:\n{tail}")
    saved = history.read_run(path)
    throughputs = {history.short_name(name): math.exp(history.sample_of(record, "").log_mean)
                   for name, record in saved.scenarios.items()}
    return ArmRun(arm.label, pair, throughputs, saved.machine, path, done.returncode)


def unexpected_differences(arms: list[Arm], a: dict, b: dict) -> list[str]:
    """How the two arms' machines differ beyond the change being compared."""
    allowed = STACK_KEYS if any(arm.kind == "interpreter" for arm in arms) else set()
    keys = {key for key, _ in machine.DESCRIBED} - allowed
    return machine.differences({k: v for k, v in a.items() if k in keys}, {k: v for k, v in b.items() if k in keys})


@dataclass
class Judgement:
    scenario: str
    verdict: str  # regressed | improved | unchanged | inconclusive
    pairs: int
    change: float | None = None  # candidate vs baseline, fraction (+ faster)
    ci: tuple[float, float] | None = None
    p_slower: float | None = None
    detectable: float | None = None  # smallest drop these pairs resolve (half-width of the interval)
    log_ratios: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("scenario", "verdict", "pairs", "change", "ci", "p_slower",
                                               "detectable", "log_ratios")}


def judge(scenario: str, ratios: list[float], threshold: float, alpha: float) -> Judgement:
    from scipy import stats

    n = len(ratios)
    if n < 2:  # one pair shows a change but no spread to judge it by
        return Judgement(scenario, "inconclusive", n, math.exp(ratios[0]) - 1 if ratios else None, log_ratios=ratios)
    mean, spread = statistics.fmean(ratios), statistics.stdev(ratios)
    error = spread / math.sqrt(n)
    critical = stats.t.ppf(1 - alpha, n - 1)
    low, high = mean - critical * error, mean + critical * error
    if error > 0:
        p_slower, p_faster = stats.t.cdf(mean / error, n - 1), stats.t.sf(mean / error, n - 1)
    else:
        p_slower, p_faster = float(mean >= 0), float(mean <= 0)
    change = math.exp(mean) - 1
    bound = math.log(1 + threshold)
    if p_slower < alpha and -change >= threshold:
        verdict = "regressed"
    elif p_faster < alpha and change >= threshold:
        verdict = "improved"
    elif -bound < low and high < bound:
        verdict = "unchanged"
    else:
        verdict = "inconclusive"
    return Judgement(scenario, verdict, n, change, (math.exp(low) - 1, math.exp(high) - 1), p_slower,
                     1 - math.exp(-critical * error), ratios)


@dataclass
class Settings:
    threshold: float = 0.02
    alpha: float = 0.005
    min_pairs: int = 3
    max_pairs: int = 10
    budget_s: float = 3600.0


def run(baseline: Arm, candidate: Arm, pytest_args: list[str], settings: Settings, storage: Path, out: Path,
        say=print) -> tuple[list[Judgement], list[ArmRun]]:
    """Pairs until every scenario is decided (after ``min_pairs``), or ``max_pairs``, or the budget is spent."""
    out.mkdir(parents=True, exist_ok=True)
    tag = "ab-" + time.strftime("%Y%m%dT%H%M%S")
    began = time.monotonic()
    runs: list[ArmRun] = []
    judgements: list[Judgement] = []
    for pair in range(settings.max_pairs):
        order = (baseline, candidate) if pair % 2 == 0 else (candidate, baseline)  # A B, B A, ...
        done = {arm.label: run_arm(arm, pair, pytest_args, out, storage, tag) for arm in order}
        runs += done.values()
        a, b = done[baseline.label], done[candidate.label]
        if pair == 0:
            changes = unexpected_differences([baseline, candidate], a.machine, b.machine)
            if changes:
                raise ABError("the arms ran on machines that differ in more than the change being compared: "
                              + "; ".join(changes))
            if not a.throughputs:
                raise ABError("the selected tests recorded no pytest-gpucolloc scenario")
        judgements = judge_all(runs, baseline.label, candidate.label, settings)
        say(f"pair {pair + 1}: " + ", ".join(f"{j.scenario} {j.verdict}" for j in judgements))
        spent = time.monotonic() - began
        if pair + 1 >= settings.min_pairs and all(j.verdict != "inconclusive" for j in judgements):
            break
        if spent / (pair + 1) * (pair + 2) > settings.budget_s:
            short = (f", after {pair + 1} of the {settings.min_pairs} pairs asked for at least (a pair took "
                     f"{spent / (pair + 1):.0f} s: raise --ab-budget-minutes)" if pair + 1 < settings.min_pairs else "")
            say(f"stopping: another pair would pass the budget of {settings.budget_s / 60:g} minutes{short}")
            break
    return judgements, runs


def judge_all(runs: list[ArmRun], baseline: str, candidate: str, settings: Settings) -> list[Judgement]:
    by_pair: dict[int, dict[str, ArmRun]] = {}
    for one in runs:
        by_pair.setdefault(one.pair, {})[one.arm] = one
    scenarios = list(dict.fromkeys(name for one in runs for name in one.throughputs))
    judgements = []
    for name in scenarios:
        ratios = [math.log(p[candidate].throughputs[name] / p[baseline].throughputs[name])
                  for p in by_pair.values() if baseline in p and candidate in p
                  and name in p[baseline].throughputs and name in p[candidate].throughputs]
        judgements.append(judge(name, ratios, settings.threshold, settings.alpha))
    return judgements


HEADERS = ["scenario", "verdict", "pairs", "change (candidate vs baseline)", "interval", "p (slower)",
           "detectable drop"]


def table(judgements: list[Judgement], fmt: str = "simple") -> str:
    from tabulate import tabulate

    rows = [[j.scenario, j.verdict, str(j.pairs), "-" if j.change is None else f"{j.change:+.2%}",
             "-" if j.ci is None else f"[{j.ci[0]:+.2%}, {j.ci[1]:+.2%}]",
             "-" if j.p_slower is None else f"{j.p_slower:.2g}",
             "-" if j.detectable is None else f"{j.detectable:.2%}"] for j in judgements]
    return tabulate(rows, headers=HEADERS, tablefmt=fmt, disable_numparse=True)
