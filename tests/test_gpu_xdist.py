"""GPU tier on a host with 2+ GPUs: pytest -n 2 gives each xdist worker one GPU of its own.

Checked from inside (the GPU each training process saw) and from outside (NVML's process list of each
GPU, polled by this test while the run goes on), with one private MPS daemon per GPU, and nothing left
on either GPU afterwards.
"""
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pytest_gpucolloc import nvml
from test_gpu_mps import our_mps_processes

pytestmark = pytest.mark.gpucolloc_gpu

SCENARIOS = """
import pytest
from pytest_gpucolloc import Workload

@pytest.mark.parametrize("n", [1, 2])
def test_resnet26(collocate, n):
    collocate([Workload("resnet26-cifar10", batch_size=32)] * n)
"""


@pytest.fixture
def two_gpus():
    if nvml.init():
        pytest.skip("no NVML: no GPU on this machine")
    found = nvml.gpus()
    if len(found) < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {len(found)}")
    return found[:2]


def watch_gpus(gpus, stop: threading.Event, seen: dict) -> None:
    """Every 0.2 s: which pids compute on which GPU, and how many private MPS daemons serve at once
    (counted by pipe directory: a command sent to a daemon runs a short-lived process of the same name)."""
    while not stop.is_set():
        for gpu in gpus:
            for pid in nvml.gpu_processes(gpu.uuid):
                seen["pids"].setdefault(pid, set()).add(gpu.uuid)
        pipe_dirs = {info["pipe_dir"] for info in our_mps_processes().values()
                     if info["name"] == "nvidia-cuda-mps-control"}
        seen["max_daemons"] = max(seen["max_daemons"], len(pipe_dirs))
        stop.wait(0.2)


def test_each_xdist_worker_owns_one_gpu_with_its_own_mps_daemon(two_gpus, tmp_path):
    (tmp_path / "test_two.py").write_text(SCENARIOS)
    report = tmp_path / "run.json"
    before_dirs = set(Path("/tmp").glob("gc-*"))
    seen = {"pids": {}, "max_daemons": 0}
    stop = threading.Event()
    watcher = threading.Thread(target=watch_gpus, args=(two_gpus, stop, seen), daemon=True)
    watcher.start()
    try:
        run = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--colloc-gpus=0,1", "--gpu-mode=mps",
                              "--colloc-rounds=4", "--colloc-round-seconds=1", "--colloc-warmup-seconds=2",
                              f"--benchmark-json={report}", "-p", "no:cacheprovider", "-q"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
    finally:
        stop.set()
        watcher.join()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]

    benchmarks = json.loads(report.read_text())["benchmarks"]
    assert sorted(b["name"] for b in benchmarks) == ["test_resnet26[mps-1]", "test_resnet26[mps-2]"]
    uuids = {g.uuid for g in two_gpus}
    worker_pids = {}
    for bench in benchmarks:
        gpu = bench["extra_info"]["gpu"]["uuid"]
        assert gpu in uuids
        for worker in bench["extra_info"]["workers"]:
            # Inside: the training process saw exactly the scenario's GPU, through our MPS daemon.
            assert worker["cuda_visible_devices"] == gpu
            assert "GPU-" + worker["device_uuid_seen"].removeprefix("GPU-") == gpu
            assert worker["mode_facts"]["mps_client_verified"] is True
            worker_pids[worker["pid"]] = gpu
    # xdist hands the two tests to the two workers: one scenario per GPU, at the same time.
    assert {b["extra_info"]["gpu"]["uuid"] for b in benchmarks} == uuids
    assert seen["max_daemons"] == 2
    # Outside: NVML saw each training process on its own GPU only.
    for pid, gpu in worker_pids.items():
        assert seen["pids"].get(pid) == {gpu}, (pid, seen["pids"].get(pid), gpu)

    time.sleep(1)
    for gpu in two_gpus:
        assert not set(nvml.gpu_processes(gpu.uuid)) & set(worker_pids), f"a worker is still on {gpu.uuid}"
    assert our_mps_processes() == {}, "an MPS daemon or server of the run is still alive"
    assert set(Path("/tmp").glob("gc-*")) - before_dirs == set()


def test_more_xdist_workers_than_gpus_is_a_usage_error_before_anything_starts(two_gpus, tmp_path):
    (tmp_path / "test_two.py").write_text(SCENARIOS)
    run = subprocess.run([sys.executable, "-m", "pytest", "-n", "3", "--colloc-gpus=0,1", "--gpu-mode=mps",
                          "-p", "no:cacheprovider", "-q"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-2000:]
    assert "each worker needs a GPU of its own" in run.stdout + run.stderr


def test_n_auto_starts_one_xdist_worker_per_gpu(pytester):
    """xdist asks how many workers -n auto means before pytest_configure; the answer is the GPU count, not
    the CPU count (which would make the run a usage error: more xdist workers than GPUs)."""
    if nvml.init():
        pytest.skip("no NVML: no GPU on this machine")
    count = len(nvml.gpus())
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    # a gpucolloc option invites the plugin (another project's -n auto is not its to answer: tests/test_guest.py)
    result = pytester.runpytest_subprocess("-n", "auto", "--gpu-mode=naive", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stderr.str()
    result.stdout.fnmatch_lines([f"*created: {count}/{count} worker*"])
