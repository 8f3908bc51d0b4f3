"""``sequential``: each workload alone on the GPU, one after another: the no-collocation baseline."""
from __future__ import annotations

from ..pool import WorkerSlot
from .base import SharingMode, Target, isolated_from_mps, no_setup


class SequentialMode(SharingMode):
    name = "sequential"
    summary = "one workload at a time, alone on the GPU (the baseline)"
    alone = True
    colour = "tab:grey"

    def provision(self, workloads, target: Target):
        env = isolated_from_mps(target)
        # Identical jobs alone are the same measurement: run each distinct one once.
        distinct = list(dict.fromkeys(w.key() for w in workloads))
        first = {w.key(): w for w in reversed(workloads)}
        phases = [[WorkerSlot(first[key], dict(env))] for key in distinct]
        return no_setup(phases, target, one_at_a_time=True)
