"""The smallest user workload, as source: pytester tests write it beside their scenarios as ``tiny_workload.py``
(``Workload("tiny_workload:factory", ...)``), so that the workers import it from the test's own folder."""

SOURCE = '''
import torch


class Step:
    def __init__(self, batch_size, device):
        self.samples_per_step = batch_size
        self.model = torch.nn.Linear(8, 2)
        self.x = torch.randn(batch_size, 8)

    def train_step(self):
        self.model(self.x).sum().backward()


def factory(batch_size, device, precision="fp32"):
    return Step(batch_size, device)
'''
