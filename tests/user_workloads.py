"""Tiny user workloads for the CPU integration tests (the documented user-workload protocol)."""
import os
import signal
import subprocess
import sys
import time

import torch
from torch import nn


class TinyStep:
    def __init__(self, batch_size, device, fail_after=None, failure="raise", step_sleep=0.0, host_sync=False,
                 spawn=None, pid_file=None, expect_cudnn_benchmark=None):
        if expect_cudnn_benchmark is not None and torch.backends.cudnn.benchmark != expect_cudnn_benchmark:
            raise RuntimeError(f"torch.backends.cudnn.benchmark is {torch.backends.cudnn.benchmark} in the user's step")
        self.samples_per_step = batch_size
        self.model = nn.Linear(16, 4).to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.x = torch.randn(batch_size, 16, device=device)
        self.fail_after = fail_after
        self.failure = failure
        self.step_sleep = step_sleep
        self.host_sync = host_sync  # reads the loss on the host every step (cannot be captured as a CUDA graph)
        self.steps = 0
        if spawn:  # a careless workload: starts a long-lived child and never stops it
            child = subprocess.Popen(["sleep", "600"], start_new_session=spawn == "own-session",
                                     close_fds=spawn != "inherit-fds")
            if pid_file:
                with open(pid_file, "a") as out:
                    out.write(f"{child.pid}\n")

    def train_step(self):
        self.steps += 1
        if self.fail_after is not None and self.steps > self.fail_after:
            if self.failure == "raise":
                raise RuntimeError("injected failure in train_step")
            if self.failure == "segfault":
                os.kill(os.getpid(), signal.SIGSEGV)
            if self.failure == "exit":
                os._exit(3)
            if self.failure == "hang":
                while True:
                    time.sleep(1)
            if self.failure == "flood":  # prints one enormous line, then fails
                sys.stdout.write("x" * 50_000_000 + "\n")
                sys.stdout.flush()
                raise RuntimeError("failed after printing 50 MB")
            if self.failure == "channel":  # writes on the worker's message channel, which is not the workload's
                os.write(int(os.environ["GPUCOLLOC_MSG_FD"]), b"progress: 50%\n")
            if self.failure == "device-assert":  # an out-of-bounds index: a fatal fault in the GPU kernel
                self.x[torch.tensor([10**6], device=self.x.device)].sum().item()
        self.optimizer.zero_grad()
        loss = self.model(self.x).sum()
        loss.backward()
        self.optimizer.step()
        if self.host_sync:
            loss.item()
        if self.step_sleep:
            time.sleep(self.step_sleep)


def tiny(batch_size, device, precision="fp32", **options):
    return TinyStep(batch_size, device, **options)


def not_a_workload(batch_size, device, precision="fp32"):
    return object()


def no_samples(batch_size, device, precision="fp32"):
    step = TinyStep(batch_size, device)
    step.samples_per_step = 0
    return step


class OwnLoaderStep(TinyStep):
    """A user workload with its own DataLoader worker processes (forked from the worker)."""

    def __init__(self, batch_size, device, loader_workers=2):
        super().__init__(batch_size, device)
        data = torch.utils.data.TensorDataset(torch.randn(64, 16))
        self.batches = iter(torch.utils.data.DataLoader(
            data, batch_size=batch_size, num_workers=loader_workers, persistent_workers=True,
            sampler=torch.utils.data.RandomSampler(data, replacement=True, num_samples=1 << 40)))

    def train_step(self):
        self.x.copy_(next(self.batches)[0])
        super().train_step()


def own_loader(batch_size, device, precision="fp32", **options):
    return OwnLoaderStep(batch_size, device, **options)


class ForksASessionLeader(TinyStep):
    """A careless workload that forks, without exec, a child that starts its own session and never ends. The
    child's environment as the kernel shows it (/proc/PID/environ) is the one its worker was exec'd with: under
    the fork server, the server's, without the worker's mark."""

    def __init__(self, batch_size, device, pid_file, **options):
        super().__init__(batch_size, device, **options)
        child = os.fork()
        if child == 0:
            try:
                os.setsid()
                while True:
                    time.sleep(1)
            finally:
                os._exit(0)
        with open(pid_file, "a") as out:
            out.write(f"{child}\n")


def forks_a_session_leader(batch_size, device, precision="fp32", **options):
    return ForksASessionLeader(batch_size, device, **options)


def _record(pid_file, pid):
    with open(pid_file, "a") as out:
        out.write(f"{pid}\n")


def _close_every_descriptor():
    os.closerange(0, os.sysconf("SC_OPEN_MAX"))


class Escapes(TinyStep):
    """A workload whose child leaves nothing the kernel shows to tie it to its worker: its own session, no
    descriptor inherited, no variable of the worker's environment. ``how``:
    - ``exec``: forks a child that starts a new session, closes every descriptor and execs ``sleep`` with an empty
      environment;
    - ``popen``: ``subprocess.Popen(["sleep", ...], start_new_session=True, env={})``;
    - ``daemon``: a classic double-forking daemon, without exec (under the fork server its /proc environment is the
      server's), that closes every descriptor.
    ``how`` may be a list of these."""

    def __init__(self, batch_size, device, pid_file, how, **options):
        super().__init__(batch_size, device, **options)
        for kind in [how] if isinstance(how, str) else how:
            _escape(kind, pid_file)


def _escape(how, pid_file):
    if how == "popen":
        _record(pid_file, subprocess.Popen(["sleep", "600"], start_new_session=True, env={}).pid)
        return
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            if how == "daemon" and os.fork() > 0:
                os._exit(0)  # the first child ends: the daemon is an orphan from here on
            _record(pid_file, os.getpid())
            _close_every_descriptor()
            if how == "exec":
                os.execve("/bin/sleep", ["sleep", "600"], {})
            while True:
                time.sleep(1)
        finally:
            os._exit(0)
    if how == "daemon":
        os.waitpid(child, 0)
    deadline = time.monotonic() + 10
    while how == "exec" and time.monotonic() < deadline and not _exec_done(child):
        time.sleep(0.01)


def _exec_done(pid):
    """The child has exec'd ``sleep``: what /proc shows of it is sleep's."""
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().startswith(b"sleep")
    except OSError:
        return True


def escapes(batch_size, device, precision="fp32", **options):
    return Escapes(batch_size, device, **options)
