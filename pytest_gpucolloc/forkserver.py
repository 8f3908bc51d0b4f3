"""A fork server for workers (``--colloc-spawn=forkserver``): one process per pytest session imports torch, the
worker's code and (for the first job that uses it) torchvision once, never touches CUDA, and forks each worker on
request, which spares each worker those imports (about 3 s for torch and 2 s for torchvision on an H200 host); each
is still a process of its own, with its own environment, session, log and CUDA context. Under
``--colloc-spawn=fresh`` a server that imports nothing execs each worker as ``python -m pytest_gpucolloc.worker``.

The server is a child subreaper (``process_marks.become_subreaper``): whatever a workload leaves orphaned (a
double-forking daemon) becomes its child, and it kills and reaps every child once no worker is left and before it
exits. It exits when the controller does, even a SIGKILLed one (its parent-death signal is SIGTERM; the closed socket
tells it too).

Controller and server talk over a SOCK_SEQPACKET socket pair: a request ``{"env", "cwd", "vision"}`` comes with four
descriptors (the worker's stdin, log, message channel and mark: ``process_marks.py``); the server answers
``{"pid": N}``, and ``{"exited": N, "status": S}`` (a ``waitpid`` status) once it has reaped the worker. The server is
single-threaded: a thread in a process that forks could hold a lock its children would then wait on for ever.
"""
from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import math
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback

from . import process_marks, worker
from .environment import base_environment
from .logs import tail
from .protocol import MSG_FD_ENV
from .scratch import private_scratch

SOCKET_ENV = "GPUCOLLOC_FORKSERVER_FD"
EXEC_ENV = "GPUCOLLOC_FORKSERVER_EXEC"  # "1": exec each worker (--colloc-spawn=fresh), importing nothing first
VISION_ENV = "GPUCOLLOC_FORKSERVER_VISION"  # "1": import VISION at start, before any worker is asked for
# What every worker imports anyway; none of it initialises CUDA.
PRELOAD = ("torch", "pytest_gpucolloc.models", "pytest_gpucolloc.worker")
# What an image workload imports too (a named ResNet, a data loader; on a GPU any job: a user's model usually does),
# loaded before the first fork that asks for it: a session of small jobs on the CPU does without (about 2 s each).
VISION = ("torchvision.models", "torchvision.transforms.v2", "PIL.Image", "pytest_gpucolloc.image_data")
MAX_MESSAGE = 1 << 20
START_TIMEOUT_S = 120.0
CLOSE_TIMEOUT_S = 30.0  # the server kills its remaining workers and waits for them; then it is killed itself


class ForkServerError(RuntimeError):
    pass


class ForkedProcess:
    """A worker forked by the server, with the part of ``subprocess.Popen``'s interface the pool uses."""

    def __init__(self, server: ForkServer, pid: int, stdin):
        self.server, self.pid, self.stdin = server, pid, stdin
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            status = self.server.status(self.pid)
            if status is not None:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        return code


