"""The only module that imports pynvml (package ``nvidia-ml-py``). Everything it returns is plain data.

NVML needs no CUDA context, so the pytest process can ask it questions without initialising CUDA.
"""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field
from typing import Any

try:
    import pynvml
except ImportError:  # nvidia-ml-py is a dependency, but a broken install must still give a reason
    pynvml = None

_lock = threading.Lock()
_state: dict[str, Any] = {"initialised": False, "error": None}

GPM_METRICS = {  # NVML_GPM_METRIC_* ids
    "sm_activity_pct": 2,
    "sm_occupancy_pct": 3,
    "tensor_activity_pct": 5,
    "dram_bw_util_pct": 10,
}
THROTTLE_REASONS = {  # clock-event reason bits that make a run not comparable
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}


class NvmlUnavailable(RuntimeError):
    pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def init() -> str | None:
    """Initialise NVML once; returns None when usable, else the reason it is not."""
    with _lock:
        if _state["initialised"]:
            return None
        if _state["error"]:
            return _state["error"]
        if pynvml is None:
            _state["error"] = "nvidia-ml-py (module pynvml) is not installed"
            return _state["error"]
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            _state["error"] = f"NVML is not available ({exc})"
            return _state["error"]
        _state["initialised"] = True
        return None


def _require() -> None:
    reason = init()
    if reason:
        raise NvmlUnavailable(reason)


def _try(function, *args, default=None):
    try:
        return function(*args)
    except Exception:
        return default


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    mig_mode: int | None  # 1 enabled, 0 disabled, None unsupported
    compute_capability: tuple[int, int] | None = None
    extra: dict = field(default_factory=dict, compare=False)


def device_count() -> int:
    _require()
    return pynvml.nvmlDeviceGetCount()


def _handle(uuid_or_index: str | int):
    _require()
    if isinstance(uuid_or_index, int):
        return pynvml.nvmlDeviceGetHandleByIndex(uuid_or_index)
    return pynvml.nvmlDeviceGetHandleByUUID(uuid_or_index.encode() if isinstance(uuid_or_index, str) else uuid_or_index)


def gpus() -> list[GpuInfo]:
    """Every GPU the driver sees, with read-only facts used for identity and planning."""
    result = []
    for index in range(device_count()):
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        mig = _try(pynvml.nvmlDeviceGetMigMode, h)
        clocks = pynvml.NVML_CLOCK_SM
        extra = {
            "persistence_mode": _try(pynvml.nvmlDeviceGetPersistenceMode, h),
            "ecc_mode": (_try(pynvml.nvmlDeviceGetEccMode, h) or [None])[0],
            "power_limit_w": (_try(pynvml.nvmlDeviceGetEnforcedPowerLimit, h) or 0) / 1000 or None,
            "max_sm_clock_mhz": _try(pynvml.nvmlDeviceGetMaxClockInfo, h, clocks),
            "application_sm_clock_mhz": _try(pynvml.nvmlDeviceGetApplicationsClock, h, clocks),
            "max_memory_clock_mhz": _try(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_MEM),
            "sm_count": _full_gpu_sm_count(h),
        }
        result.append(GpuInfo(
            index=index,
            uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
            name=_text(pynvml.nvmlDeviceGetName(h)),
            memory_total_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
            mig_mode=mig[0] if mig else None,
            compute_capability=_try(pynvml.nvmlDeviceGetCudaComputeCapability, h),
            extra=extra,
        ))
    return result


def _full_gpu_sm_count(h) -> int | None:
    """SM count of the whole GPU, read from its full-size MIG profile (answers with MIG off too);
    None on GPUs without MIG."""
    info = _try(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, h, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE)
    return int(info.multiprocessorCount) if info else None


def driver() -> dict:
    _require()
    cuda = _try(pynvml.nvmlSystemGetCudaDriverVersion_v2) or _try(pynvml.nvmlSystemGetCudaDriverVersion)
    return {
        "driver_version": _text(pynvml.nvmlSystemGetDriverVersion()),
        "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
        "nvml_version": _text(_try(pynvml.nvmlSystemGetNVMLVersion, default="")) or None,
    }


def gpu_processes(uuid: str) -> dict[int, dict]:
    """Processes with a context on the GPU: pid -> {memory_bytes, mps}. MPS clients are listed by
    the MPS query; plain contexts (and the MPS server itself) by the compute query."""
    h = _handle(uuid)
    found: dict[int, dict] = {}
    for query, is_mps in ((pynvml.nvmlDeviceGetComputeRunningProcesses, False),
                          (pynvml.nvmlDeviceGetMPSComputeRunningProcesses, True)):
        for proc in _try(query, h, default=[]) or []:
            memory = proc.usedGpuMemory if isinstance(proc.usedGpuMemory, int) else None
            found[int(proc.pid)] = {"memory_bytes": memory, "mps": is_mps}
    return found


