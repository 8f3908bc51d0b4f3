"""Where scenarios run: which GPU (or the CPU smoke mode), chosen once per session, and the ``Target`` a
scenario gets for it."""
from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass

from . import nvml
from .modes.base import ModeOptions, Target
from .scratch import private_scratch


class DeviceUnavailable(RuntimeError):
    pass


@dataclass
class DeviceChoice:
    device: str  # "cuda" or "cpu"
    gpu: nvml.GpuInfo | None
    reason: str  # why this device (shown in the header and summary)

    @property
    def key(self) -> str:
        """What the session's alone baselines are kept per: the GPU's UUID, or "cpu"."""
        return self.gpu.uuid if self.gpu else "cpu"


def detect(device: str, selector: str | int) -> DeviceChoice:
    if device == "cpu":
        return DeviceChoice("cpu", None, "CPU smoke mode (--colloc-device=cpu)")
    reason = nvml.init()
    gpus = [] if reason else nvml.gpus()
    if not gpus:
        why = reason or "NVML sees no GPU"
        if device == "cuda":
            raise DeviceUnavailable(f"--colloc-device=cuda but no GPU is usable: {why}")
        return DeviceChoice("cpu", None, f"CPU smoke mode: no CUDA GPU ({why})")
    gpu = nvml.find_gpu(selector, gpus)
    if gpu is None:
        raise DeviceUnavailable(f"--colloc-gpu={selector} matches no GPU; present: {nvml.describe_gpus(gpus)}")
    return DeviceChoice("cuda", gpu, f"GPU {gpu.index}: {gpu.name} ({gpu.uuid})")


def selected_gpus(spec: list[str | int] | None) -> list[nvml.GpuInfo]:
    """The GPUs named by --colloc-gpus (all of them when not given); empty without NVML."""
    if nvml.init():
        return []
    gpus = nvml.gpus()
    if not spec:
        return gpus
    chosen = []
    for item in spec:
        match = nvml.find_gpu(item, gpus)
        if match is None:
            raise ValueError(f"--colloc-gpus names {item!r}, which matches no GPU; present: {nvml.describe_gpus(gpus)}")
        chosen.append(match)
    return chosen


def make_target(choice: DeviceChoice, options: ModeOptions = ModeOptions(), mig_backend=None) -> Target:
    """A scenario's target with a new private scratch directory (the caller removes it: ``release``)."""
    return Target(choice.device, choice.gpu, private_scratch(), options, mig_backend)


def release(target: Target) -> None:
    shutil.rmtree(target.scratch, ignore_errors=True)


@contextlib.contextmanager
def standalone_target(device: str = "cuda", gpu: str | int = 0, options: ModeOptions = ModeOptions(),
                      mig_backend=None):
    """A Target outside pytest (scripts, GPU-tier tests); its scratch directory is removed afterwards."""
    target = make_target(detect(device, gpu), options, mig_backend)
    try:
        yield target
    finally:
        release(target)
