"""The interface every sharing mode implements: provision -> per-worker slots -> teardown.

A mode decides *how* processes share the GPU: which workers run together (phases), each worker's
environment (CUDA_VISIBLE_DEVICES, MPS variables), what must be checked once they are up, and what it
must undo afterwards. It never starts workers itself (``pool.py`` does) and never measures.
"""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .. import nvml, protocol
from ..mode_errors import ModeFailed, ModeUnavailable
from ..nvml import GpuInfo
from ..pool import WorkerSlot
from ..workloads import Workload

__all__ = ["ModeFailed", "ModeUnavailable", "ModeConfigError", "WorkerCheckFailed", "SharingMode", "Target"]


class ModeConfigError(ModeFailed, ValueError):
    """The scenario cannot run in this mode as configured; raised before any GPU state is touched."""


class WorkerCheckFailed(RuntimeError):
    """A worker is not running the way the mode promised (e.g. not attached to the MPS daemon)."""


@dataclass(frozen=True)
class ModeOptions:
    """The user's settings for the modes (from the command line or ini)."""

    mps_oversubscribe: bool = False  # mps-partitioned shares may add up to more than 100%
    mig_layout: str | None = None  # --mig-layout or the test's mig_layout marker
    mig_reconfigure: bool = False
    mig_checkpoint_dir: str | None = None


@dataclass
class Target:
    """Where a scenario runs: a GPU (``device='cuda'``) or the CPU smoke mode (``gpu=None``)."""

    device: str
    gpu: GpuInfo | None
    scratch: Path  # a private, short directory for this scenario's files
    options: ModeOptions = field(default_factory=ModeOptions)
    mig_backend: Any = None  # a mig.state.MigBackend to use instead of the GPU's own (the simulator in tests)
    mig_table: Any = None  # the GPU's MIG profile table, once read (mig.profiles.ProfileTable)

    @property
    def cuda_gpu(self) -> GpuInfo:
        """The GPU, for a mode that runs on one only (its ``unavailable_reason`` says so before it gets here)."""
        if self.gpu is None:
            raise ModeUnavailable("this mode needs a GPU (running in CPU smoke mode)")
        return self.gpu

    @property
    def gpu_sm_count(self) -> int | None:
        return self.gpu.extra.get("sm_count") if self.gpu else None


@dataclass
class Provision:
    phases: list[list[WorkerSlot]]  # workers of a phase run together; phases run one after another
    mode_facts: dict[str, Any] = field(default_factory=dict)  # recorded with the result
    one_at_a_time: bool = False  # phases are the workloads run alone (the sequential baseline)

    def check_workers(self, slots: list[WorkerSlot], ready: list[protocol.Ready]) -> None:
        """Called once the workers of a phase are warm, before measuring."""

    def diagnostics(self) -> str:
        """Text attached to the report when the test fails (e.g. a daemon's log tail)."""
        return ""


class SharingMode(ABC):
    """A mode also says what the fixture, the report and the advisor need to know about it. Its errors subclass
    ``ModeUnavailable`` (the test is skipped) or ``ModeFailed`` (the test fails)."""

    name: ClassVar[str]
    summary: ClassVar[str]
    # Its scenario is each job alone, one after another: the fixture builds it from the alone measurements, and
    # the report compares the other modes with it.
    alone: ClassVar[bool] = False
    # A one-job scenario (without per-job limits) is, by construction, a measurement already taken: "alone", or
    # another mode's name. It is reused, not taken again.
    same_with_one_job: ClassVar[str | None] = None
    # It decides itself whether the jobs fit in the device memory (MIG's planner): the fixture does not skip by
    # what the jobs used alone.
    plans_memory_itself: ClassVar[bool] = False
    # Its colour in every figure (a matplotlib colour), set on its own class (a subclass does not inherit it);
    # None: one is derived from the registry order.
    colour: ClassVar[str | None] = None

    def unavailable_reason(self, target: Target) -> str | None:
        """Why this mode cannot run on ``target`` (the test is skipped), or None."""
        return None

    def validate(self, workloads: list[Workload], target: Target) -> None:  # noqa: B027 (optional; most modes need none)
        """Raise ModeConfigError for a configuration that cannot work; touches nothing."""

    @abstractmethod
    def provision(self, workloads: list[Workload], target: Target) -> contextlib.AbstractContextManager[Provision]:
        """Set the mode up for these workloads; undo everything on exit, whatever happened."""


def isolated_from_mps(target: Target) -> dict[str, str]:
    """Environment of a worker that must not attach to any MPS daemon: CUDA looks for a daemon only in
    CUDA_MPS_PIPE_DIRECTORY, so point it at an empty private directory (never the default /tmp/nvidia-mps)."""
    empty = target.scratch / "no-mps"
    empty.mkdir(mode=0o700, exist_ok=True)
    return {"CUDA_MPS_PIPE_DIRECTORY": str(empty), "CUDA_MPS_LOG_DIRECTORY": str(empty),
            "CUDA_VISIBLE_DEVICES": target.gpu.uuid if target.gpu else ""}


def check_not_mps_clients(target: Target, ready: list[protocol.Ready]) -> None:
    if target.gpu is None:
        return
    processes = nvml.gpu_processes(target.gpu.uuid)
    attached = [r.pid for r in ready if processes.get(r.pid, {}).get("mps")]
    if attached:
        raise WorkerCheckFailed(f"workers {attached} attached to an MPS server although the mode forbids it")


@contextlib.contextmanager
def no_setup(phases: list[list[WorkerSlot]], target: Target, one_at_a_time: bool = False) -> Iterator[Provision]:
    class _Isolated(Provision):
        def check_workers(self, slots, ready):
            check_not_mps_clients(target, ready)

    yield _Isolated(phases, one_at_a_time=one_at_a_time)
