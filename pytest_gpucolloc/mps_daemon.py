"""Lifecycle of a private MPS control daemon: start, configure, inspect, stop.

The daemon gets its own pipe and log directories, so it can never be confused with a system daemon
at the default /tmp/nvidia-mps, and clients reach it only through ``client_env()``.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from . import process_marks
from .logs import tail
from .mode_errors import ModeFailed

CONTROL = "nvidia-cuda-mps-control"
MAX_CLIENTS = 48  # per GPU on Volta and newer; the 49th client fails at context creation
# sun_path holds 108 bytes including the NUL; the daemon adds file names below the pipe directory.
SOCKET_PATH_LIMIT = 107
SOCKET_NAME_RESERVE = len("/control_privileged")


class MpsError(ModeFailed):
    """The MPS daemon could not be set up, used or stopped (the test fails)."""


def control_binary() -> str | None:
    return shutil.which(CONTROL)


def check_pipe_directory(pipe_dir: Path) -> None:
    longest = len(str(pipe_dir)) + SOCKET_NAME_RESERVE
    if longest > SOCKET_PATH_LIMIT:
        raise MpsError(f"MPS pipe directory {str(pipe_dir)!r} is too long for a Unix socket path "
                       f"({longest} > {SOCKET_PATH_LIMIT} bytes); use a shorter base directory")


def _proc_name(pid: int) -> str:
    """The program's name from its command line (``comm`` is cut at 15 characters, which makes the
    MPS control daemon and server look alike)."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return ""
    return Path(argv0.decode(errors="replace")).name


def _proc_env(pid: int) -> dict[str, str] | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None  # another user's process
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def mps_processes() -> dict[int, dict]:
    """Every MPS control daemon and server on this machine: pid -> {name, pipe_dir (None if unreadable)}.
    A server inherits no pipe directory in its environment: it belongs to the control daemon that started it."""
    found = {}
    for pid in process_marks.pids():
        name = _proc_name(pid)
        if name.startswith("nvidia-cuda-mps"):
            env = _proc_env(pid)
            pipe = None if env is None else env.get("CUDA_MPS_PIPE_DIRECTORY")
            fields = process_marks.stat_fields(pid)
            found[pid] = {"name": name, "pipe_dir": pipe, "parent": int(fields[1]) if fields else None}
    for info in found.values():
        if info["pipe_dir"] is None and info["parent"] in found:
            info["pipe_dir"] = found[info["parent"]]["pipe_dir"]
    for info in found.values():
        if info["pipe_dir"] is None and info["name"] == "nvidia-cuda-mps-control":
            info["pipe_dir"] = "/tmp/nvidia-mps"  # the default a daemon uses without the variable
    return found


class MpsDaemon:
    """A private MPS control daemon bound to one GPU. Use as a context manager or call stop()."""

    def __init__(self, root: Path, gpu_uuid: str | None):
        self.root, self.gpu_uuid, self.running = Path(root), gpu_uuid, False
        self.pipe_dir, self.log_dir = self.root / "pipe", self.root / "log"
        check_pipe_directory(self.pipe_dir)

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
        env.update(self.client_env())
        return env

    def client_env(self) -> dict[str, str]:
        env = {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}
        if self.gpu_uuid:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu_uuid
        return env

    def start(self) -> MpsDaemon:
        binary = control_binary()
        if binary is None:
            raise MpsError(f"{CONTROL} is not on PATH (it ships with the NVIDIA driver's CUDA utilities)")
        for directory in (self.root, self.pipe_dir, self.log_dir):
            directory.mkdir(mode=0o700, exist_ok=True)
            if directory.stat().st_uid != os.getuid():
                raise MpsError(f"{directory} belongs to another user; refusing to use it")
        started = subprocess.run([binary, "-d"], env=self._env(), capture_output=True, text=True, timeout=30)
        if started.returncode != 0:
            said = started.stderr.strip() or started.stdout.strip()
            raise MpsError(f"{CONTROL} -d failed ({started.returncode}): {said}\n{self.log_tail()}")
        self.running = True
        return self

    def set_default(self, command: str, value: str) -> None:
        """Defaults apply to servers started later (the server starts at the first client)."""
        self.control(f"{command} {value}")

    def control(self, command: str, timeout: float = 15.0) -> str:
        """Send one command to the daemon and return its answer."""
        if not self.running:
            raise MpsError("the MPS daemon is not running")
        done = subprocess.run([control_binary() or CONTROL], input=command + "\n", env=self._env(),
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise MpsError(f"MPS control command {command!r} failed: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout.strip()

    def daemon_pids(self) -> list[int]:
        """PIDs of this daemon's control and server processes (found by their pipe directory)."""
        return sorted(pid for pid, info in mps_processes().items() if info["pipe_dir"] == str(self.pipe_dir))

    def servers(self) -> list[int]:
        return [int(x) for x in self.control("get_server_list").split() if x.isdigit()]

    def clients(self) -> list[int]:
        return [int(x) for server in self.servers()
                for x in self.control(f"get_client_list {server}").split() if x.isdigit()]

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(f"--- MPS {name} ({path}) ---\n" + tail(path, lines) for name in ("control.log", "server.log")
                         if (path := self.log_dir / name).exists())

    def stop(self, timeout: float = 10.0) -> None:
        """Quit the daemon (forcing after ``timeout``), kill what is left of it, remove its directories."""
        pids = self.daemon_pids()
        if self.running:
            self.running = False
            for command in ("quit", "quit -t 2"):
                try:
                    subprocess.run([control_binary() or CONTROL], input=command + "\n", env=self._env(),
                                   capture_output=True, text=True, timeout=timeout)
                except (OSError, subprocess.TimeoutExpired):
                    continue
                if _wait_gone(pids, timeout):
                    break
        for pid in self.daemon_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _wait_gone(pids, 5.0)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> MpsDaemon:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _wait_gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ChildProcessError):  # reap it if it is our child (the launcher can leave a zombie)
                os.waitpid(pid, os.WNOHANG)
        if all(process_marks.gone(pid) or not _proc_name(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False
