"""GPU telemetry over a scenario's measurement window, sampled from the controller through NVML.

Sampling stays in the pytest process (NVML needs no CUDA context). The arithmetic is in plain functions
so it is tested without a GPU; ``Sampler`` only gathers readings.
"""
from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence

from . import nvml
from .mps_daemon import _proc_name

INSTANT_INTERVAL_S = 0.2
PROCESS_INTERVAL_S = 1.0
# A run is not comparable when an abnormal condition held for at least this share of the window. On the H200 a
# limit bit blinked in 1-2 samples of runs whose SM clock stayed at its maximum and whose throughput matched
# the other runs to 0.1%: a blink is recorded, not a reason to discard the run.
THROTTLED_SHARE = 0.1
# Reasons that mean the clock was cut abnormally. The power cap (sw_power_cap) is not one of them: NVIDIA
# documents it as clocks "optimized to ensure not to exceed currently set power limits", the normal state of a
# GPU-bound job; on two H200s the same job ran at the same throughput with and without it. It is recorded.
ABNORMAL_REASONS = ("hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")
# As nvbench judges a sample: an SM clock below this share of the GPU's maximum is throttled, whatever the
# reason bits say (samples where the GPU lowered its clock for lack of work do not count).
CLOCK_FLOOR = 0.75


def decode_throttle(bits: int | None) -> list[str]:
    """Names of the clock-event reasons set in ``bits`` (power cap, thermal, ...)."""
    return [name for bit, name in nvml.THROTTLE_REASONS.items() if (bits or 0) & bit]


def energy_joules(first_mj: int | None, last_mj: int | None) -> float | None:
    """Energy between two readings of NVML's total-energy counter (millijoules since driver load)."""
    if first_mj is None or last_mj is None or last_mj < first_mj:
        return None
    return (last_mj - first_mj) / 1000.0


def _clock_below_floor(instant: Sequence[dict], max_sm_clock_mhz: float | None) -> float | None:
    """Share of busy samples whose SM clock was below CLOCK_FLOOR of the maximum."""
    if not max_sm_clock_mhz:
        return None
    busy = [s["sm_clock_mhz"] for s in instant if s.get("sm_clock_mhz") is not None
            and not (s.get("clock_event_reasons") or 0) & nvml.GPU_IDLE]
    if not busy:
        return None
    return sum(c < CLOCK_FLOOR * max_sm_clock_mhz for c in busy) / len(busy)


def summarise(instant: Sequence[dict], window_s: float, max_sm_clock_mhz: float | None = None) -> dict:
    """Power, energy, clocks and validity from instant samples taken across the window."""
    result: dict = {"window_s": window_s, "samples": len(instant)}
    energy = energy_joules(instant[0].get("energy_mj"), instant[-1].get("energy_mj")) if instant else None
    span = instant[-1]["t"] - instant[0]["t"] if len(instant) > 1 else 0.0
    if energy is not None and span > 0:
        result.update(energy_j=energy, avg_power_w=energy / span)
    else:
        powers = [s["power_mw"] / 1000 for s in instant if s.get("power_mw") is not None]
        if powers:
            result["avg_power_w"] = statistics.fmean(powers)
        result["energy_unavailable"] = "NVML total-energy counter unsupported; power averaged from readings"
    clocks = [s["sm_clock_mhz"] for s in instant if s.get("sm_clock_mhz") is not None]
    if clocks:
        result.update(sm_clock_mhz_median=statistics.median(clocks), sm_clock_mhz_mean=statistics.fmean(clocks),
                      sm_clock_mhz_min=min(clocks))
    read = [decode_throttle(s["clock_event_reasons"]) for s in instant if s.get("clock_event_reasons") is not None]
    share = {name: sum(name in names for names in read) / len(read) for name in sorted({n for r in read for n in r})}
    below = _clock_below_floor(instant, max_sm_clock_mhz)
    why = throttled_why(share, below, max_sm_clock_mhz)
    return result | {"throttle_reasons": sorted(share), "throttle_share": share,
                     "power_capped_share": share.get("sw_power_cap", 0.0) if read else None,
                     "clock_below_floor_share": below, "max_sm_clock_mhz": max_sm_clock_mhz, "throttled_why": why,
                     "throttled": bool(why)}


def throttled_why(share: dict[str, float], below_floor: float | None, max_sm_clock_mhz: float | None) -> list[str]:
    """Why a window is not comparable, in words; empty when it is."""
    why = [f"{name} held {share[name]:.0%} of the window" for name in ABNORMAL_REASONS
           if share.get(name, 0.0) >= THROTTLED_SHARE]
    if below_floor is not None and below_floor >= THROTTLED_SHARE:
        why.append(f"the SM clock was below {CLOCK_FLOOR:.0%} of its {max_sm_clock_mhz:g} MHz maximum for "
                   f"{below_floor:.0%} of the window")
    return why


