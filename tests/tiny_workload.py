"""The smallest user workload, as source: pytester tests write it beside their scenarios as ``tiny_workload.py``
(``Workload("tiny_workload:factory", ...)``), so that the workers import it from the test's own folder. Each step
sleeps a millisecond: a worker trains from its start to its stop, and spinning it would take a core from the
suite's other tests (they run side by side) for no check of these tests."""

SOURCE = '''
import time

import torch


class Step:
    def __init__(self, batch_size, device):
        self.samples_per_step = batch_size
        self.model = torch.nn.Linear(8, 2)
        self.x = torch.randn(batch_size, 8)

    def train_step(self):
        self.model(self.x).sum().backward()
        time.sleep(0.001)


def factory(batch_size, device, precision="fp32"):
    return Step(batch_size, device)
'''
