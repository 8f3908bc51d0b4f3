"""Apply a MIG plan for one test: checkpoint what is there, create the planned instances, and restore the
checkpoint afterwards, whatever happened. Reconfiguring is destructive, so it needs an explicit opt-in;
without it an existing matching layout is used, or the scenario is skipped."""
from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..mode_errors import ModeFailed, ModeUnavailable
from .planner import Plan
from .profiles import ProfileTable
from .state import Checkpoint, GpuInstance, MigBackend, MigBackendError

IN_USE_RETRIES = 20  # a worker that just exited can hold its instance for a moment


class MigUnavailable(ModeUnavailable):
    """MIG cannot be used for this scenario here (skip with this reason)."""


class MigError(ModeFailed):
    """Provisioning or restoring failed."""


@dataclass(frozen=True)
class MigInstance:
    gi_id: int
    profile: str
    start: int
    size: int
    uuid: str
    multiprocessor_count: int
    memory_mb: int

    def to_dict(self) -> dict:
        return {"gpu_instance_id": self.gi_id, "profile": self.profile,
                "placement": f"{self.start}:{self.size}", "mig_uuid": self.uuid,
                "sm_count": self.multiprocessor_count, "memory_mb": self.memory_mb}


def _permission_hint(error: MigBackendError) -> str:
    if error.code == "no_permission":
        return f"{error}: reconfiguring MIG needs root or the mig/config capability (nvidia-capabilities)"
    return str(error)


class MigProvisioner:
    def __init__(self, backend: MigBackend, table: ProfileTable, gpu_uuid: str, gpu_index: int,
                 allow_reconfigure: bool, checkpoint_dir: Path):
        self.backend, self.table, self.gpu_uuid, self.gpu_index = backend, table, gpu_uuid, gpu_index
        self.allow_reconfigure = allow_reconfigure
        self.checkpoint_path = Path(checkpoint_dir) / f"mig-checkpoint-{gpu_uuid}.json"

    # --- reading ------------------------------------------------------------------------------------
    def _matches(self, current: list[GpuInstance], plan: Plan) -> bool:
        wanted = Counter((p.profile.profile_id, p.start) for p in plan.placements)
        have = Counter((i.profile_id, i.start) for i in current)
        return wanted == have and all(i.compute_instances for i in current)

    def _describe(self, instances: list[GpuInstance]) -> str:
        if not instances:
            return "no instances"
        names = {i.profile_id: profile.name if (profile := self.table.by_id(i.profile_id)) else i.profile_id
                 for i in instances}
        return ", ".join(f"{names[i.profile_id]}@{i.start}" for i in instances)

    def _instances_for(self, plan: Plan, current: list[GpuInstance]) -> list[MigInstance]:
        """Instances in the plan's order (one per worker)."""
        free = list(current)
        result = []
        for placement in plan.placements:
            gi = next(i for i in free if (i.profile_id, i.start) == (placement.profile.profile_id, placement.start))
            free.remove(gi)
            result.append(MigInstance(gi.gi_id, placement.profile.name, gi.start, gi.size,
                                      self.backend.device_uuid(gi.gi_id), placement.profile.multiprocessor_count,
                                      placement.profile.memory_mb))
        return result

    # --- changing -----------------------------------------------------------------------------------
    def _retry(self, call, *args) -> None:
        for attempt in range(IN_USE_RETRIES):
            try:
                return call(*args)
            except MigBackendError as error:
                if error.code != "in_use" or attempt == IN_USE_RETRIES - 1:
                    raise
                time.sleep(0.25)

    def _destroy_all(self) -> None:
        for instance in self.backend.gpu_instances():
            for ci in instance.compute_instances:  # compute instances before their GPU instance
                self._retry(self.backend.destroy_compute_instance, instance.gi_id, ci.ci_id)
            self._retry(self.backend.destroy_gpu_instance, instance.gi_id)

    def _create(self, instances: list[tuple[int, int, tuple[int, ...] | None]]) -> None:
        """(profile_id, start, compute-instance profiles or None for one full-size CI)."""
        for profile_id, start, ci_profiles in instances:
            gi_id = self.backend.create_gpu_instance(profile_id, start)
            if ci_profiles is None:
                self.backend.create_compute_instance(gi_id)
            for ci_profile in ci_profiles or ():
                self.backend.create_compute_instance_with_profile(gi_id, ci_profile)

    def restore(self, checkpoint: Checkpoint) -> None:
        """Put the checkpointed layout back (destroying whatever is there now)."""
        self._destroy_all()
        self._create([(i.profile_id, i.start, tuple(c.profile_id for c in i.compute_instances))
                      for i in checkpoint.instances])

    def recover(self) -> bool:
        """Restore a checkpoint left behind by a run that was killed; True if one was restored."""
        if not self.checkpoint_path.exists():
            return False
        checkpoint = Checkpoint.load(self.checkpoint_path)
        try:
            self.restore(checkpoint)
        except MigBackendError as error:
            raise MigError(f"could not restore the MIG layout saved at {self.checkpoint_path}: "
                           f"{_permission_hint(error)}") from error
        self.checkpoint_path.unlink()
        return True

    @contextlib.contextmanager
    def provision(self, plan: Plan) -> Iterator[list[MigInstance]]:
        if not plan.feasible:
            raise MigUnavailable(plan.explain())
        if self.backend.mig_mode() != 1:
            raise MigUnavailable(f"MIG mode is disabled on GPU {self.gpu_index}; pytest-gpucolloc never changes it. "
                                 f"An administrator can enable it with `sudo nvidia-smi -i {self.gpu_index} -mig 1` "
                                 "while the GPU is idle (some systems also need a GPU reset or a reboot)")
        self.recover()
        current = self.backend.gpu_instances()
        if self._matches(current, plan):
            yield self._instances_for(plan, current)  # the layout is already there: change nothing
            return
        if not self.allow_reconfigure:
            raise MigUnavailable(
                f"GPU {self.gpu_index} has MIG layout [{self._describe(current)}] but the scenario needs "
                f"[{', '.join(p.describe() for p in plan.placements)}]; pass --mig-reconfigure to let the plugin "
                "reconfigure it (it restores the current layout afterwards)")
        foreign = self.backend.processes()
        if foreign:
            raise MigUnavailable(f"refusing to reconfigure MIG on GPU {self.gpu_index}: processes {foreign} use it")
        checkpoint = Checkpoint(self.gpu_uuid, current)
        checkpoint.save(self.checkpoint_path)
        try:
            try:
                self._destroy_all()
                self._create([(p.profile.profile_id, p.start, None) for p in plan.placements])
                instances = self._instances_for(plan, self.backend.gpu_instances())
            except MigBackendError as error:
                raise MigError(f"creating the MIG layout failed: {_permission_hint(error)}") from error
            yield instances
        finally:
            try:
                self.restore(checkpoint)
            except MigBackendError as error:
                raise MigError(
                    f"restoring the MIG layout failed: {_permission_hint(error)}; the previous layout is saved "
                    f"at {self.checkpoint_path}; `pytest-gpucolloc mig restore` retries") from error
            self.checkpoint_path.unlink()
