"""``mps-half``: MPS with every client limited to half the GPU's SMs by default
(``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50``), the middle ground between plain ``mps`` (each client may use every SM)
and ``mps-partitioned`` (1/N each). A workload's own ``sm_percent`` overrides the default; memory is not limited.

Everything the rest of the package knows about this mode is in this module and its line in the registry.
"""
from __future__ import annotations

from .base import Target
from .mps import MpsMode

DEFAULT_SM_PERCENT = 50


class HalfMpsMode(MpsMode):
    name = "mps-half"
    summary = f"MPS with each client limited to {DEFAULT_SM_PERCENT}% of the SMs unless its sm_percent says otherwise"

    def limits(self, workloads, target: Target) -> list[dict]:
        return [{"sm_percent": DEFAULT_SM_PERCENT if w.sm_percent is None else w.sm_percent} for w in workloads]
