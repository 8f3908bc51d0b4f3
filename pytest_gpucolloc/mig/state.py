"""MIG state as plain data, and the backend interface that reads and changes it (``nvml_backend.NvmlMigBackend``;
tests/doubles/ simulate NVIDIA's rules). The provisioner only ever talks to this interface."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

# NVML_COMPUTE_INSTANCE_PROFILE_*_SLICE: the full-size compute-instance profile index of a GPU instance with
# this many compute slices.
FULL_CI_PROFILE_INDEX = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}


class MigBackendError(RuntimeError):
    """An NVML MIG call failed; ``code`` names why (no_permission, in_use, insufficient_resources,
    invalid_argument, not_found, not_supported, unknown)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{message} ({code})")
        self.code = code


@dataclass(frozen=True)
class ComputeInstance:
    ci_id: int
    profile_id: int


@dataclass(frozen=True)
class GpuInstance:
    gi_id: int
    profile_id: int
    start: int  # first memory slice
    size: int  # memory slices
    compute_instances: tuple[ComputeInstance, ...] = ()


class MigBackend(Protocol):
    def mig_mode(self) -> int | None: ...  # 1 enabled, 0 disabled, None: not a MIG-capable GPU
    def gpu_instances(self) -> list[GpuInstance]: ...
    def create_gpu_instance(self, profile_id: int, start: int) -> int: ...
    def create_compute_instance(self, gi_id: int) -> int: ...  # one full-size CI, shared engines
    def create_compute_instance_with_profile(self, gi_id: int, ci_profile_id: int) -> int: ...
    def destroy_compute_instance(self, gi_id: int, ci_id: int) -> None: ...
    def destroy_gpu_instance(self, gi_id: int) -> None: ...
    def device_uuid(self, gi_id: int) -> str: ...  # MIG-... of the instance's (first) compute instance
    def processes(self) -> list[int]: ...  # pids with a context on the GPU or any of its instances


@dataclass
class Checkpoint:
    """The layout found before reconfiguring, kept on disk until it has been restored."""

    gpu_uuid: str
    instances: list[GpuInstance]

    def save(self, path: Path) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"gpu_uuid": self.gpu_uuid, "instances": [asdict(i) for i in self.instances]}))
        tmp.replace(path)  # atomic: a crash leaves the old file or the new one, never half of one

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        data = json.loads(path.read_text())
        instances = [GpuInstance(i["gi_id"], i["profile_id"], i["start"], i["size"],
                                 tuple(ComputeInstance(**c) for c in i["compute_instances"]))
                     for i in data["instances"]]
        return cls(data["gpu_uuid"], instances)
