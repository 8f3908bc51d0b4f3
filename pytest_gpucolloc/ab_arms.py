"""The two arms of an A/B: what each is (an interpreter or virtual environment, or a git revision checked out in a
temporary worktree), the checks made before anything runs, and how their machines may differ."""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import machine, nvml
from .scratch import private_scratch

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


NEEDED = ("pytest-gpucolloc", "pytest", "pytest-benchmark", "torch", "torchvision")  # what an arm imports
PROBE = ("import json, platform, importlib.metadata as m\n"
         "out = {'python': platform.python_version()}\n"
         f"for name in {NEEDED!r}:\n"
         "    try:\n        out[name] = m.version(name)\n"
         "    except m.PackageNotFoundError:\n        out[name] = None\n"
         "try:\n    out['torchvision wants'] = [r for r in m.requires('torchvision') or [] if r.startswith('torch')]\n"
         "except m.PackageNotFoundError:\n    pass\n"
         "print(json.dumps(out))\n")


def _git(repo: Path, *args: str, error: str = "") -> str:
    """git's output; ``error``: what its failure says, else git's own last line."""
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode:
        said = done.stderr.strip()
        raise ABError(error or (said.splitlines()[-1] if said else f"git {' '.join(args)} failed"))
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
    if missing := [name for name in NEEDED if not versions.get(name)]:
        raise ABError(f"--{label} {spec}: {python} lacks {', '.join(missing)}, which each arm's pytest and workers "
                      f"need; install it there first: {install_command(python, missing)}")
    if mismatch := _torchvision_mismatch(versions):
        raise ABError(f"--{label} {spec}: {python} has {mismatch}: its workers would fail to import it; install the "
                      f"torchvision built for its torch ({python} -m pip install torchvision from the index its torch "
                      "came from, e.g. --index-url https://download.pytorch.org/whl/cu130)")
    return versions


def install_command(python: str, missing: list[str]) -> str:
    """The command that installs what ``python`` lacks: the plugin as this one is installed (its checkout, editable,
    or its version), which brings the rest; else the pieces missing (a torchvision built for the arm's torch)."""
    if "pytest-gpucolloc" in missing:
        checkout = Path(__file__).resolve().parents[1]
        plugin = f"-e {checkout}" if (checkout / "pyproject.toml").exists() \
            else f"pytest-gpucolloc=={machine.PLUGIN_VERSION}"
        return f"{python} -m pip install {plugin}"
    command = f"{python} -m pip install {' '.join(missing)}"
    if "torchvision" in missing and "torch" not in missing:
        command += " (from the index its torch came from, e.g. --index-url https://download.pytorch.org/whl/cu130)"
    return command


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
    if python := _interpreter(spec):
        return Arm(label, spec, "interpreter", python, here, versions=probe(python, label, spec))
    if Path(spec).exists() or spec.startswith(("/", "./", "../", "~")):
        raise ABError(f"--{label} {spec}: not a Python interpreter or a virtual environment (DIR/bin/python)"
                      + ("" if Path(spec).exists() else ": no such file"))
    _git(here, "rev-parse", "--show-toplevel",
         error=f"--{label} {spec}: a git revision needs a git repository, and {here} is not in one")
    revision = _git(here, "rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}",
                    error=f"--{label} {spec}: no such git revision")
    return Arm(label, spec, "revision", sys.executable, here, revision, probe(sys.executable, label, spec))


def check_pytest_args(pytest_args: list[str]) -> None:
    """An arm is one pytest session on one GPU, measured in turns with the other: pytest-xdist would split it."""
    if any(arg in ("-n", "--numprocesses", "--dist") or arg.startswith(("-n", "--numprocesses=", "--dist="))
           for arg in pytest_args):
        raise ABError("each arm is one pytest session measured in turns with the other: pytest-xdist (-n, --dist) "
                      "cannot run inside an arm; run one A/B per GPU instead")


def check_clean(here: Path) -> None:
    """Revision arms check out committed code: uncommitted changes would be in neither arm."""
    if changed := _git(here, "status", "--porcelain", "--untracked-files=no"):
        files = ", ".join(line.split(maxsplit=1)[-1] for line in changed.splitlines()[:5])
        raise ABError(f"the working tree has uncommitted changes ({files}); neither revision arm would include "
                      "them: commit or stash them first")


def check_gpu_idle(device_args: list[str]) -> None:
    """A GPU that foreign processes use would load one arm and not the other."""
    if "--colloc-device=cpu" in device_args or nvml.init():
        return
    if busy := {gpu.uuid: pids for gpu in nvml.gpus() if (pids := sorted(nvml.gpu_processes(gpu.uuid)))}:
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


ARM_FILES = ("baseline.log", "candidate.log", "baseline.json", "candidate.json", "latency-windows.json", "storage")


def check_out(out: Path, here: Path) -> None:
    """An A/B's folder is never a history's storage (``.benchmarks``, or one holding saved runs): its arms are
    measured in turns, and every command reading that storage would name them as left out."""
    history = (here / ".benchmarks").resolve()
    ordinary = next((run for pattern in ("[0-9][0-9][0-9][0-9]_*.json", "*/[0-9][0-9][0-9][0-9]_*.json")
                     for run in out.glob(pattern) if "_ab-" not in run.name), None)
    if out == history or history in out.parents or ordinary is not None:
        raise ABError(f"--out {out} is a history's storage ({ordinary or history}): an A/B's runs stay out of it; "
                      "give a folder of its own (the default is gpucolloc-ab)")


def fresh_out(out: Path) -> Path:
    """``out``, or where an earlier A/B's arms are there (their logs would be overwritten, their JSON read as this
    one's), the first of ``out-2``, ``out-3``, ... that holds none: an A/B never loses another's files."""
    folders = itertools.chain([out], (out.with_name(f"{out.name}-{number}") for number in itertools.count(2)))
    return next(folder for folder in folders if not any((folder / name).exists() for name in ARM_FILES))


def unexpected_differences(arms: list[Arm], a: dict, b: dict) -> list[str]:
    """How the two arms' machines differ beyond the change being compared."""
    allowed = STACK_KEYS if any(arm.kind == "interpreter" for arm in arms) else set()
    keys = {key for key, _ in machine.DESCRIBED} - allowed
    return machine.differences({k: v for k, v in a.items() if k in keys}, {k: v for k, v in b.items() if k in keys})
