"""A stand-in for the ``pynvml`` module's MIG calls, driven by ``mig_simulator.SimulatedMig``.

``nvml_backend.NvmlMigBackend(uuid, lib=FakePynvml(simulated))`` runs the backend's real NVML code in CI:
ctypes arrays and ``byref`` counts filled as NVML fills them, profile *index* vs profile *id*, sparse MIG device
indexes, and errors as ``NVMLError`` with NVML's return codes. The rules themselves are the simulator's.
"""
from __future__ import annotations

import ctypes
from types import SimpleNamespace

from pytest_gpucolloc.mig.nvml_backend import ERROR_CODES
from pytest_gpucolloc.mig.state import MigBackendError

from .mig_simulator import SimulatedMig

_RETURN_CODES = {code: value for value, code in ERROR_CODES.items()}


class NVMLError(Exception):
    def __init__(self, value: int, message: str = ""):
        super().__init__(message or f"NVML error {value}")
        self.value = value


class _Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class FakePynvml:
    NVMLError = NVMLError
    NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 8
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0
    c_nvmlGpuInstancePlacement_t = _Placement
    c_nvmlGpuInstance_t = ctypes.c_uint64  # handles are plain numbers here
    c_nvmlComputeInstance_t = ctypes.c_uint64
    MAX_MIG_DEVICES = 7

    def __init__(self, simulated: SimulatedMig, gpu_uuid: str = "GPU-sim"):
        self.sim = simulated
        self.gpu_uuid = gpu_uuid

    # --- handles: the GPU is 1; GPU instance g is 1000+g; compute instance c of g is 100000*g+c+1 ----------
    def _gpu(self, handle) -> None:
        if handle != 1:
            raise NVMLError(2, "invalid device handle")

    @staticmethod
    def _gi_id(handle) -> int:
        if not 1000 <= handle < 100000:
            raise NVMLError(2, "invalid GPU-instance handle")
        return handle - 1000

    def _wrap(self, function, *args):
        try:
            return function(*args)
        except MigBackendError as error:
            raise NVMLError(_RETURN_CODES.get(error.code, 999), str(error)) from None

    def _instance(self, gi_id: int):
        found = self._wrap(self.sim.gpu_instances)
        match = next((i for i in found if i.gi_id == gi_id), None)
        if match is None:
            raise NVMLError(6, f"no GPU instance {gi_id}")
        return match

    # --- device -------------------------------------------------------------------------------------
    def nvmlDeviceGetHandleByUUID(self, uuid) -> int:
        if (uuid.decode() if isinstance(uuid, bytes) else uuid) != self.gpu_uuid:
            raise NVMLError(6, "no such GPU")
        return 1

    def nvmlDeviceGetMigMode(self, handle):
        self._gpu(handle)
        mode = self._wrap(self.sim.mig_mode)
        return [mode, mode]

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle, index):
        self._gpu(handle)
        profile = next((p for p in self.sim.table.profiles if p.nvml_index == index), None)
        if profile is None:
            raise NVMLError(3, f"profile index {index} not supported")
        return SimpleNamespace(id=profile.profile_id, name=f"MIG {profile.name}".encode(),
                               sliceCount=profile.slice_count, instanceCount=profile.instance_count,
                               memorySizeMB=profile.memory_mb, multiprocessorCount=profile.multiprocessor_count)

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, handle, profile_id, placements, count_ref):
        self._gpu(handle)
        profile = self.sim.table.by_id(profile_id)
        if profile is None:
            raise NVMLError(2, f"unknown profile id {profile_id}")
        for i, start in enumerate(profile.starts):
            placements[i].start, placements[i].size = start, profile.size
        count_ref._obj.value = len(profile.starts)

    def nvmlDeviceGetGpuInstances(self, handle, profile_id, array, count_ref):
        self._gpu(handle)
        found = [i for i in self._wrap(self.sim.gpu_instances) if i.profile_id == profile_id]
        for k, instance in enumerate(found):
            array[k] = 1000 + instance.gi_id
        count_ref._obj.value = len(found)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle, profile_id, placement_ref):
        self._gpu(handle)
        return 1000 + self._wrap(self.sim.create_gpu_instance, profile_id, placement_ref._obj.start)

    def nvmlDeviceGetGpuInstanceById(self, handle, gi_id):
        self._gpu(handle)
        return 1000 + self._instance(gi_id).gi_id

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        self._gpu(handle)
        return self.MAX_MIG_DEVICES

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index):
        """MIG devices by index are sparse in NVML too: a gap raises NotFound."""
        self._gpu(handle)
        with_compute = [i for i in self._wrap(self.sim.gpu_instances) if i.compute_instances]
        slot = {2 * k: instance for k, instance in enumerate(with_compute)}  # every other index is a gap
        if index not in slot:
            raise NVMLError(6, f"no MIG device at index {index}")
        return ("mig", slot[index].gi_id)

    def nvmlDeviceGetGpuInstanceId(self, device):
        return device[1]

    def nvmlDeviceGetUUID(self, device):
        if device == 1:
            return self.gpu_uuid.encode()
        return self._wrap(self.sim.device_uuid, device[1]).encode()

    def nvmlDeviceGetComputeRunningProcesses(self, device):
        if device == 1:
            pids = [pid for pid, owner in self.sim.process_owners.items() if owner is None]
        else:
            pids = [pid for pid, owner in self.sim.process_owners.items() if owner == device[1]]
        return [SimpleNamespace(pid=pid, usedGpuMemory=None) for pid in pids]

    def nvmlDeviceGetMPSComputeRunningProcesses(self, device):
        return []

    # --- GPU instances --------------------------------------------------------------------------------
    def nvmlGpuInstanceGetInfo(self, gi):
        instance = self._instance(self._gi_id(gi))
        return SimpleNamespace(id=instance.gi_id, profileId=instance.profile_id,
                               placement=SimpleNamespace(start=instance.start, size=instance.size))

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi, index, engine_profile):
        self._instance(self._gi_id(gi))
        if not 0 <= index < self.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            raise NVMLError(2, f"compute-instance profile index {index}")
        return SimpleNamespace(id=index)  # on Hopper the full-size profiles' ids equal their indexes

    def nvmlGpuInstanceGetComputeInstances(self, gi, ci_profile_id, array, count_ref):
        gi_id = self._gi_id(gi)
        found = [c for c in self._instance(gi_id).compute_instances if c.profile_id == ci_profile_id]
        for k, ci in enumerate(found):
            array[k] = 100000 * gi_id + ci.ci_id + 1
        count_ref._obj.value = len(found)
        return 0

    def nvmlGpuInstanceCreateComputeInstance(self, gi, ci_profile_id):
        gi_id = self._gi_id(gi)
        ci_id = self._wrap(self.sim.create_compute_instance_with_profile, gi_id, ci_profile_id)
        return 100000 * gi_id + ci_id + 1

    def nvmlGpuInstanceGetComputeInstanceById(self, gi, ci_id):
        gi_id = self._gi_id(gi)
        if not any(c.ci_id == ci_id for c in self._instance(gi_id).compute_instances):
            raise NVMLError(6, f"no compute instance {ci_id}")
        return 100000 * gi_id + ci_id + 1

    def nvmlGpuInstanceDestroy(self, gi):
        self._wrap(self.sim.destroy_gpu_instance, self._gi_id(gi))

    # --- compute instances ----------------------------------------------------------------------------
    @staticmethod
    def _ci(ci) -> tuple[int, int]:
        if ci < 100000:
            raise NVMLError(2, "invalid compute-instance handle")
        return ci // 100000, ci % 100000 - 1

    def nvmlComputeInstanceGetInfo(self, ci):
        gi_id, ci_id = self._ci(ci)
        match = next((c for c in self._instance(gi_id).compute_instances if c.ci_id == ci_id), None)
        if match is None:
            raise NVMLError(6, f"no compute instance {ci_id}")
        return SimpleNamespace(id=match.ci_id, profileId=match.profile_id)

    def nvmlComputeInstanceDestroy(self, ci):
        gi_id, ci_id = self._ci(ci)
        self._wrap(self.sim.destroy_compute_instance, gi_id, ci_id)
