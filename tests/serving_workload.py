"""A user's own serving step, as source: tests write it beside their scenarios as ``serve_workload.py``
(``Workload("serve_workload:factory", rate=...)``), so that the workers import it from the test's own folder.
``source(ms)``: each request is a small forward pass and ``ms`` milliseconds of work."""


def source(ms: float = 2) -> str:
    return f'''
import time
import torch


class Service:
    def __init__(self, batch_size):
        self.samples_per_step = batch_size
        self.model = torch.nn.Linear(8, 2)
        self.x = torch.randn(batch_size, 8)

    def serve_step(self):
        with torch.inference_mode():
            self.model(self.x)
        time.sleep({ms} / 1000)


def factory(batch_size, device, precision="fp32"):
    return Service(batch_size)
'''


SOURCE = source()
