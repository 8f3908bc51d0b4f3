"""An in-memory MIG GPU for tests: implements ``MigBackend`` and enforces NVIDIA's rules, seeded from a
profile table (``profiles.named_table``): placements only at the profile's allowed starts, memory slices
never overlapping, at most ``compute_slices`` compute slices, per-profile instance counts, MIG mode and
privileges, InUse while processes or compute instances remain (compute instances go first).

It also injects faults: ``fail_after[call] = n`` makes the n-th next call of that method raise."""
from __future__ import annotations

import itertools
from dataclasses import replace

from pytest_gpucolloc.mig.profiles import ProfileTable
from pytest_gpucolloc.mig.state import FULL_CI_PROFILE_INDEX, ComputeInstance, GpuInstance, MigBackendError


class SimulatedMig:
    def __init__(self, table: ProfileTable, mig_enabled: bool = True, privileged: bool = True):
        self.table = table
        self.mig_enabled = mig_enabled
        self.privileged = privileged
        self.instances: dict[int, GpuInstance] = {}
        self.process_owners: dict[int, int | None] = {}  # pid -> gi_id (None: whole GPU)
        self.fail_after: dict[str, int] = {}
        self.calls: list[str] = []
        self._gi_ids = itertools.count(1)
        self._ci_ids = itertools.count(0)

    # --- fault injection and test helpers -------------------------------------------------------
    def _enter(self, call: str) -> None:
        self.calls.append(call)
        if call in self.fail_after:
            self.fail_after[call] -= 1
            if self.fail_after[call] <= 0:
                del self.fail_after[call]
                raise MigBackendError("unknown", f"injected failure in {call}")

    def _mutating(self, call: str) -> None:
        self._enter(call)
        if not self.mig_enabled:
            raise MigBackendError("not_supported", "MIG mode is disabled")
        if not self.privileged:
            raise MigBackendError("no_permission", "changing MIG needs root or the mig/config capability")

    def attach_process(self, pid: int, gi_id: int | None = None) -> None:
        self.process_owners[pid] = gi_id

    def detach_process(self, pid: int) -> None:
        self.process_owners.pop(pid, None)

    def layout(self) -> list[tuple[str, int]]:
        return sorted((self.table.by_id(i.profile_id).name, i.start) for i in self.instances.values())

    # --- MigBackend -------------------------------------------------------------------------------
    def mig_mode(self) -> int | None:
        self._enter("mig_mode")
        return 1 if self.mig_enabled else 0

    def gpu_instances(self) -> list[GpuInstance]:
        self._enter("gpu_instances")
        return sorted(self.instances.values(), key=lambda i: i.gi_id)

    def create_gpu_instance(self, profile_id: int, start: int) -> int:
        self._mutating("create_gpu_instance")
        profile = self.table.by_id(profile_id)
        if profile is None:
            raise MigBackendError("invalid_argument", f"unknown GPU-instance profile id {profile_id}")
        if start not in profile.starts:
            raise MigBackendError("invalid_argument",
                                  f"{profile.name} cannot start at memory slice {start} (allowed {list(profile.starts)})")
        taken = {s for i in self.instances.values() for s in range(i.start, i.start + i.size)}
        if taken & set(range(start, start + profile.size)):
            raise MigBackendError("insufficient_resources", f"memory slices {start}-{start + profile.size - 1} in use")
        compute = sum(self.table.by_id(i.profile_id).slice_count for i in self.instances.values())
        if compute + profile.slice_count > self.table.compute_slices:
            raise MigBackendError("insufficient_resources", "not enough compute slices")
        same = sum(1 for i in self.instances.values() if i.profile_id == profile_id)
        if same >= profile.instance_count:
            raise MigBackendError("insufficient_resources", f"{profile.name}: at most {profile.instance_count} instances")
        gi_id = next(self._gi_ids)
        self.instances[gi_id] = GpuInstance(gi_id, profile_id, start, profile.size)
        return gi_id

    def create_compute_instance(self, gi_id: int) -> int:
        return self.create_compute_instance_with_profile(gi_id, self._full_ci_profile(gi_id))

    def create_compute_instance_with_profile(self, gi_id: int, ci_profile_id: int) -> int:
        self._mutating("create_compute_instance")
        instance = self._instance(gi_id)
        if instance.compute_instances:
            raise MigBackendError("insufficient_resources", f"GPU instance {gi_id} already has a full compute instance")
        ci_id = next(self._ci_ids)
        self.instances[gi_id] = replace(instance, compute_instances=(ComputeInstance(ci_id, ci_profile_id),))
        return ci_id

    def _full_ci_profile(self, gi_id: int) -> int:
        return FULL_CI_PROFILE_INDEX[self.table.by_id(self._instance(gi_id).profile_id).slice_count]

    def destroy_compute_instance(self, gi_id: int, ci_id: int) -> None:
        self._mutating("destroy_compute_instance")
        instance = self._instance(gi_id)
        if not any(c.ci_id == ci_id for c in instance.compute_instances):
            raise MigBackendError("not_found", f"no compute instance {ci_id} in GPU instance {gi_id}")
        if any(owner == gi_id for owner in self.process_owners.values()):
            raise MigBackendError("in_use", f"processes still use GPU instance {gi_id}")
        self.instances[gi_id] = replace(instance, compute_instances=tuple(
            c for c in instance.compute_instances if c.ci_id != ci_id))

    def destroy_gpu_instance(self, gi_id: int) -> None:
        self._mutating("destroy_gpu_instance")
        instance = self._instance(gi_id)
        if instance.compute_instances:
            raise MigBackendError("in_use", f"GPU instance {gi_id} still has compute instances")
        if any(owner == gi_id for owner in self.process_owners.values()):
            raise MigBackendError("in_use", f"processes still use GPU instance {gi_id}")
        del self.instances[gi_id]

    def device_uuid(self, gi_id: int) -> str:
        self._enter("device_uuid")
        instance = self._instance(gi_id)
        if not instance.compute_instances:
            raise MigBackendError("not_found", f"GPU instance {gi_id} has no compute instance")
        return f"MIG-sim-{gi_id:04d}-{instance.compute_instances[0].ci_id:04d}"

    def processes(self) -> list[int]:
        self._enter("processes")
        return sorted(self.process_owners)

    def _instance(self, gi_id: int) -> GpuInstance:
        if gi_id not in self.instances:
            raise MigBackendError("not_found", f"no GPU instance {gi_id}")
        return self.instances[gi_id]
