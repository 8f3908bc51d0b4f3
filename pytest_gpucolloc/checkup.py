"""``pytest-gpucolloc check``: what on this machine would make a benchmark's numbers unsteady, looked at before it
runs; each finding with what to do. It only reads (NVML through ``nvml.py``, /sys, /proc): it changes no setting.

Severities: ``unsteady`` (numbers vary, or are not comparable with earlier runs, because of it: the command exits
1), ``note`` (worth knowing, does not disturb a measurement by itself), ``ok`` (looked at, nothing found)."""
from __future__ import annotations

import collections
import contextlib
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from . import nvml

UNSTEADY, NOTE, OK = "unsteady", "note", "ok"
BUSY_LOAD = 0.5  # 1-minute load average per core above which other work competes with the workers
MPS_PROGRAMS = ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server")


@dataclass(frozen=True)
class Finding:
    severity: str
    check: str
    finding: str
    fix: str = ""


def cpu_governors(cpu_root: Path = Path("/sys/devices/system/cpu")) -> list[Finding]:
    governors: collections.Counter[str] = collections.Counter()
    for path in sorted(cpu_root.glob("cpu[0-9]*/cpufreq/scaling_governor")):
        with contextlib.suppress(OSError):
            governors[path.read_text().strip()] += 1
    if not governors:
        return [Finding(NOTE, "CPU governor", "not exposed here (no cpufreq: a VM or a container); the host decides")]
    total = sum(governors.values())
    slow = {name: n for name, n in governors.items() if name != "performance"}
    if not slow:
        return [Finding(OK, "CPU governor", f"performance on all {total} cores")]
    said = ", ".join(f"{name} on {n} of {total} cores" for name, n in sorted(slow.items()))
    return [Finding(UNSTEADY, "CPU governor", f"{said}: core clocks follow the load, so launch-bound jobs and "
                    "start-up vary from run to run", "sudo cpupower frequency-set -g performance")]


def cpu_load(load: float | None = None, cores: int | None = None) -> list[Finding]:
    load = os.getloadavg()[0] if load is None else load
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    if load > BUSY_LOAD * cores:
        return [Finding(UNSTEADY, "CPU load", f"{load:.1f} runnable processes on average over the last minute on "
                        f"{cores} cores: other work competes with the workers for the CPU",
                        "wait until the machine is idle, or stop the other work")]
    return [Finding(OK, "CPU load", f"{load:.1f} on {cores} cores (1-minute average)")]


def mps_daemons(proc_root: Path = Path("/proc")) -> list[Finding]:
    found = []
    for comm in proc_root.glob("[0-9]*/comm"):
        with contextlib.suppress(OSError):  # it ended meanwhile
            if (name := comm.read_text().strip()) in MPS_PROGRAMS:
                found.append(f"{name} (pid {comm.parent.name})")
    if not found:
        return [Finding(OK, "MPS daemons", "none running")]
    return [Finding(UNSTEADY, "MPS daemons", f"running: {', '.join(sorted(found))}; processes that see its pipe "
                    "directory share the GPU through it, and this plugin's mps modes skip while another daemon "
                    "serves the GPU", "stop it as its owner: echo quit | nvidia-cuda-mps-control")]


def gpu(index: int, name: str, facts: dict, own_pids: Collection[int] = frozenset()) -> list[Finding]:
    """Findings on one GPU from ``nvml.steadiness``'s facts."""
    where = f"GPU {index} ({name})"
    found = []
    if facts.get("persistence_mode") == 0:
        found.append(Finding(UNSTEADY, f"{where} persistence", "persistence mode off: the driver sets the GPU up "
                             "again for each first process, so start-up times vary",
                             f"sudo nvidia-smi -i {index} -pm 1"))
    elif facts.get("persistence_mode") == 1:
        found.append(Finding(OK, f"{where} persistence", "persistence mode on"))
    limit, default = facts.get("power_limit_w"), facts.get("default_power_limit_w")
    if limit and default and limit < 0.98 * default:
        found.append(Finding(UNSTEADY, f"{where} power limit", f"{limit:.0f} W, below its default {default:.0f} W: "
                             "GPU-bound jobs run slower than on a default GPU and are not comparable with runs "
                             "at the default", f"sudo nvidia-smi -i {index} -pl {default:.0f}, or compare only runs "
                             "at this limit"))
    elif limit:
        found.append(Finding(OK, f"{where} power limit", f"{limit:.0f} W (default {default or limit:.0f} W)"))
    app, app_default, top = (facts.get(k) for k in ("application_sm_clock_mhz", "default_application_sm_clock_mhz",
                                                     "max_sm_clock_mhz"))
    if app and app_default and app != app_default:
        found.append(Finding(UNSTEADY, f"{where} clocks", f"application SM clock {app} MHz, not its default "
                             f"{app_default} MHz (max {top or '?'} MHz): runs are not comparable with runs at the "
                             "default", f"sudo nvidia-smi -i {index} -rac"))
    elif app:
        found.append(Finding(OK, f"{where} clocks", f"application SM clock {app} MHz (max {top or '?'} MHz)"))
    others = {pid: p for pid, p in (facts.get("processes") or {}).items() if pid not in own_pids}
    if others:
        listed = ", ".join(f"{pid} ({p.get('name') or '?'}"
                           + (f", {p['memory_bytes'] / 2**30:.1f} GiB" if p.get("memory_bytes") else "") + ")"
                           for pid, p in sorted(others.items()))
        found.append(Finding(UNSTEADY, f"{where} processes", f"other processes use it: {listed}; they take GPU "
                             "time from the workers", "wait for them to end, or choose another GPU (--colloc-gpu)"))
    else:
        found.append(Finding(OK, f"{where} processes", "no other process uses it"))
    mig, pending = facts.get("mig_mode"), facts.get("mig_pending")
    if mig is not None and pending is not None and mig != pending:
        found.append(Finding(UNSTEADY, f"{where} MIG", f"MIG mode {'on' if mig else 'off'} with a change to "
                             f"{'on' if pending else 'off'} pending a GPU reset",
                             f"sudo nvidia-smi -i {index} -r (with no process on the GPU)"))
    elif mig == 1:
        found.append(Finding(NOTE, f"{where} MIG", "MIG mode on: only the mig mode runs here (no whole GPU for "
                             "naive, mps or the jobs alone, so no speedups)",
                             f"--gpu-mode=mig, or sudo nvidia-smi -i {index} -mig 0 for the other modes"))
    return found


def gpus() -> list[Finding]:
    reason = nvml.init()
    if reason:
        return [Finding(NOTE, "GPU", f"no NVIDIA GPU to look at ({reason}): the CPU side only")]
    listed = nvml.gpus()
    if not listed:
        return [Finding(NOTE, "GPU", "NVML sees no GPU: the CPU side only")]
    return [found for info in listed for found in gpu(info.index, info.name, nvml.steadiness(info.uuid), {os.getpid()})]


def check() -> list[Finding]:
    """Everything, GPU side first."""
    return gpus() + mps_daemons() + cpu_governors() + cpu_load()