class ForkServer:
    """Controller side: starts the server, asks it for workers, learns how they ended."""

    def __init__(self, env: dict[str, str], exec_workers: bool = False, vision: bool = False):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # in a scratch directory of this process: removed on close, or by the next run if this one is killed
        self.scratch = private_scratch()
        self.log_path = self.scratch / "forkserver.log"
        env = {**env, SOCKET_ENV: str(theirs.fileno()), EXEC_ENV: "1" if exec_workers else "0",
               VISION_ENV: "1" if vision else "0", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "pytest_gpucolloc.forkserver"], env=env,
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            pass_fds=(theirs.fileno(),), start_new_session=True)
        theirs.close()
        self.sock = ours
        self.exits: dict[int, int] = {}
        try:
            self._expect("ready", START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    def _receive(self, timeout: float) -> dict | None:
        if self.sock.fileno() < 0:  # closed: asked about a worker after the session's end (atexit order)
            raise ForkServerError("the worker fork server was closed")
        if not select.select([self.sock], [], [], timeout)[0]:
            return None
        data = self.sock.recv(MAX_MESSAGE)
        if not data:
            raise ForkServerError("the worker fork server exited; its output ends:\n" + tail(self.log_path))
        message = json.loads(data)
        if "exited" in message:
            self.exits[message["exited"]] = message["status"]
        return message

    def _expect(self, key: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            message = self._receive(remaining)
            if message is not None and key in message:
                return message
        raise ForkServerError(f"the worker fork server did not answer within {timeout:.0f} s; its output ends:\n"
                              + tail(self.log_path))

    def spawn(self, env: dict[str, str], log_fd: int, channel_fd: int, mark_fd: int,
              vision: bool = True) -> ForkedProcess:
        """A new worker with ``env``, ``log_fd`` as its stdout and stderr, ``channel_fd`` as its message
        channel and ``mark_fd`` kept open (the caller keeps and closes its copies); like ``Popen(stdin=PIPE)``,
        its ``stdin`` is a pipe. ``vision``: the server imports ``VISION`` first (once), for the worker to inherit."""
        stdin_read, stdin_write = os.pipe()
        try:
            request = {"env": env, "cwd": os.getcwd(), "vision": vision}
            socket.send_fds(self.sock, [json.dumps(request).encode()], [stdin_read, log_fd, channel_fd, mark_fd])
            pid = self._expect("pid", 30.0)["pid"]
        except BaseException:
            os.close(stdin_write)
            raise
        finally:
            os.close(stdin_read)
        return ForkedProcess(self, pid, os.fdopen(stdin_write, "wb"))

    def status(self, pid: int) -> int | None:
        """The ``waitpid`` status of a worker that has ended, else None."""
        with contextlib.suppress(ForkServerError, OSError):  # the server gone: its workers died with it
            while pid not in self.exits and self._receive(0) is not None:
                pass
        if pid in self.exits:
            return self.exits[pid]
        if self.process.poll() is not None and process_marks.gone(pid):
            return signal.SIGKILL  # killed with the server (PR_SET_PDEATHSIG)
        return None

    def close(self) -> None:
        """Stop the server (it kills any worker still running) and remove its log."""
        self.sock.close()
        try:
            self.process.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        shutil.rmtree(self.scratch, ignore_errors=True)


_SHARED: dict[bool, ForkServer] = {}  # exec_workers -> the session's server of that kind


def shared(exec_workers: bool = False, vision: bool = False) -> ForkServer:
    """The session's fork server (``exec_workers``: for fresh workers), started on first use (again if it died);
    ``vision``: it imports VISION as it starts, not at its first fork (an A/B's two arms start their servers at once,
    before either is told to start its workers, so neither waits for those imports then)."""
    server = _SHARED.get(exec_workers)
    if server is None or server.process.poll() is not None:
        if server is not None:
            server.close()
        atexit.unregister(close_shared)  # once, however often the servers were closed and started again
        atexit.register(close_shared)
        _SHARED[exec_workers] = server = ForkServer(base_environment(), exec_workers, vision and not exec_workers)
    return server


def close_shared() -> None:
    while _SHARED:
        _SHARED.popitem()[1].close()


# --- server side ---------------------------------------------------------------------------------------------

def _take_environment(env: dict, cwd: str) -> None:
    """What a fresh ``python -m`` started by the controller now would have: its environment (set before anything
    reads it: CUDA does when it initialises), its working directory, an import path led by it and PYTHONPATH."""
    old_paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    first = [cwd] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = first + [p for p in sys.path[1:] if p not in first and p not in old_paths]
    importlib.invalidate_caches()


def _become_worker(server_pid: int, sock: socket.socket, request: dict, fds: list[int], exec_worker: bool) -> None:
    """In the forked child: take the worker's descriptors and environment, and run it. Never returns."""
    code = 1
    try:
        sock.close()
        os.setsid()  # its own session and process group, as a fresh worker has
        stdin, log, channel, mark = fds
        os.set_inheritable(mark, True)  # kept open: every process the worker starts inherits it
        os.dup2(stdin, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(stdin)
        os.close(log)
        _take_environment(request["env"], request["cwd"])
        os.environ[MSG_FD_ENV] = str(channel)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        worker._die_with_parent()  # kept across exec
        if os.getppid() != server_pid:  # the server died before the line above: so must this worker
            os._exit(1)
        if exec_worker:
            os.set_inheritable(channel, True)
            os.execve(sys.executable, [sys.executable, "-m", "pytest_gpucolloc.worker"], os.environ)
        code = worker.main()
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(sock: socket.socket, exec_workers: bool = False) -> None:
    children: set[int] = set()  # the workers asked for; other children are orphans adopted as subreaper
    try:
        while True:
            if select.select([sock], [], [], 0.05)[0]:
                data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 4)
                if not data:
                    return  # the controller has gone
                request = json.loads(data)
                if request.get("vision") and not exec_workers:
                    for name in VISION:  # imported once: later ones are found in sys.modules
                        importlib.import_module(name)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _become_worker(os.getppid(), sock, request, fds, exec_workers)
                for fd in fds:
                    os.close(fd)
                children.add(pid)
                sock.send(json.dumps({"pid": pid}).encode())
            exited = _reap(children)
            if exited and not children:  # no worker left: neither may what the workers left (said before they end)
                process_marks.end_children()
            for pid, status in exited:
                sock.send(json.dumps({"exited": pid, "status": status}).encode())
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for pid in children:  # the controller is gone: nothing it started may stay
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:  # forked a moment ago, before its own process group
                os.kill(pid, signal.SIGKILL)
        # nor outlive the server: a GPU process can take seconds to tear down its context, and the controller waits
        # for the server (up to CLOSE_TIMEOUT_S)
        process_marks.end_children(CLOSE_TIMEOUT_S - 5)


def _reap(workers: set[int]) -> list[tuple[int, int]]:
    """Collect every child that has ended: the workers among them (removed from ``workers``) with their statuses;
    an adopted orphan is only reaped."""
    exited = []
    with contextlib.suppress(ChildProcessError):  # no child at all
        while (ended := os.waitpid(-1, os.WNOHANG))[0]:
            if ended[0] in workers:
                workers.discard(ended[0])
                exited.append(ended)
    return exited


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(0)  # through serve's cleanup: its workers and everything they left are ended first


def main() -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    worker._die_with_parent(signal.SIGTERM)
    process_marks.become_subreaper()
    sock = socket.socket(fileno=int(os.environ.pop(SOCKET_ENV)))
    exec_workers = os.environ.pop(EXEC_ENV, "0") == "1"
    vision = os.environ.pop(VISION_ENV, "0") == "1"
    for name in () if exec_workers else PRELOAD + (VISION if vision else ()):
        importlib.import_module(name)
    sock.send(json.dumps({"ready": True}).encode())
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        serve(sock, exec_workers)
    return 0


if __name__ == "__main__":
    code = main()  # its workers are ended and reaped by now
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown with torch loaded: the controller waits for it (half a second)
