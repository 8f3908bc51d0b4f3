"""The plugin is a guest in every pytest session of its environment: it acts only where a test (or an option)
invites it. Another project's tests, with markers named like ours used to be, run exactly as without it."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_gpucolloc import plugin
from pytest_gpucolloc.scratch import OWNER_FILE, scratch_base

OTHER_PROJECT = '''
import signal
import pytest

@pytest.mark.gpu
def test_b_marked_gpu_in_another_project():
    pass

@pytest.mark.quick
@pytest.mark.parametrize("gpu_mode_like", ["mps", "sequential"])
def test_a_ordered_as_written(gpu_mode_like):
    pass

def test_c_signal_handlers_are_pytests_own():
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

def test_d_benchmark(benchmark):
    benchmark(sum, range(10))
'''


@pytest.fixture
def stale_scratch():
    """A scratch directory as a killed run of this plugin leaves it (its owner process is gone)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = Path(scratch_base(), f"gc-guest-test-{os.getpid()}")
    path.mkdir()
    (path / OWNER_FILE).write_text(str(dead.pid))
    yield path
    if path.exists():
        (path / OWNER_FILE).unlink()
        path.rmdir()


@pytest.mark.alone  # another session of the plugin, beside it, would clean the stale scratch directory up
def test_another_project_sees_nothing_of_the_plugin(pytester, stale_scratch, tmp_path):
    pytester.makeini("[pytest]\nmarkers =\n    gpu: needs a GPU\n    quick: fast tests\n")
    pytester.makepyfile(test_other=OTHER_PROJECT)
    out = tmp_path / "bench.json"
    result = pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider", f"--benchmark-json={out}")
    result.assert_outcomes(passed=5)  # its own "gpu" marker skips nothing
    text = result.stdout.str() + result.stderr.str()
    assert "gpucolloc" not in re.sub(r"gpucolloc-[\d.]+", "", text)  # past the plugin list: no header, summary...
    order = [line.split("::")[1].split(" ")[0] for line in result.stdout.lines if "::test_" in line and "PASSED" in line]
    assert order == ["test_b_marked_gpu_in_another_project", "test_a_ordered_as_written[mps]",
                     "test_a_ordered_as_written[sequential]", "test_c_signal_handlers_are_pytests_own",
                     "test_d_benchmark"]  # not re-sorted
    assert stale_scratch.exists()  # no clean-up of what is not this session's business
    assert "gpucolloc" not in json.loads(out.read_text())["machine_info"]  # no identity added to its benchmarks


def test_a_test_using_the_plugin_invites_it(pytester, stale_scratch):
    pytester.makepyfile(test_ours='''
import pytest

@pytest.mark.gpucolloc_gpu
def test_needs_a_gpu():
    pass
''')
    result = pytester.runpytest_subprocess("-rs", "-p", "no:cacheprovider", "--colloc-device=cpu")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs an NVIDIA GPU*"])
    assert not stale_scratch.exists()  # invited: it cleans up after killed runs of its own


def test_xdist_auto_is_not_answered_for_another_project(pytester):
    config = pytester.parseconfigure()
    assert plugin.pytest_xdist_auto_num_workers(config) is None


def test_xdist_auto_is_the_gpu_count_whatever_order_the_plugins_were_installed_in(pytester, monkeypatch):
    """xdist asks every plugin's pytest_xdist_auto_num_workers and takes the first answer; its own is the CPU count.
    Ours must be asked first (found on an H200: -n auto became -n 16 on one GPU, a usage error)."""
    monkeypatch.setattr(plugin, "selected_gpus", lambda spec: ["gpu0", "gpu1"])
    config = pytester.parseconfig("-n", "auto", "--gpu-mode=naive")


    class CpuCount:  # answers as xdist's own hook does, installed after ours: pluggy would ask it first
        @pytest.hookimpl
        def pytest_xdist_auto_num_workers(self, config):
            return int(os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or 16)

    config.pluginmanager.register(CpuCount())
    assert config.hook.pytest_xdist_auto_num_workers(config=config) == 2
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")  # the user's own count stands
    assert config.hook.pytest_xdist_auto_num_workers(config=config) == 3


def test_the_full_matrix_is_deselected_unless_asked_for_with_its_expected_time(pytester):
    pytester.makepyfile(test_scenarios='''
import pytest
from pytest_gpucolloc import Workload

def test_default(collocate):
    collocate([Workload("resnet26-cifar10", batch_size=4)])

@pytest.mark.gpucolloc_full
@pytest.mark.parametrize("n", [1, 2])
def test_matrix(collocate, n):
    collocate([Workload("resnet26-cifar10", batch_size=4)] * n)
''')
    default = pytester.runpytest("--collect-only", "-q", "--gpu-mode=naive,mps", "--colloc-device=cpu")
    default.stdout.fnmatch_lines(["*test_default?cpu-naive?*", "*2/6 tests collected (4 deselected)*"])
    default.stdout.fnmatch_lines(["gpucolloc: 2 scenarios, at most about * s (* s each *)*",
                                  "gpucolloc: 4 scenarios of the full matrix (marker gpucolloc_full) deselected; "
                                  "--colloc-full runs them"])
    full = pytester.runpytest("--collect-only", "-q", "--gpu-mode=naive,mps", "--colloc-device=cpu", "--colloc-full")
    full.stdout.fnmatch_lines(["*test_matrix?cpu-mps-2?*"])
    full.stdout.fnmatch_lines(["gpucolloc: 6 scenarios*"])
    assert "deselected" not in full.stdout.str()


def test_tests_of_the_full_matrix_named_one_by_one_are_not_deselected(pytester):
    pytester.makepyfile(test_scenarios='''
import pytest
from pytest_gpucolloc import Workload

@pytest.mark.gpucolloc_full
@pytest.mark.parametrize("n", [1, 2])
def test_matrix(collocate, n):
    collocate([Workload("resnet26-cifar10", batch_size=4)] * n)
''')
    result = pytester.runpytest("--collect-only", "-q", "--gpu-mode=naive", "--colloc-device=cpu",
                                "test_scenarios.py::test_matrix[cpu-naive-2]")
    result.stdout.fnmatch_lines(["*test_matrix?cpu-naive-2?*", "1 test collected*"])
    by_marker = pytester.runpytest("--collect-only", "-q", "--gpu-mode=naive", "--colloc-device=cpu", "-m", "gpucolloc_full")
    by_marker.stdout.fnmatch_lines(["2 tests collected*"])
