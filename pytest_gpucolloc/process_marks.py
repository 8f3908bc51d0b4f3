"""Every process a worker starts carries a mark that the kernel shows, so that none escapes: not a child that
starts its own session, nor one orphaned when pytest itself was SIGKILLed (docs/reliability.md).

The mark (``new_mark``) names the worker and its pytest process (pid and start time: a reused pid is not its
owner). A worker carries it twice, as neither way reaches every process: an open memfd named after it, which every
fork inherits, and a variable in the environment, which what is exec'd inherits. ``kill_marked`` ends a worker's
processes when it stops; ``kill_orphans`` ends, at the next run, those whose owner is gone. A process with neither
is reached through the fork server, a child subreaper (``become_subreaper``, ``end_children``).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Collection
from pathlib import Path

MARK_ENV = "GPUCOLLOC_WORKER_MARK"
_MEMFD = "/memfd:gpucolloc-mark:"  # what /proc/PID/fd/N links to: the memfd's name, then " (deleted)"
KILL_WAIT_S = 10.0  # SIGKILL is asynchronous: a process is gone only once the kernel has torn it down


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, parent, group, session, ...); None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def pids() -> list[int]:
    """Every process's pid (any user's)."""
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _start_time(pid: int) -> str | None:
    fields = stat_fields(pid)
    return fields[19] if fields else None


def gone(pid: int) -> bool:
    """No such process, or only its zombie (dead, its exit status not yet collected by its parent)."""
    fields = stat_fields(pid)
    return fields is None or fields[0] == "Z"


def new_mark(label: str) -> str:
    """``<owner pid>.<owner start time>.<label>``: unique to one worker of one pytest process."""
    return f"{os.getpid()}.{_start_time(os.getpid())}.{label}"


def mark_descriptor(mark: str) -> int:
    """A new descriptor that carries ``mark``, for a worker to keep open (its forks inherit it). Close-on-exec
    here: nothing else the controller starts may carry it."""
    return os.memfd_create(_MEMFD.removeprefix("/memfd:") + mark)


def _mark_of(pid: int) -> str | None:
    """The mark ``pid`` carries, by descriptor or environment; None if none (or it is gone, or another user's)."""
    with contextlib.suppress(OSError):
        with os.scandir(f"/proc/{pid}/fd") as descriptors:
            for fd in descriptors:
                try:
                    link = os.readlink(fd.path)
                except OSError:
                    continue  # closed meanwhile
                if link.startswith(_MEMFD):
                    return link[len(_MEMFD):].removesuffix(" (deleted)")
        needle = MARK_ENV.encode() + b"="
        for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if item.startswith(needle):
                return item[len(needle):].decode(errors="replace")
    return None


def _marks() -> dict[int, str]:
    """pid -> mark, for every process of this user that carries one."""
    return {pid: mark for pid in pids() if (mark := _mark_of(pid)) is not None}


def _kill(pids: list[int]) -> list[int]:
    """SIGKILL ``pids`` and wait until they are gone: whoever returns from here sees none of them running."""
    killed = []
    for pid in pids:
        if pid == os.getpid():
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    deadline = time.monotonic() + KILL_WAIT_S
    while not all(gone(pid) for pid in killed) and time.monotonic() < deadline:
        time.sleep(0.005)
    return killed


def _where(field: int, values: Collection[int]) -> set[int]:
    """The processes whose /proc/PID/stat field ``field`` (1: parent, 2: process group) is one of ``values``."""
    return {pid for pid in pids() if (fields := stat_fields(pid)) and int(fields[field]) in values}


def kill_marked(marks: set[str], groups: Collection[int] = frozenset()) -> list[int]:
    """SIGKILL every process carrying one of ``marks`` or in one of the process ``groups`` (a worker's, which
    its children join unless they leave it), and wait until they are gone; returns their pids."""
    found = {pid for pid, mark in _marks().items() if mark in marks} | (_where(2, groups) if groups else set())
    return _kill(sorted(found))


def _owner_alive(mark: str) -> bool:
    owner, _, rest = mark.partition(".")
    start = rest.partition(".")[0]
    return owner.isdigit() and _start_time(int(owner)) == start


def kill_orphans() -> list[int]:
    """SIGKILL the marked processes whose pytest process is gone (a run killed outright); returns their pids."""
    return _kill([pid for pid, mark in _marks().items() if not _owner_alive(mark)])


def kill_started_in(folder: Path) -> list[int]:
    """SIGKILL this user's processes that work in ``folder`` or name it in their environment (a killed ``ab``'s
    arms: their worktree, their socket), and wait until they are gone; returns their pids."""
    needle = str(folder).encode() + b"/"
    found = []
    for pid in pids():
        with contextlib.suppress(OSError):  # gone meanwhile, or another user's
            if needle in Path(f"/proc/{pid}/environ").read_bytes() \
                    or Path(os.readlink(f"/proc/{pid}/cwd")).is_relative_to(folder):
                found.append(pid)
    return _kill(found)


def become_subreaper() -> bool:
    """Make this process a child subreaper: an orphan among its descendants, whatever its session, becomes its
    child instead of init's. False where the kernel refuses (before Linux 3.4)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def end_children(timeout_s: float = KILL_WAIT_S) -> list[int]:
    """SIGKILL every child of this process and reap it, until none is left: a subreaper's killed child hands it
    its own children, which are killed in turn. Returns the pids killed (waits at most ``timeout_s``)."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid in _where(1, {os.getpid()}):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            break  # none left, not even a zombie
        time.sleep(0.005)
    return sorted(set(killed))
