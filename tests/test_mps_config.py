"""MPS configuration errors surface before any daemon or worker starts (no GPU needed)."""
from pathlib import Path

import pytest

from pytest_gpucolloc import mps_daemon as mps
from pytest_gpucolloc.modes.base import ModeConfigError, ModeOptions, Target
from pytest_gpucolloc.modes.mps import MpsMode, PartitionedMpsMode
from pytest_gpucolloc.nvml import GpuInfo
from pytest_gpucolloc.workloads import Workload

GPU = GpuInfo(0, "GPU-00000000-0000-0000-0000-000000000000", "NVIDIA H200", 141 * 2**30, 0, (9, 0), {"sm_count": 132})


def target(tmp_path=Path("/tmp/gc-x"), **options):
    return Target("cuda", GPU, tmp_path, ModeOptions(**options))


def test_default_partition_is_kubernetes_equal_shares():
    limits = PartitionedMpsMode().limits([Workload("resnet26")] * 4, target())
    assert [limit["sm_percent"] for limit in limits] == [25] * 4
    assert {limit["memory_limit_mb"] for limit in limits} == {141 * 1024 // 4}


def test_explicit_shares_stay_and_the_rest_split_the_remainder():
    jobs = [Workload("resnet152", sm_percent=60), Workload("resnet26"), Workload("resnet26")]
    assert [limit["sm_percent"] for limit in PartitionedMpsMode().limits(jobs, target())] == [60, 20, 20]


def test_shares_above_100_percent_need_an_explicit_opt_in():
    jobs = [Workload("resnet26", sm_percent=70), Workload("resnet26", sm_percent=50)]
    with pytest.raises(ModeConfigError, match="add up to 120"):
        PartitionedMpsMode().validate(jobs, target())
    assert [limit["sm_percent"] for limit in PartitionedMpsMode().limits(jobs, target(mps_oversubscribe=True))] == [70, 50]


def test_memory_caps_above_the_gpu_are_rejected():
    jobs = [Workload("resnet26", memory_limit_mb=100_000), Workload("resnet26", memory_limit_mb=100_000)]
    with pytest.raises(ModeConfigError, match="memory_limit_mb"):
        PartitionedMpsMode().validate(jobs, target())


def test_more_than_48_clients_is_refused():
    with pytest.raises(ModeConfigError, match="48 clients"):
        MpsMode().validate([Workload("resnet26")] * 49, target())


def test_pipe_path_too_long_for_a_unix_socket(tmp_path):
    deep = tmp_path / ("x" * 90)
    with pytest.raises(mps.MpsError, match="too long for a Unix socket"):
        MpsMode().validate([Workload("resnet26")], target(deep))


def test_missing_control_binary_is_a_skip_reason(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert "not on PATH" in MpsMode().unavailable_reason(target())
    with pytest.raises(mps.MpsError, match="not on PATH"):
        mps.MpsDaemon(Path("/tmp/gc-none"), GPU.uuid).start()


def test_daemon_refuses_a_directory_owned_by_someone_else(tmp_path, monkeypatch):
    root = tmp_path / "m"
    root.mkdir()
    monkeypatch.setattr(mps, "control_binary", lambda: "/bin/true")
    monkeypatch.setattr(mps.os, "getuid", lambda: 12345)
    with pytest.raises(mps.MpsError, match="belongs to another user"):
        mps.MpsDaemon(root, GPU.uuid).start()


def test_cpu_target_explains_why_mps_cannot_run():
    assert "needs an NVIDIA GPU" in MpsMode().unavailable_reason(Target("cpu", None, Path("/tmp")))