# --- telemetry -------------------------------------------------------------------------------

def instant_sample(uuid: str) -> dict:
    """Cheap counters read many times a second: energy (mJ), power (mW), SM clock, clock-event bits."""
    h = _handle(uuid)
    return {
        "energy_mj": _try(pynvml.nvmlDeviceGetTotalEnergyConsumption, h),
        "power_mw": _try(pynvml.nvmlDeviceGetPowerUsage, h),
        "sm_clock_mhz": _try(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM),
        "clock_event_reasons": _try(pynvml.nvmlDeviceGetCurrentClocksEventReasons, h),
        "utilization_gpu_pct": getattr(_try(pynvml.nvmlDeviceGetUtilizationRates, h), "gpu", None),
    }


def gpm_supported(uuid: str) -> bool:
    h = _handle(uuid)
    support = _try(pynvml.nvmlGpmQueryDeviceSupport, h)
    return bool(support and support.isSupportedDevice)


# GPM calls from two samplers at once crashed a process on the H200 (segfault; the overlapping samplers
# of an overhead measurement): they are serialised, which costs nothing at one sampler per scenario.
_gpm_lock = threading.Lock()


class GpmSample:
    """An NVML GPM sample (GPU, or one GPU instance under MIG); free() when done."""

    def __init__(self, uuid: str, gpu_instance_id: int | None = None):
        self._h = _handle(uuid)
        with _gpm_lock:
            self._sample = pynvml.nvmlGpmSampleAlloc()
            if gpu_instance_id is None:
                pynvml.nvmlGpmSampleGet(self._h, self._sample)
            else:
                pynvml.nvmlGpmMigSampleGet(self._h, gpu_instance_id, self._sample)

    def free(self) -> None:
        with _gpm_lock:
            if self._sample is not None:
                pynvml.nvmlGpmSampleFree(self._sample)
                self._sample = None


def gpm_metrics(first: GpmSample, second: GpmSample) -> dict[str, float | str]:
    """Metric name -> value between two samples, or a string reason where NVML refused that metric."""
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(GPM_METRICS)
    request.sample1, request.sample2 = first._sample, second._sample
    for i, metric_id in enumerate(GPM_METRICS.values()):
        request.metrics[i].metricId = metric_id
    with _gpm_lock:
        pynvml.nvmlGpmMetricsGet(request)
    values: dict[str, float | str] = {}
    for i, name in enumerate(GPM_METRICS):
        metric = request.metrics[i]
        if metric.nvmlReturn == pynvml.NVML_SUCCESS:
            values[name] = float(metric.value)
        else:
            values[name] = f"unsupported (NVML return {metric.nvmlReturn})"
    return values


# --- MIG (read-only queries; they answer with MIG mode off too) ----------------------------------

MAX_PROFILE_INDEX = 20


def mig_profiles(uuid: str) -> list[dict]:
    """GPU-instance profiles with their possible placements, as ``mig.table`` wants them."""
    h = _handle(uuid)
    profiles = []
    for index in range(MAX_PROFILE_INDEX):
        try:
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
        except pynvml.NVMLError:  # NotSupported / InvalidArgument: no such profile here
            continue
        # A profile can have more placements than instances (1g.18gb+me: 1 instance, 7 places);
        # there are at most 8 memory slices, so 8 entries always suffice.
        placements = (pynvml.c_nvmlGpuInstancePlacement_t * 8)()
        count = ctypes.c_uint(8)
        starts, size = [], None
        try:
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, placements, ctypes.byref(count))
            starts = [int(placements[i].start) for i in range(count.value)]
            size = int(placements[0].size) if count.value else None
        except pynvml.NVMLError:
            pass
        name = _text(getattr(info, "name", b"")) or None
        profiles.append({
            "nvml_index": index,
            "profile_id": int(info.id),
            "name": name,
            "slice_count": int(info.sliceCount),
            "instance_count": int(info.instanceCount),
            "memory_mb": int(info.memorySizeMB),
            "multiprocessor_count": int(info.multiprocessorCount),
            "placements": {"starts": starts, "size": size},
        })
    return profiles


# --- MIG changes (used only with --mig-reconfigure, on a GPU whose MIG mode an admin enabled) --------

_FULL_CI_PROFILE_INDEX = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}  # GI compute slices -> CI profile index
_ERROR_CODES = {2: "invalid_argument", 3: "not_supported", 4: "no_permission", 6: "not_found",
                19: "in_use", 23: "insufficient_resources"}


