"""``mig``: each workload in its own MIG instance (A100/H100/H200).

The layout comes from the workloads' ``mig`` profiles, else the ``mig_layout`` marker / ``--mig-layout``,
else the paper's default for N identical jobs (1 -> 7g, 2 -> 3g, 3 -> 2g, up to 7 -> 1g). Planning is
pure (``mig.planner``); the GPU is changed only with ``--mig-reconfigure``, and restored afterwards.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from .. import protocol
from ..mig import planner
from ..mig.nvml_backend import NvmlMigBackend
from ..mig.profiles import ProfileTable, live_table
from ..mig.provision import MigProvisioner
from ..pool import WorkerSlot
from .base import ModeConfigError, Provision, SharingMode, Target, WorkerCheckFailed, isolated_from_mps

DEFAULT_CHECKPOINT_DIR = Path.home() / ".cache" / "pytest-gpucolloc"


class _MigProvision(Provision):
    def check_workers(self, slots: list[WorkerSlot], ready: list[protocol.Ready]) -> None:
        for slot, report in zip(slots, ready):
            seen, expected = report.sm_count, slot.mode_facts.get("sm_count")
            if seen is not None and expected and seen != expected:
                raise WorkerCheckFailed(f"worker pid {report.pid} sees {seen} SMs, but its MIG instance "
                                        f"{slot.mode_facts['profile']} has {expected}: it is not running in that "
                                        "instance")


class MigMode(SharingMode):
    name = "mig"
    summary = "each workload in its own MIG instance (planned placements; reconfigures only when allowed)"
    plans_memory_itself = True  # the planner places each job in an instance of its own memory
    colour = "tab:orange"

    def unavailable_reason(self, target: Target) -> str | None:
        if target.gpu is None:
            return "MIG needs an NVIDIA A100, H100 or H200-class GPU (running in CPU smoke mode)"
        if target.gpu.mig_mode is None and target.mig_backend is None:
            return f"GPU {target.gpu.index} ({target.gpu.name}) does not support MIG"
        return None

    def table(self, target: Target) -> ProfileTable:
        if target.mig_table is None:
            target.mig_table = live_table(target.cuda_gpu.uuid, target.cuda_gpu.name)
        return target.mig_table

    def layout(self, workloads, target: Target) -> list[str]:
        given = [w.mig for w in workloads]
        if all(given):
            return given
        if any(given):
            raise ModeConfigError("give every workload a MIG profile, or none (then a layout or the default applies)")
        text = target.options.mig_layout
        try:
            layout = planner.parse_layout(text) if text else planner.default_layout(len(workloads))
        except planner.LayoutError as error:
            raise ModeConfigError(str(error)) from None
        if len(layout) != len(workloads):
            raise ModeConfigError(f"MIG layout {text!r} has {len(layout)} instances for {len(workloads)} workloads")
        return layout

    def validate(self, workloads, target: Target) -> None:
        self.layout(workloads, target)

    @contextlib.contextmanager
    def provision(self, workloads, target: Target) -> Iterator[Provision]:
        plan = planner.plan(self.table(target), self.layout(workloads, target))
        backend = target.mig_backend or NvmlMigBackend(target.cuda_gpu.uuid)
        provisioner = MigProvisioner(
            backend, self.table(target), target.cuda_gpu.uuid, target.cuda_gpu.index,
            allow_reconfigure=target.options.mig_reconfigure,
            checkpoint_dir=Path(target.options.mig_checkpoint_dir or DEFAULT_CHECKPOINT_DIR))
        with provisioner.provision(plan) as instances:
            slots = [WorkerSlot(workload, {**isolated_from_mps(target), "CUDA_VISIBLE_DEVICES": instance.uuid},
                                mode_facts=instance.to_dict()) for workload, instance in zip(workloads, instances)]
            yield _MigProvision([slots], {"mig_layout": [i.to_dict() for i in instances]})
