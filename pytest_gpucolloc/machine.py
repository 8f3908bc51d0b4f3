"""Which GPU and software stack produced a run, and what changed between two runs, in words."""
from __future__ import annotations

import functools
import importlib.metadata
import json
import platform
import socket
import subprocess
import sys
from typing import Any

from . import nvml
from .environment import base_environment

try:  # the installed distribution's version (pyproject.toml), the one number to bump
    PLUGIN_VERSION = importlib.metadata.version("pytest-gpucolloc")
except importlib.metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    PLUGIN_VERSION = "0+unknown"

# (key in machine_info["gpucolloc"], words used when it changes)
DESCRIBED = [
    ("gpu_name", "GPU"), ("gpu_uuid", "physical GPU"), ("gpu_count", "GPU count"), ("driver_version", "driver"),
    ("cuda_driver_version", "CUDA driver"), ("cuda_runtime", "CUDA runtime (torch)"), ("cudnn", "cuDNN"),
    ("torch", "torch"), ("torchvision", "torchvision"), ("mig_mode", "MIG mode"),
    ("persistence_mode", "persistence mode"), ("ecc_mode", "ECC"), ("power_limit_w", "power limit (W)"),
    ("max_sm_clock_mhz", "max SM clock (MHz)"), ("application_sm_clock_mhz", "application SM clock (MHz)"),
    ("plugin_version", "pytest-gpucolloc"), ("device", "device"),
]


# The GPU configuration that bounds performance: runs made under another one are not comparable.
BOUNDING = ("power_limit_w", "application_sm_clock_mhz", "max_sm_clock_mhz", "mig_mode", "ecc_mode")


def bounding_differences(baseline: dict, current: dict) -> list[str]:
    """What differs in the configuration that bounds performance, e.g. ``power limit (W) 700 -> 600``."""
    return differences({k: v for k, v in baseline.items() if k in BOUNDING},
                       {k: v for k, v in current.items() if k in BOUNDING})


def identity(gpu: nvml.GpuInfo | None, worker_report: dict | None) -> dict[str, Any]:
    """machine_info["gpucolloc"] for a run; ``worker_report`` is a worker's ready message (torch's view)."""
    info: dict[str, Any] = {"plugin_version": PLUGIN_VERSION, "hostname": socket.gethostname(),
                            "python": platform.python_version(), "device": "cuda" if gpu else "cpu"}
    if gpu is not None:
        info.update(gpu_name=gpu.name, gpu_uuid=gpu.uuid, gpu_index=gpu.index,
                    gpu_memory_total_bytes=gpu.memory_total_bytes, mig_mode=gpu.mig_mode,
                    compute_capability=list(gpu.compute_capability) if gpu.compute_capability else None,
                    **gpu.extra)
        info.update(gpu_count=nvml.device_count(), **nvml.driver())
    for package in ("torch", "torchvision"):  # without importing them: the pytest process stays light
        try:
            info[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            info[package] = None
    # torch's own view: from a worker once a scenario has run, else asked of a short-lived python, so that a
    # run's identity has the same keys at the start (--benchmark-compare) as when it is saved
    view = worker_report or torch_view(gpu is not None)
    return info | {"cuda_runtime": view.get("cuda_runtime"), "cudnn": view.get("cudnn")}


@functools.cache
def torch_view(cuda: bool) -> dict:
    """torch's CUDA runtime and cuDNN versions as a worker reports them, read in a short-lived process set up
    as a worker's (the pytest process does not import torch)."""
    code = ("import json, torch; from pytest_gpucolloc.worker import stack_versions; "
            f"print(json.dumps(stack_versions(torch, {cuda})))")
    try:
        done = subprocess.run([sys.executable, "-c", code], env=base_environment(), capture_output=True, text=True,
                              timeout=120)
        return json.loads(done.stdout) if done.returncode == 0 else {}
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return {}


def differences(saved: dict, current: dict) -> list[str]:
    """What changed, e.g. ``driver 570.86 -> 580.159``; a key only one side recorded is not a change."""
    return [f"{words} {_show(saved[key])} -> {_show(current[key])}" for key, words in DESCRIBED
            if key in saved and key in current and saved[key] != current[key]]


def _show(value: Any) -> str:
    return "(unknown)" if value is None else str(value)
