"""``MigBackend`` on a real GPU, through NVML: ``nvml.library()``, or in tests a fake one (tests/doubles/) whose
simulator enforces the rules. Every NVML error becomes a ``MigBackendError`` with a code."""
from __future__ import annotations

import contextlib
import ctypes

from .. import nvml
from ..nvml import as_text, try_call
from .state import FULL_CI_PROFILE_INDEX, ComputeInstance, GpuInstance, MigBackendError

MAX_PROFILE_INDEX = 20
ERROR_CODES = {2: "invalid_argument", 3: "not_supported", 4: "no_permission", 6: "not_found",
               19: "in_use", 23: "insufficient_resources"}


def read_profiles(gpu_uuid: str, lib=None) -> list[dict]:
    """GPU-instance profiles with their possible placements, as ``profiles.table_from_dict`` wants them.
    Read-only queries: they answer with MIG mode off too."""
    lib = lib or nvml.library()
    h = lib.nvmlDeviceGetHandleByUUID(gpu_uuid.encode())
    profiles = []
    for index in range(MAX_PROFILE_INDEX):
        try:
            info = lib.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
        except lib.NVMLError:  # NotSupported / InvalidArgument: no such profile here
            continue
        # A profile can have more placements than instances (1g.18gb+me: 1 instance, 7 places);
        # there are at most 8 memory slices, so 8 entries always suffice.
        placements = (lib.c_nvmlGpuInstancePlacement_t * 8)()
        count = ctypes.c_uint(8)
        starts, size = [], None
        with contextlib.suppress(lib.NVMLError):
            lib.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, placements, ctypes.byref(count))
            starts = [int(placements[i].start) for i in range(count.value)]
            size = int(placements[0].size) if count.value else None
        profiles.append({
            "nvml_index": index, "profile_id": int(info.id), "name": as_text(getattr(info, "name", b"")) or None,
            "slice_count": int(info.sliceCount), "instance_count": int(info.instanceCount),
            "memory_mb": int(info.memorySizeMB), "multiprocessor_count": int(info.multiprocessorCount),
            "placements": {"starts": starts, "size": size}})
    return profiles


class NvmlMigBackend:
    """Reads and changes MIG instances of one GPU (used only with --mig-reconfigure, or to read a layout)."""

    def __init__(self, gpu_uuid: str, lib=None):
        self.lib = lib or nvml.library()
        self.uuid = gpu_uuid
        self._h = self.lib.nvmlDeviceGetHandleByUUID(gpu_uuid.encode())
        self._profiles = {p["profile_id"]: p for p in read_profiles(gpu_uuid, self.lib)}

    def _call(self, function, *args):
        try:
            return function(*args)
        except self.lib.NVMLError as error:
            code = ERROR_CODES.get(getattr(error, "value", None), "unknown")
            raise MigBackendError(code, f"{function.__name__}: {error}") from None

    def mig_mode(self) -> int | None:
        mode = try_call(self.lib.nvmlDeviceGetMigMode, self._h)
        return mode[0] if mode else None

    def _gi_handles(self) -> list:
        handles = []
        for profile_id in self._profiles:
            array = (self.lib.c_nvmlGpuInstance_t * 8)()
            count = ctypes.c_uint(0)
            self._call(self.lib.nvmlDeviceGetGpuInstances, self._h, profile_id, array, ctypes.byref(count))
            handles += [array[i] for i in range(count.value)]
        return handles

    def _compute_instances(self, gi) -> list[ComputeInstance]:
        lib = self.lib
        found = []
        for index in range(lib.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            ci_profile = try_call(lib.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, index,
                              lib.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            if ci_profile is None:
                continue
            array = (lib.c_nvmlComputeInstance_t * 8)()
            count = ctypes.c_uint(0)
            if try_call(lib.nvmlGpuInstanceGetComputeInstances, gi, ci_profile.id, array, ctypes.byref(count),
                    default=False) is False:
                continue
            for i in range(count.value):
                ci_info = self._call(lib.nvmlComputeInstanceGetInfo, array[i])
                found.append(ComputeInstance(int(ci_info.id), int(ci_info.profileId)))
        return found

    def gpu_instances(self) -> list[GpuInstance]:
        found = []
        for gi in self._gi_handles():
            info = self._call(self.lib.nvmlGpuInstanceGetInfo, gi)
            found.append(GpuInstance(int(info.id), int(info.profileId), int(info.placement.start),
                                     int(info.placement.size), tuple(self._compute_instances(gi))))
        return sorted(found, key=lambda g: g.gi_id)

    def create_gpu_instance(self, profile_id: int, start: int) -> int:
        placement = self.lib.c_nvmlGpuInstancePlacement_t()
        placement.start = start
        placement.size = self._profiles[profile_id]["placements"]["size"]
        gi = self._call(self.lib.nvmlDeviceCreateGpuInstanceWithPlacement, self._h, profile_id,
                        ctypes.byref(placement))
        return int(self._call(self.lib.nvmlGpuInstanceGetInfo, gi).id)

    def create_compute_instance(self, gi_id: int) -> int:
        gi = self._gi(gi_id)
        slices = self._profiles[int(self._call(self.lib.nvmlGpuInstanceGetInfo, gi).profileId)]["slice_count"]
        info = self._call(self.lib.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, FULL_CI_PROFILE_INDEX[slices],
                          self.lib.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        return self.create_compute_instance_with_profile(gi_id, int(info.id))

    def create_compute_instance_with_profile(self, gi_id: int, ci_profile_id: int) -> int:
        ci = self._call(self.lib.nvmlGpuInstanceCreateComputeInstance, self._gi(gi_id), ci_profile_id)
        return int(self._call(self.lib.nvmlComputeInstanceGetInfo, ci).id)

    def destroy_compute_instance(self, gi_id: int, ci_id: int) -> None:
        ci = self._call(self.lib.nvmlGpuInstanceGetComputeInstanceById, self._gi(gi_id), ci_id)
        self._call(self.lib.nvmlComputeInstanceDestroy, ci)

    def destroy_gpu_instance(self, gi_id: int) -> None:
        self._call(self.lib.nvmlGpuInstanceDestroy, self._gi(gi_id))

    def _gi(self, gi_id: int):
        return self._call(self.lib.nvmlDeviceGetGpuInstanceById, self._h, gi_id)

    def _mig_devices(self) -> list:
        devices = (try_call(self.lib.nvmlDeviceGetMigDeviceHandleByIndex, self._h, index)  # sparse: gaps are normal
                   for index in range(self._call(self.lib.nvmlDeviceGetMaxMigDeviceCount, self._h)))
        return [device for device in devices if device is not None]

    def device_uuid(self, gi_id: int) -> str:
        for device in self._mig_devices():
            if try_call(self.lib.nvmlDeviceGetGpuInstanceId, device) == gi_id:
                return as_text(self.lib.nvmlDeviceGetUUID(device))
        raise MigBackendError("not_found", f"no MIG device for GPU instance {gi_id}")

    def processes(self) -> list[int]:
        pids: set[int] = set()
        for device in [self._h] + self._mig_devices():
            for query in (self.lib.nvmlDeviceGetComputeRunningProcesses,
                          self.lib.nvmlDeviceGetMPSComputeRunningProcesses):
                pids.update(int(p.pid) for p in (try_call(query, device, default=[]) or []))
        return sorted(pids)
