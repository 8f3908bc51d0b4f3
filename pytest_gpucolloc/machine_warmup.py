"""A machine warm-up: before the first measurement of a session on a GPU, a GPU load runs in a worker process
until the GPU's power and SM clock have stopped moving, at most a bounded time.

Why: the first one or two runs on a freshly started H200 read ~3% low, power-capped for 48-56% of their window
where later runs were capped for 88-100% (docs/gate.md): the GPU had not reached its working temperature and
power. The load is a bf16 matrix multiply in its own process (the pytest process never initialises CUDA); the
pytest process only samples NVML. On the CPU there is nothing to warm.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from . import nvml

DEFAULT_LIMIT_S = 60.0
MAX_LIMIT_S = 600.0
INTERVAL_S = 0.5
WINDOW_S = 5.0  # steady: the mean power and SM clock of the last window ...
TOLERANCE = 0.01  # ... within 1% of the window before's
BUSY_PCT = 50  # samples count once the load runs: an idle GPU's flat power while the load starts is not steady
LOAD_GRACE_S = 30.0  # the load ends itself this long after the limit, should its parent be gone


@dataclass(frozen=True)
class WarmUp:
    seconds: float
    steady: bool
    power_w: float | None = None  # the last window's means
    sm_clock_mhz: float | None = None
    problem: str | None = None  # why the load could not run, if it could not

    def describe(self) -> str:
        if self.problem:
            return f"machine warm-up: none ({self.problem})"
        levels = (f"power {self.power_w:.0f} W, SM clock {self.sm_clock_mhz:,.0f} MHz"
                  if self.power_w is not None and self.sm_clock_mhz is not None else "power and SM clock")
        if self.steady:
            return f"machine warm-up: {self.seconds:.0f} s of GPU load until steady ({levels})"
        return (f"machine warm-up: stopped at its {self.seconds:.0f} s limit before power and clock were steady "
                f"({levels})")


def _window_means(samples: list[dict], start: float, end: float) -> tuple[float, float] | None:
    inside = [s for s in samples if start <= s["t"] < end and s.get("power_w") is not None
              and s.get("sm_clock_mhz") is not None]
    if len(inside) < 2:
        return None
    return statistics.fmean(s["power_w"] for s in inside), statistics.fmean(s["sm_clock_mhz"] for s in inside)


def steady(samples: list[dict], window_s: float = WINDOW_S, tolerance: float = TOLERANCE) -> bool:
    """Whether power and SM clock have stopped moving: over the last ``window_s`` their means lie within
    ``tolerance`` of the window before's. ``samples``: {"t" (s), "power_w", "sm_clock_mhz"}, oldest first."""
    if not samples or samples[-1]["t"] - samples[0]["t"] < 2 * window_s - 1e-9:  # two whole windows
        return False
    now = samples[-1]["t"]
    last, before = _window_means(samples, now - window_s, now + 1e-9), _window_means(samples, now - 2 * window_s,
                                                                                      now - window_s)
    if last is None or before is None:
        return False
    return all(abs(a - b) <= tolerance * max(abs(b), 1e-9) for a, b in zip(last, before))


LOAD = """
import sys, time
import torch
end = time.monotonic() + float(sys.argv[1])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
while time.monotonic() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
"""


def start_load(gpu_uuid: str, limit_s: float) -> subprocess.Popen:
    """The GPU load, in a fresh interpreter that sees only this GPU and ends by itself after the limit."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu_uuid)
    return subprocess.Popen([sys.executable, "-c", LOAD, str(limit_s + LOAD_GRACE_S)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _read(gpu_uuid: str) -> dict:
    reading = nvml.instant_sample(gpu_uuid)
    power, busy = reading.get("power_mw"), reading.get("utilization_gpu_pct")
    return {"power_w": None if power is None else power / 1000, "sm_clock_mhz": reading.get("sm_clock_mhz"),
            "busy": busy is None or busy >= BUSY_PCT}


def run(gpu_uuid: str, limit_s: float = DEFAULT_LIMIT_S, *, load: Callable = start_load, read: Callable = _read,
        clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> WarmUp:
    """Load the GPU and sample it until steady or ``limit_s``; the load process is always ended and reaped."""
    process = load(gpu_uuid, limit_s)
    began = clock()
    samples: list[dict] = []
    try:
        while True:
            elapsed = clock() - began
            if process.poll() is not None:  # the load failed (e.g. MIG mode: no whole GPU to load)
                error = (process.stderr.read() if process.stderr else "") or ""
                last = error.strip().splitlines()[-1:] or [f"exit code {process.returncode}"]
                return WarmUp(elapsed, False, problem=f"the GPU load ended early: {last[0][:200]}")
            reading = read(gpu_uuid)
            if reading.pop("busy", True):
                samples.append({"t": elapsed, **reading})
            done = steady(samples)
            if done or elapsed >= limit_s:
                means = _window_means(samples, elapsed - WINDOW_S, elapsed + 1e-9) or (None, None)
                return WarmUp(elapsed, done, *means)
            sleep(INTERVAL_S)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stderr:
            process.stderr.close()
