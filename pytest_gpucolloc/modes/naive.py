"""``naive``: all workloads start together as separate processes; the driver time-slices them."""
from __future__ import annotations

from ..pool import WorkerSlot
from .base import SharingMode, Target, isolated_from_mps, no_setup


class NaiveMode(SharingMode):
    name = "naive"
    summary = "all workloads at once as separate processes (driver time-slicing)"
    same_with_one_job = "alone"  # one job time-sliced with nobody is the job alone
    colour = "tab:blue"

    def provision(self, workloads, target: Target):
        env = isolated_from_mps(target)
        return no_setup([[WorkerSlot(w, dict(env)) for w in workloads]], target)
