"""The only module that imports pynvml (package ``nvidia-ml-py``). Everything it returns is plain data.

NVML needs no CUDA context, so the pytest process can ask it questions without initialising CUDA. The MIG
backend (``mig/nvml_backend.py``) receives the module from ``library()``, so tests can hand it a fake NVML.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any

try:
    import pynvml
except ImportError:  # nvidia-ml-py is a dependency, but a broken install must still give a reason
    pynvml = None

GPM_METRICS = {"sm_activity_pct": 2, "sm_occupancy_pct": 3, "tensor_activity_pct": 5, "dram_bw_util_pct": 10}  # ids
GPU_IDLE = 0x1  # clock-event reason: the GPU lowered its clock for lack of work
# clock-event reason bits recorded with a run (telemetry.py decides what they mean)
THROTTLE_REASONS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal",
                    0x80: "hw_power_brake"}


class NvmlUnavailable(RuntimeError):
    pass


def as_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@functools.cache
def init() -> str | None:
    """Initialise NVML once; returns None when usable, else the reason it is not."""
    if pynvml is None:
        return "nvidia-ml-py (module pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return f"NVML is not available ({exc})"
    return None


def _require() -> None:
    reason = init()
    if reason:
        raise NvmlUnavailable(reason)


def try_call(function, *args, default=None):
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


def library():
    """The initialised pynvml module (for ``mig.nvml_backend``)."""
    _require()
    return pynvml


def find_gpu(selector: str | int, gpus: list[GpuInfo]) -> GpuInfo | None:
    """The GPU named by index (``0`` or ``"0"``) or UUID, or None."""
    return next((g for g in gpus if selector in (g.index, str(g.index), g.uuid)), None)


def describe_gpus(gpus: list[GpuInfo]) -> str:
    return ", ".join(f"{g.index} ({g.uuid})" for g in gpus)


def device_count() -> int:
    _require()
    return pynvml.nvmlDeviceGetCount()


def _handle(uuid: str):
    _require()
    return pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())


def gpus() -> list[GpuInfo]:
    """Every GPU the driver sees, with read-only facts used for identity and planning."""
    result = []
    for index in range(device_count()):
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        mig = try_call(pynvml.nvmlDeviceGetMigMode, h)
        clocks = pynvml.NVML_CLOCK_SM
        extra = {
            "persistence_mode": try_call(pynvml.nvmlDeviceGetPersistenceMode, h),
            "ecc_mode": (try_call(pynvml.nvmlDeviceGetEccMode, h) or [None])[0],
            "power_limit_w": (try_call(pynvml.nvmlDeviceGetEnforcedPowerLimit, h) or 0) / 1000 or None,
            "max_sm_clock_mhz": try_call(pynvml.nvmlDeviceGetMaxClockInfo, h, clocks),
            "application_sm_clock_mhz": try_call(pynvml.nvmlDeviceGetApplicationsClock, h, clocks),
            "max_memory_clock_mhz": try_call(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_MEM),
            "sm_count": _full_gpu_sm_count(h)}
        result.append(GpuInfo(index=index, uuid=as_text(pynvml.nvmlDeviceGetUUID(h)),
                              name=as_text(pynvml.nvmlDeviceGetName(h)),
                              memory_total_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                              mig_mode=mig[0] if mig else None,
                              compute_capability=try_call(pynvml.nvmlDeviceGetCudaComputeCapability, h), extra=extra))
    return result


def _full_gpu_sm_count(h) -> int | None:
    """SM count of the whole GPU, from its full-size MIG profile (answers with MIG off too); None without MIG."""
    info = try_call(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, h, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE)
    return int(info.multiprocessorCount) if info else None


def driver() -> dict:
    _require()
    cuda = try_call(pynvml.nvmlSystemGetCudaDriverVersion_v2) or try_call(pynvml.nvmlSystemGetCudaDriverVersion)
    return {
        "driver_version": as_text(pynvml.nvmlSystemGetDriverVersion()),
        "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
        "nvml_version": as_text(try_call(pynvml.nvmlSystemGetNVMLVersion, default="")) or None,
    }


def gpu_processes(uuid: str) -> dict[int, dict]:
    """Processes with a context on the GPU: pid -> {memory_bytes, mps}. MPS clients are listed by
    the MPS query; plain contexts (and the MPS server itself) by the compute query."""
    h = _handle(uuid)
    found: dict[int, dict] = {}
    for query, is_mps in ((pynvml.nvmlDeviceGetComputeRunningProcesses, False),
                          (pynvml.nvmlDeviceGetMPSComputeRunningProcesses, True)):
        for proc in try_call(query, h, default=[]) or []:
            memory = proc.usedGpuMemory if isinstance(proc.usedGpuMemory, int) else None
            found[int(proc.pid)] = {"memory_bytes": memory, "mps": is_mps}
    return found


def steadiness(uuid: str) -> dict:
    """Read-only facts that decide whether measurements on a GPU are steady (``checkup.py``); None: not said."""
    h = _handle(uuid)
    sm = pynvml.NVML_CLOCK_SM
    watts = lambda milliwatts: milliwatts / 1000 if milliwatts else None  # noqa: E731
    limits = try_call(pynvml.nvmlDeviceGetPowerManagementLimitConstraints, h)
    mig = try_call(pynvml.nvmlDeviceGetMigMode, h)
    processes = gpu_processes(uuid)
    for pid, facts in processes.items():
        facts["name"] = as_text(try_call(pynvml.nvmlSystemGetProcessName, pid, default="")) or None
    return {
        "persistence_mode": try_call(pynvml.nvmlDeviceGetPersistenceMode, h),
        "power_limit_w": watts(try_call(pynvml.nvmlDeviceGetEnforcedPowerLimit, h)),
        "default_power_limit_w": watts(try_call(pynvml.nvmlDeviceGetPowerManagementDefaultLimit, h)),
        "max_power_limit_w": watts(limits[1]) if limits else None,
        "application_sm_clock_mhz": try_call(pynvml.nvmlDeviceGetApplicationsClock, h, sm),
        "default_application_sm_clock_mhz": try_call(pynvml.nvmlDeviceGetDefaultApplicationsClock, h, sm),
        "max_sm_clock_mhz": try_call(pynvml.nvmlDeviceGetMaxClockInfo, h, sm),
        "mig_mode": mig[0] if mig else None, "mig_pending": mig[1] if mig else None, "processes": processes}


# --- telemetry -------------------------------------------------------------------------------

def instant_sample(uuid: str) -> dict:
    """Cheap counters read many times a second: energy (mJ), power (mW), SM clock, clock-event bits."""
    h = _handle(uuid)
    return {"energy_mj": try_call(pynvml.nvmlDeviceGetTotalEnergyConsumption, h),
            "power_mw": try_call(pynvml.nvmlDeviceGetPowerUsage, h),
            "sm_clock_mhz": try_call(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM),
            "clock_event_reasons": try_call(pynvml.nvmlDeviceGetCurrentClocksEventReasons, h),
            "utilization_gpu_pct": getattr(try_call(pynvml.nvmlDeviceGetUtilizationRates, h), "gpu", None)}


def gpm_supported(uuid: str) -> bool:
    h = _handle(uuid)
    support = try_call(pynvml.nvmlGpmQueryDeviceSupport, h)
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
    metrics = [request.metrics[i] for i in range(len(GPM_METRICS))]
    return {name: float(m.value) if m.nvmlReturn == pynvml.NVML_SUCCESS else f"unsupported (NVML return {m.nvmlReturn})"
            for name, m in zip(GPM_METRICS, metrics)}
