"""Tiny user workloads for the CPU integration tests (the documented user-workload protocol)."""
import os
import signal
import time

import torch
from torch import nn


class TinyStep:
    def __init__(self, batch_size, device, fail_after=None, failure="raise", step_sleep=0.0, host_sync=False):
        self.samples_per_step = batch_size
        self.model = nn.Linear(16, 4).to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.x = torch.randn(batch_size, 16, device=device)
        self.fail_after = fail_after
        self.failure = failure
        self.step_sleep = step_sleep
        self.host_sync = host_sync  # reads the loss on the host every step (cannot be captured as a CUDA graph)
        self.steps = 0

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
