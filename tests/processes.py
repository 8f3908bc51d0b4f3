"""Finding this plugin's worker processes from outside, for the tests that check nothing outlives a scenario.

Every worker is a fork server's child: a fresh one runs ``python -m pytest_gpucolloc.worker`` (exec'd by a server
that imports nothing); a forked one (the default) keeps its server's command line,
``python -m pytest_gpucolloc.forkserver``; a worker's own processes (a
DataLoader's) keep their worker's command line. The server itself lives for the whole pytest session and is not a
worker.
"""
from __future__ import annotations

from pathlib import Path

WORKER = b"pytest_gpucolloc.worker"
SERVER = b"pytest_gpucolloc.forkserver"


def _processes() -> dict[int, tuple[int, bytes]]:
    """pid -> (parent pid, command line) of every process that can be read."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                found[int(entry.name)] = (parent, (entry / "cmdline").read_bytes())
            except (OSError, ValueError, IndexError):
                pass
    return found


def worker_processes(parent: int | None = None) -> list[int]:
    """Workers and their own processes, sorted by pid; with ``parent``, only the workers that process started
    (its fresh children, and the children of its fork server)."""
    table = _processes()
    servers = {pid for pid, (up, cmdline) in table.items()
               if SERVER in cmdline and SERVER not in table.get(up, (0, b""))[1]}  # a server's parent is no server
    workers = []
    for pid, (up, cmdline) in table.items():
        if pid in servers or not (WORKER in cmdline or SERVER in cmdline):
            continue
        if parent is None or up == parent or (up in servers and table[up][0] == parent):
            workers.append(pid)
    return sorted(workers)


def left_behind(workers: list[int]) -> list[int]:
    """What still runs of ``workers`` (pids of a scenario's workers, from their Ready messages): the workers, and
    every process in their process groups or sessions (a forked or fresh worker leads its own), such as its
    DataLoader's processes, wherever they were reparented. Zombies have ended and are not counted."""
    leaders = set(workers)
    left = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                state, _, group, session = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:4]
            except (OSError, ValueError):
                continue
            if state != "Z" and leaders & {int(entry.name), int(group), int(session)}:
                left.append(int(entry.name))
    return sorted(left)


def environment_has(pid: int, entry: str) -> bool:
    """Whether the process started with ``entry`` (``NAME=value``) in its environment."""
    try:
        return entry.encode() in (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return False


def plugin_processes(parent: int | None = None) -> list[int]:
    """Every worker and fork server on the machine: after a pytest run has ended, none of its may be left. With
    ``parent``, only those it started (its fork server and fresh workers) and their children (forked workers):
    another pytest session on the machine may be running its own meanwhile."""
    table = _processes()
    return sorted(pid for pid, (up, cmdline) in table.items() if (WORKER in cmdline or SERVER in cmdline)
                  and (parent is None or parent in (up, table.get(up, (0, b""))[0])))


def fork_servers(parent: int) -> list[int]:
    """The fork servers ``parent`` (a pytest process) started."""
    return sorted(pid for pid, (up, cmdline) in _processes().items() if up == parent and SERVER in cmdline)
