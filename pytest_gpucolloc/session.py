"""Run-level state: where scenarios run, their settings, baselines measured so far, results."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from . import nvml
from .modes.base import Target
from .options import read_options
from .scenario import ScenarioResult, Settings

# CPU smoke mode: real processes and real training, small enough for a laptop or a CI runner.
CPU_IMAGE_SIZE = 32
CPU_BATCH_CAP = 4


@dataclass
class Placement:
    device: str  # "cuda" or "cpu"
    gpu: nvml.GpuInfo | None
    reason: str  # why this device (shown in the header and summary)


@dataclass
class CollocSession:
    values: dict[str, Any]
    results: list[tuple[str, ScenarioResult]] = field(default_factory=list)
    unfit: list[tuple[str, str]] = field(default_factory=list)  # (test, why its layout does not fit)
    verdicts: list[tuple[str, dict]] = field(default_factory=list)  # (test, gate verdict)
    history: Any = None  # history.History loaded before this run saved anything
    stale_removed: list[str] = field(default_factory=list)
    save_problems: list[str] = field(default_factory=list)  # runs that could not be saved, and where they went
    worker: int | None = None  # xdist worker index: this process owns the worker-th selected GPU
    forward: list[dict] = field(default_factory=list)  # scenarios an xdist worker sends to the controller
    forwarded: list[tuple[str, dict]] = field(default_factory=list)  # what the controller received
    alone: dict[tuple, float] = field(default_factory=dict)  # sequential throughput per job
    ideal: dict[tuple, float] = field(default_factory=dict)
    _placement: Placement | None = None

    @property
    def modes(self) -> list[str]:
        return self.values["gpu_mode"]

    def placement(self) -> Placement:
        if self._placement is None:
            selector = self.values["colloc_gpu"]
            if self.worker is not None and self.values["colloc_device"] != "cpu":
                from .distributed import selected_gpus

                gpus = selected_gpus(self.values["colloc_gpus"])
                if gpus:
                    selector = gpus[self.worker].uuid
            self._placement = detect(self.values["colloc_device"], selector)
            if self.worker is not None:
                self._placement.reason += f" (xdist worker gw{self.worker})"
        return self._placement

    def settings(self, config) -> Settings:
        on_gpu = self.placement().device == "cuda"
        values = read_options(config, on_gpu=on_gpu)
        return Settings(
            rounds=values["colloc_rounds"],
            round_s=values["colloc_round_seconds"],
            warmup_s=values["colloc_warmup_seconds"],
            warmup_steps=values["colloc_warmup_steps"],
            timeout_s=values["colloc_timeout"],
            cpu_policy=values["colloc_cpus"],
            image_size=None if on_gpu else CPU_IMAGE_SIZE,
            batch_cap=None if on_gpu else CPU_BATCH_CAP,
            extra_step_every=values["colloc_extra_step_every"],
        )

    def new_target(self) -> Target:
        return make_target(self.placement(), **{key: self.values[key] for key in (
            "mps_oversubscribe", "mig_layout", "mig_reconfigure", "mig_checkpoint_dir")})

    @staticmethod
    def release(target: Target) -> None:
        shutil.rmtree(target.scratch, ignore_errors=True)

    def device_key(self) -> str:
        placement = self.placement()
        return placement.gpu.uuid if placement.gpu else "cpu"


SCRATCH_PREFIX = "gc-"
OWNER_FILE = "owner.pid"


def scratch_base() -> Path:
    return Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())


def private_scratch() -> Path:
    """A new 0700 directory with a short path (MPS pipe sockets must fit in 108 bytes), marked with the
    pid of the process that owns it so that a later run can tell a killed run's leftovers."""
    path = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=scratch_base()))
    (path / OWNER_FILE).write_text(str(os.getpid()))
    return path


def clean_stale_scratch() -> list[str]:
    """Remove what killed runs of this user left: scratch directories whose owner process is gone,
    after stopping any MPS daemon still serving from them. Returns what was removed."""
    from . import mps

    removed = []
    for path in scratch_base().glob(f"{SCRATCH_PREFIX}*"):
        try:
            if not path.is_dir() or path.stat().st_uid != os.getuid():
                continue
            owner = int((path / OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue  # not ours, or not a scratch directory of this plugin
        if Path(f"/proc/{owner}").exists():
            continue  # its run is still going
        for pid, info in mps.mps_processes().items():
            if info["pipe_dir"] and info["pipe_dir"].startswith(str(path) + "/"):
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
        shutil.rmtree(path, ignore_errors=True)
        removed.append(str(path))
    return removed


@contextlib.contextmanager
def standalone_target(device: str = "cuda", gpu: str | int = 0, **options):
    """A Target outside pytest (scripts, GPU-tier tests); its scratch directory is removed afterwards."""
    target = make_target(detect(device, gpu), **options)
    try:
        yield target
    finally:
        shutil.rmtree(target.scratch, ignore_errors=True)


def make_target(placement: Placement, **options) -> Target:
    sm_count = placement.gpu.extra.get("sm_count") if placement.gpu else None
    return Target(placement.device, placement.gpu, private_scratch(), {"gpu_sm_count": sm_count, **options})


class DeviceUnavailable(RuntimeError):
    pass


def detect(device: str, selector: str | int) -> Placement:
    if device == "cpu":
        return Placement("cpu", None, "CPU smoke mode (--colloc-device=cpu)")
    reason = nvml.init()
    gpus = [] if reason else nvml.gpus()
    if not gpus:
        why = reason or "NVML sees no GPU"
        if device == "cuda":
            raise DeviceUnavailable(f"--colloc-device=cuda but no GPU is usable: {why}")
        return Placement("cpu", None, f"CPU smoke mode: no CUDA GPU ({why})")
    for gpu in gpus:
        if selector in (gpu.index, gpu.uuid):
            return Placement("cuda", gpu, f"GPU {gpu.index}: {gpu.name} ({gpu.uuid})")
    raise DeviceUnavailable(
        f"--colloc-gpu={selector} matches no GPU; present: "
        + ", ".join(f"{g.index} ({g.uuid})" for g in gpus)
    )
