"""The machine warm-up: its stopping rule on recorded power and clock series, the load process it always ends,
the option, and what the header says."""
import math
import subprocess
import sys

import pytest

from pytest_gpucolloc import machine_warmup
from pytest_gpucolloc.options import parse_machine_warmup


def series(power, clock, seconds, interval=0.5):
    """Readings of a GPU warming up: ``power(t)`` and ``clock(t)``."""
    return [{"t": i * interval, "power_w": power(i * interval), "sm_clock_mhz": clock(i * interval)}
            for i in range(int(seconds / interval) + 1)]


def first_steady(samples):
    return next((s["t"] for i, s in enumerate(samples) if machine_warmup.steady(samples[:i + 1])), None)


def test_steady_once_power_stops_rising_and_not_before():
    # power approaches the cap as the GPU heats (time constant 8 s); the clock settles as it does
    rising = series(lambda t: 690 - 300 * math.exp(-t / 8), lambda t: 1950 + 30 * math.exp(-t / 8), 60)
    when = first_steady(rising)
    assert when is not None and 20 < when < 45
    at = next(s for s in rising if s["t"] == when)
    assert at["power_w"] > 690 * 0.97  # within a few percent of where it settles


def test_a_flat_series_is_steady_after_two_windows_and_a_climbing_one_never():
    flat = series(lambda t: 690 + (3 if int(t * 2) % 2 else -3), lambda t: 1950.0, 30)
    assert first_steady(flat) == pytest.approx(2 * machine_warmup.WINDOW_S, abs=0.6)
    climbing = series(lambda t: 300 + 10 * t, lambda t: 1950.0, 30)
    assert first_steady(climbing) is None
    assert not machine_warmup.steady([])


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def sleeper(uuid, limit_s):
    """A real process standing in for the GPU load: it must be ended and reaped."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], stderr=subprocess.PIPE, text=True)


def test_run_stops_when_steady_and_ends_its_load_process():
    clock, started = FakeClock(), []

    def load(uuid, limit_s):
        started.append(sleeper(uuid, limit_s))
        return started[-1]

    idle = 8.0  # the load's start-up: the GPU still idle, its flat power must not read as steady

    def read(uuid):
        t = clock.now
        busy = t >= idle
        power = 100.0 if not busy else 690 - 300 * math.exp(-(t - idle) / 5)
        return {"power_w": power, "sm_clock_mhz": 1950.0, "busy": busy}

    done = machine_warmup.run("GPU-x", 60, load=load, read=read, clock=clock, sleep=clock.sleep)
    assert done.steady and idle + 10 < done.seconds < 45 and done.power_w > 660
    assert started[0].poll() is not None  # ended and reaped
    assert "until steady (power 6" in done.describe()


def test_run_stops_at_its_limit_and_says_so():
    clock = FakeClock()
    read = lambda uuid: {"power_w": 300 + 10 * clock.now, "sm_clock_mhz": 1950.0, "busy": True}
    done = machine_warmup.run("GPU-x", 20, load=sleeper, read=read, clock=clock, sleep=clock.sleep)
    assert not done.steady and done.seconds == pytest.approx(20, abs=0.6)
    assert "stopped at its 20 s limit before power and clock were steady" in done.describe()


def test_a_load_that_cannot_run_is_said_and_nothing_is_left_running():
    failing = lambda uuid, limit_s: subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.exit('RuntimeError: no CUDA GPUs are available')"],
        stderr=subprocess.PIPE, text=True)
    clock = FakeClock()

    def read(uuid):
        clock.sleep(0.5)
        return {"power_w": 100.0, "sm_clock_mhz": 400.0, "busy": False}

    done = machine_warmup.run("GPU-x", 60, load=failing, read=read, clock=clock,
                              sleep=lambda s: __import__("time").sleep(0.05))
    assert not done.steady and "no CUDA GPUs are available" in done.describe()


def test_the_option_takes_auto_or_bounded_seconds():
    assert parse_machine_warmup("auto") is None and parse_machine_warmup("0") == 0 and parse_machine_warmup("45") == 45
    for bad in ("-1", "601", "soon"):
        with pytest.raises(ValueError, match="--colloc-machine-warmup"):
            parse_machine_warmup(bad)


def test_the_header_says_there_is_nothing_to_warm_on_the_cpu(pytester):
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest("--colloc-device=cpu", "--colloc-gate", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*gpucolloc: machine warm-up: none on the CPU (nothing to warm)*"])
    bad = pytester.runpytest("--colloc-device=cpu", "--colloc-machine-warmup=later")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--colloc-machine-warmup must be a number*"])
