"""``mps`` and ``mps-partitioned``: all workloads as clients of a private MPS daemon started per test.

``mps-partitioned`` adds per-client limits (active-thread percentage, pinned device memory), by
default equal shares, as the Kubernetes NVIDIA device plugin configures MPS for N replicas.
"""
from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from pathlib import Path

from .. import interleave, nvml, protocol
from .. import mps_daemon as mps
from ..pool import WorkerSlot
from ..scratch import OWNER_FILE
from .base import ModeConfigError, Provision, SharingMode, Target, WorkerCheckFailed


class _DaemonProvision(Provision):
    def __init__(self, phases, mode_facts, daemon: mps.MpsDaemon, gpu_sm_count: int | None):
        super().__init__(phases, mode_facts)
        self.daemon, self.gpu_sm_count = daemon, gpu_sm_count

    def check_workers(self, slots: list[WorkerSlot], ready: list[protocol.Ready]) -> None:
        # A client that cannot reach the daemon silently runs without MPS: prove each one is ours.
        clients = set(self.daemon.clients())
        strays = [r.pid for r in ready if r.pid not in clients]
        if strays:
            raise WorkerCheckFailed(f"workers {strays} are not clients of this test's MPS daemon (its clients: "
                                    f"{sorted(clients)}); they would have run without MPS")
        for slot, report in zip(slots, ready):
            limit, seen = slot.mode_facts.get("sm_percent"), report.sm_count
            slot.mode_facts.update(mps_client_verified=True, sm_count_seen=seen,
                                   device_memory_seen_bytes=report.total_memory)
            if limit is None or not self.gpu_sm_count or seen is None:
                continue
            expected = self.gpu_sm_count * limit / 100
            # The driver hands out SMs in pairs (TPCs), rounding the share down.
            if not (expected - 2 <= seen <= math.ceil(expected) + 1) or (limit < 100 and seen >= self.gpu_sm_count):
                raise WorkerCheckFailed(
                    f"worker pid {report.pid} sees {seen} SMs but its limit of {limit:g}% of "
                    f"{self.gpu_sm_count} SMs should give about {expected:.0f}: the limit did not take effect")

    def diagnostics(self) -> str:
        return self.daemon.log_tail()


def _foreign_daemon_reason(target: Target) -> str | None:
    """An MPS server of someone else's on this GPU would mix its clients into our measurement."""
    on_gpu = nvml.gpu_processes(target.cuda_gpu.uuid)
    for pid, info in mps.mps_processes().items():
        if pid in on_gpu and info["name"].startswith("nvidia-cuda-mps") and not _other_arm(info["pipe_dir"]):
            where = info["pipe_dir"] or "a pipe directory this user cannot read"
            return (f"another MPS daemon (server pid {pid}, {where}) already serves GPU {target.cuda_gpu.index} "
                    f"({target.cuda_gpu.uuid}); stop it or select another GPU")
    return None


def _other_arm(pipe_dir: str | None) -> bool:
    """In a paired A/B (``pytest-gpucolloc ab``) both arms run at once, each with a daemon of its own, and the
    controller idles one arm's clients while it measures the other's: the other arm's daemon is expected. It is
    the one whose scratch directory's owner is a sibling of this session (both started by the same controller)."""
    if not pipe_dir or os.environ.get(interleave.SOCKET_ENV) is None:
        return False
    for folder in Path(pipe_dir).parents:
        try:
            owner = (folder / OWNER_FILE).read_text().strip()
            status = Path(f"/proc/{int(owner)}/status").read_text()
        except (OSError, ValueError):
            continue
        parent = next((line.split()[1] for line in status.splitlines() if line.startswith("PPid:")), None)
        return parent == str(os.getppid())
    return False


class MpsMode(SharingMode):
    name = "mps"
    summary = "all workloads as clients of a private MPS daemon"
    colour = "tab:green"

    def unavailable_reason(self, target: Target) -> str | None:
        if target.gpu is None:
            return "MPS needs an NVIDIA GPU (running in CPU smoke mode)"
        if mps.control_binary() is None:
            return f"{mps.CONTROL} is not on PATH"
        return _foreign_daemon_reason(target)

    def validate(self, workloads, target: Target) -> None:
        if len(workloads) > mps.MAX_CLIENTS:
            raise ModeConfigError(f"{len(workloads)} workers exceed MPS's limit of {mps.MAX_CLIENTS} clients per GPU")
        mps.check_pipe_directory(target.scratch / "mps" / "pipe")

    def limits(self, workloads, target: Target) -> list[dict]:
        """Per-worker limits; none for plain MPS."""
        return [{} for _ in workloads]

    @contextlib.contextmanager
    def provision(self, workloads, target: Target) -> Iterator[Provision]:
        daemon = mps.MpsDaemon(target.scratch / "mps", target.cuda_gpu.uuid)
        try:
            daemon.start()
            slots = []
            for workload, limit in zip(workloads, self.limits(workloads, target)):
                env = daemon.client_env()
                if "sm_percent" in limit:
                    env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = f"{limit['sm_percent']:g}"
                if "memory_limit_mb" in limit:
                    env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={limit['memory_limit_mb']}M"
                slots.append(WorkerSlot(workload, env, mode_facts=dict(limit)))
            yield _DaemonProvision([slots], {"mps_daemon": str(daemon.root)}, daemon, target.gpu_sm_count)
        finally:
            daemon.stop()


class PartitionedMpsMode(MpsMode):
    name = "mps-partitioned"
    summary = "MPS with per-client SM and memory limits (default: equal shares, as Kubernetes does)"
    same_with_one_job = "mps"  # one client's equal share is the whole GPU
    colour = "tab:purple"

    def validate(self, workloads, target: Target) -> None:
        super().validate(workloads, target)
        self.limits(workloads, target)

    def limits(self, workloads, target: Target) -> list[dict]:
        total_mb = target.cuda_gpu.memory_total_bytes // 2**20 if target.gpu else None
        oversubscribe = target.options.mps_oversubscribe
        sm = _fill_shares([w.sm_percent for w in workloads], 100.0, "sm_percent", "percent of SMs", oversubscribe)
        mem = _fill_shares([w.memory_limit_mb for w in workloads], total_mb, "memory_limit_mb", "MB of device memory",
                           oversubscribe) if total_mb else [None] * len(workloads)
        return [{"sm_percent": s, **({"memory_limit_mb": int(m)} if m else {})} for s, m in zip(sm, mem)]


def _fill_shares(given: list, total: float, name: str, unit: str, oversubscribe: bool) -> list[float]:
    """Explicit shares stay; the rest split what remains equally (Kubernetes: total/N each)."""
    explicit = sum(g for g in given if g is not None)
    if explicit > total and not oversubscribe:
        raise ModeConfigError(f"the workloads' {name} add up to {explicit:g} {unit}, more than the {total:g} "
                              "available; lower them, or pass --mps-oversubscribe if that is intended")
    missing = [i for i, g in enumerate(given) if g is None]
    if not missing:
        return list(given)
    share = (total - explicit) / len(missing)
    if share <= 0:
        raise ModeConfigError(f"no {name} left for {len(missing)} workloads without an explicit share")
    share = math.floor(share)
    if share < 1:
        raise ModeConfigError(f"an equal share of {name} for {len(missing)} workloads is below 1")
    return [g if g is not None else share for g in given]