def fallback_utilisation(instant: Sequence[dict]) -> dict:
    """Older GPUs have no GPM: NVML's coarse utilisation rate (percent of time a kernel ran)."""
    values = [s["utilization_gpu_pct"] for s in instant if s.get("utilization_gpu_pct") is not None]
    return {"gpu_utilization_pct": statistics.fmean(values) if values else "unsupported on this GPU"}


class Sampler:
    """Samples one GPU over [start, end] (time.monotonic) in a background thread."""

    def __init__(self, gpu_uuid: str, window: tuple[float, float], worker_pids: Sequence[int],
                 gpu_instance_ids: Sequence[int] = (), max_sm_clock_mhz: float | None = None):
        self.uuid, self.max_sm_clock_mhz, self.pids = gpu_uuid, max_sm_clock_mhz, list(worker_pids)
        self.instance_ids = list(gpu_instance_ids)  # under MIG: GPM per GPU instance as well
        self.per_instance: dict[int, dict] = {}
        self.start, self.end = window
        self.instant: list[dict] = []
        self.memory: dict[int, int] = {}
        self.gpm: dict = {}
        self.foreign: set[int] = set()
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpucolloc-telemetry", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.end = min(self.end, time.monotonic())  # the measurement may stop before the planned window ends
        self._stop.set()
        self._thread.join(timeout=10)

    def _wait_until(self, instant: float) -> bool:
        return not self._stop.wait(max(0.0, instant - time.monotonic()))

    def _sample(self) -> None:
        self.instant.append({**nvml.instant_sample(self.uuid), "t": time.monotonic()})

    def _sample_memory(self) -> None:
        for pid, info in nvml.gpu_processes(self.uuid).items():
            if pid in self.pids:
                if info["memory_bytes"] is not None:
                    self.memory[pid] = max(self.memory.get(pid, 0), info["memory_bytes"])
            elif not _proc_name(pid).startswith("nvidia-cuda-mps"):  # MPS servers hold the clients' contexts
                self.foreign.add(pid)  # someone else computed on this GPU during the measurement

    def _run(self) -> None:
        first, firsts = None, {}
        try:
            if not self._wait_until(self.start):
                return
            use_gpm = nvml.gpm_supported(self.uuid)
            first = nvml.GpmSample(self.uuid) if use_gpm else None
            firsts = {gi: nvml.GpmSample(self.uuid, gi) for gi in self.instance_ids} if use_gpm else {}
            self._sample()
            next_memory = time.monotonic()
            while (time.monotonic() < self.end
                   and self._wait_until(min(self.end, time.monotonic() + INSTANT_INTERVAL_S))):
                self._sample()
                if time.monotonic() >= next_memory:
                    self._sample_memory()
                    next_memory += PROCESS_INTERVAL_S
            if first is not None:
                self.gpm = self._metrics_since(first, None)
                for gi, start in firsts.items():
                    self.per_instance[gi] = self._metrics_since(start, gi)
        except Exception as exc:  # telemetry must never fail a measurement; say what went wrong
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            for sample in [first, *firsts.values()]:
                if sample is not None:
                    sample.free()

    def _metrics_since(self, start, gpu_instance_id: int | None) -> dict:
        last = nvml.GpmSample(self.uuid, gpu_instance_id)
        try:
            return nvml.gpm_metrics(start, last)
        finally:
            last.free()

    def summary(self) -> dict:
        result = summarise(self.instant, self.end - self.start, self.max_sm_clock_mhz)
        result.update(self.gpm or fallback_utilisation(self.instant),
                      metrics_source="nvml-gpm" if self.gpm else "nvml-utilization-rates",
                      memory_bytes_by_pid={str(pid): mem for pid, mem in self.memory.items()},
                      foreign_pids=sorted(self.foreign))
        if self.per_instance:
            result["per_gpu_instance"] = {str(gi): values for gi, values in self.per_instance.items()}
        if self.error:
            result["error"] = self.error
        return result


def sampler_factory(gpu: nvml.GpuInfo):
    """What ``scenario.run_phase`` calls with (window, worker pids, the phase's slots)."""
    def make(window, pids, slots=()):
        instances = [s.mode_facts["gpu_instance_id"] for s in slots if "gpu_instance_id" in s.mode_facts]
        return Sampler(gpu.uuid, window, pids, instances, gpu.extra.get("max_sm_clock_mhz"))

    return make