class NvmlMigBackend:
    """``mig.state.MigBackend`` on a real GPU. Every NVML error becomes a MigBackendError with a code."""

    def __init__(self, gpu_uuid: str):
        self.uuid = gpu_uuid
        self._h = _handle(gpu_uuid)
        self._profiles = {p["profile_id"]: p for p in mig_profiles(gpu_uuid)}

    @staticmethod
    def _call(function, *args):
        from .mig.state import MigBackendError

        try:
            return function(*args)
        except pynvml.NVMLError as error:
            code = _ERROR_CODES.get(getattr(error, "value", None), "unknown")
            raise MigBackendError(code, f"{function.__name__}: {error}") from None

    def mig_mode(self) -> int | None:
        mode = _try(pynvml.nvmlDeviceGetMigMode, self._h)
        return mode[0] if mode else None

    def _gi_handles(self) -> list:
        handles = []
        for profile_id in self._profiles:
            array = (pynvml.c_nvmlGpuInstance_t * 8)()
            count = ctypes.c_uint(0)
            self._call(pynvml.nvmlDeviceGetGpuInstances, self._h, profile_id, array, ctypes.byref(count))
            handles += [array[i] for i in range(count.value)]
        return handles

    def gpu_instances(self) -> list:
        from .mig.state import ComputeInstance, GpuInstance

        found = []
        for gi in self._gi_handles():
            info = self._call(pynvml.nvmlGpuInstanceGetInfo, gi)
            computes = []
            for index in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
                ci_profile = _try(pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, index,
                                  pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
                if ci_profile is None:
                    continue
                array = (pynvml.c_nvmlComputeInstance_t * 8)()
                count = ctypes.c_uint(0)
                if _try(pynvml.nvmlGpuInstanceGetComputeInstances, gi, ci_profile.id, array, ctypes.byref(count)) is None:
                    continue
                for i in range(count.value):
                    ci_info = self._call(pynvml.nvmlComputeInstanceGetInfo, array[i])
                    computes.append(ComputeInstance(int(ci_info.id), int(ci_info.profileId)))
            found.append(GpuInstance(int(info.id), int(info.profileId), int(info.placement.start),
                                     int(info.placement.size), tuple(computes)))
        return sorted(found, key=lambda g: g.gi_id)

    def create_gpu_instance(self, profile_id: int, start: int) -> int:
        placement = pynvml.c_nvmlGpuInstancePlacement_t()
        placement.start = start
        placement.size = self._profiles[profile_id]["placements"]["size"]
        gi = self._call(pynvml.nvmlDeviceCreateGpuInstanceWithPlacement, self._h, profile_id, ctypes.byref(placement))
        return int(self._call(pynvml.nvmlGpuInstanceGetInfo, gi).id)

    def create_compute_instance(self, gi_id: int) -> int:
        slices = self._profiles[self._gi_info(gi_id).profileId]["slice_count"]
        info = self._call(pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, self._gi(gi_id),
                          _FULL_CI_PROFILE_INDEX[slices], pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        return self.create_compute_instance_with_profile(gi_id, int(info.id))

    def create_compute_instance_with_profile(self, gi_id: int, ci_profile_id: int) -> int:
        ci = self._call(pynvml.nvmlGpuInstanceCreateComputeInstance, self._gi(gi_id), ci_profile_id)
        return int(self._call(pynvml.nvmlComputeInstanceGetInfo, ci).id)

    def destroy_compute_instance(self, gi_id: int, ci_id: int) -> None:
        ci = self._call(pynvml.nvmlGpuInstanceGetComputeInstanceById, self._gi(gi_id), ci_id)
        self._call(pynvml.nvmlComputeInstanceDestroy, ci)

    def destroy_gpu_instance(self, gi_id: int) -> None:
        self._call(pynvml.nvmlGpuInstanceDestroy, self._gi(gi_id))

    def _gi(self, gi_id: int):
        return self._call(pynvml.nvmlDeviceGetGpuInstanceById, self._h, gi_id)

    def _gi_info(self, gi_id: int):
        return self._call(pynvml.nvmlGpuInstanceGetInfo, self._gi(gi_id))

    def _mig_devices(self) -> list:
        devices = []
        for index in range(self._call(pynvml.nvmlDeviceGetMaxMigDeviceCount, self._h)):
            device = _try(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, self._h, index)  # sparse: gaps are normal
            if device is not None:
                devices.append(device)
        return devices

    def device_uuid(self, gi_id: int) -> str:
        from .mig.state import MigBackendError

        for device in self._mig_devices():
            if _try(pynvml.nvmlDeviceGetGpuInstanceId, device) == gi_id:
                return _text(pynvml.nvmlDeviceGetUUID(device))
        raise MigBackendError("not_found", f"no MIG device for GPU instance {gi_id}")

    def processes(self) -> list[int]:
        pids = set()
        for device in [self._h] + self._mig_devices():
            for query in (pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetMPSComputeRunningProcesses):
                pids.update(int(p.pid) for p in (_try(query, device, default=[]) or []))
        return sorted(pids)
