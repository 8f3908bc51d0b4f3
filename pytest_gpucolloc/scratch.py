"""Private scratch directories (MPS pipes and logs, worker logs) and what killed runs left of them."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from . import process_marks
from .mps_daemon import mps_processes

SCRATCH_PREFIX = "gc-"
OWNER_FILE = "owner.pid"


def scratch_base() -> Path:
    return Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())


def can_write_in(folder: Path) -> bool:
    """A file can be created in ``folder`` and removed again: tried, since permission bits do not say it (root
    passes them on a read-only or pseudo file system such as /proc)."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".gpucolloc-probe-"):
            return True
    except OSError:
        return False


def private_scratch() -> Path:
    """A new 0700 directory with a short path (MPS pipe sockets must fit in 108 bytes), marked with the
    pid of the process that owns it so that a later run can tell a killed run's leftovers."""
    path = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=scratch_base()))
    (path / OWNER_FILE).write_text(str(os.getpid()))
    return path


def _worktrees_in(path: Path) -> list[str]:
    """The git directories that register the worktrees in ``path`` (a killed ``ab``'s arms: ``<path>/<arm>``)."""
    gitdirs = []
    for dot_git in path.glob("*/.git"):
        with contextlib.suppress(OSError):  # a folder: no worktree
            gitdir = Path(dot_git.read_text().removeprefix("gitdir:").strip())  # <repo>/.git/worktrees/<name>
            if gitdir.parent.name == "worktrees":
                gitdirs.append(str(gitdir.parent.parent))
    return gitdirs


def clean_stale_scratch() -> list[str]:
    """Remove the scratch directories of this user's killed runs (their owner is gone), stopping any MPS daemon or
    process still working in them (a killed ``ab``'s arms) and unregistering their git worktrees; what was removed."""
    removed, killed = [], False
    for path in scratch_base().glob(f"{SCRATCH_PREFIX}*"):
        try:
            if not path.is_dir() or path.stat().st_uid != os.getuid():
                continue
            owner = int((path / OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue  # not ours, or not a scratch directory of this plugin
        if not process_marks.gone(owner):
            continue  # its run is still going (a zombie's has ended)
        killed |= bool(process_marks.kill_started_in(path))
        for pid, info in mps_processes().items():
            if info["pipe_dir"] and info["pipe_dir"].startswith(str(path) + "/"):
                with contextlib.suppress(OSError):
                    os.kill(pid, 9)
        repositories = _worktrees_in(path)
        shutil.rmtree(path, ignore_errors=True)
        for git_dir in repositories:  # the worktree's registration, now that its folder is gone
            subprocess.run(["git", "--git-dir", git_dir, "worktree", "prune"], capture_output=True, check=False)
        removed.append(str(path))
    if killed:  # what they owned is left by a killed run now (an ab's arms' own scratch directories)
        removed += clean_stale_scratch()
    return removed
