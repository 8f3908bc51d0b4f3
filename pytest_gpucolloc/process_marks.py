"""Every process a worker starts carries a mark in its environment, so that none escapes: not a child that starts
its own session (out of the worker's process group), nor one orphaned when pytest itself was SIGKILLed.

The mark names the worker and the pytest process that owns it (pid and start time, so that a reused pid is
not mistaken for its owner). ``kill_marked`` ends workers' processes when they stop; ``kill_orphans``
ends, at the start of the next run, those whose owner is gone. A process that clears its own environment is
not found this way.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

MARK_ENV = "GPUCOLLOC_WORKER_MARK"


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def new_mark(label: str) -> str:
    """``<owner pid>.<owner start time>.<label>``: unique to one worker of one pytest process."""
    return f"{os.getpid()}.{_start_time(os.getpid())}.{label}"


def _marks() -> dict[int, str]:
    """pid -> mark, for every process of this user that carries one."""
    found = {}
    needle = MARK_ENV.encode() + b"="
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone, or another user's
        for item in raw.split(b"\0"):
            if item.startswith(needle):
                found[int(entry.name)] = item[len(needle):].decode(errors="replace")
                break
    return found


def _kill(pids: list[int]) -> list[int]:
    killed = []
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return killed


def kill_marked(marks: set[str]) -> list[int]:
    """SIGKILL every process carrying one of ``marks`` (one look through /proc for all); returns their pids."""
    return _kill([pid for pid, found in _marks().items() if found in marks])


def _owner_alive(mark: str) -> bool:
    owner, _, rest = mark.partition(".")
    start = rest.partition(".")[0]
    return owner.isdigit() and _start_time(int(owner)) == start


def kill_orphans() -> list[int]:
    """SIGKILL the marked processes whose pytest process is gone (a run killed outright); returns their pids."""
    return _kill([pid for pid, mark in _marks().items() if not _owner_alive(mark)])
