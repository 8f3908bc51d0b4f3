"""GPU tier: the real MPS daemon, real clients, real NVML. Skipped with the reason on machines without a GPU."""
import json
import os
import statistics
import time
from pathlib import Path

import pytest

from pytest_gpucolloc import Workload
from pytest_gpucolloc import mps_daemon as mps
from pytest_gpucolloc.modes.mps import MpsMode, PartitionedMpsMode
from pytest_gpucolloc.modes.naive import NaiveMode
from pytest_gpucolloc.scenario import ScenarioFailed, Settings, run_scenario
from tests.ctrl_c import pytest_command
from tests.processes import environment_has, plugin_processes, worker_processes

pytestmark = pytest.mark.gpucolloc_gpu

SHORT = Settings(rounds=3, round_s=0.5, warmup_s=1.0, warmup_steps=5, timeout_s=180)
SMALL = Workload("resnet26-cifar10", batch_size=32)


def our_mps_processes(scratch: Path | str = "/tmp/gc-") -> dict:
    """MPS daemons and servers serving from under ``scratch`` (default: any of the plugin's directories)."""
    return {pid: info for pid, info in mps.mps_processes().items()
            if info["pipe_dir"] and info["pipe_dir"].startswith(str(scratch))}


def test_daemon_start_stop_is_fast_and_leaves_nothing(target, evidence):
    timings = []
    for i in range(5):
        root = target.scratch / f"d{i}"
        begin = time.perf_counter()
        daemon = mps.MpsDaemon(root, target.gpu.uuid).start()
        started = time.perf_counter()
        assert daemon.daemon_pids(), "the control daemon should be running"
        daemon.stop()
        timings.append({"start_s": started - begin, "stop_s": time.perf_counter() - started})
        assert not root.exists()
    assert our_mps_processes(target.scratch) == {}
    total = [t["start_s"] + t["stop_s"] for t in timings]
    evidence("mps_daemon_timing", {"runs": timings, "median_total_s": statistics.median(total)})
    assert statistics.median(total) < 2.0


def test_mps_workers_are_verified_clients_of_our_daemon(target, tmp_path):
    result = run_scenario([SMALL, SMALL], MpsMode(), target, SHORT, tmp_path)
    assert len(result.workers) == 2
    assert all(w.mode_facts["sm_count_seen"] == target.gpu_sm_count for w in result.workers)
    assert our_mps_processes(target.scratch) == {}, "daemon must be gone after the scenario"


class _OneClientMisdirected(MpsMode):
    """A client whose pipe directory points where no daemon listens: it silently runs without MPS."""

    def provision(self, workloads, target):
        context = super().provision(workloads, target)

        class Wrapper:
            def __enter__(self_inner):
                prov = context.__enter__()
                empty = target.scratch / "elsewhere"
                empty.mkdir()
                prov.phases[0][1].env["CUDA_MPS_PIPE_DIRECTORY"] = str(empty)
                return prov

            def __exit__(self_inner, *exc):
                return context.__exit__(*exc)

        return Wrapper()


def test_client_that_missed_the_daemon_is_detected(target, tmp_path):
    with pytest.raises(ScenarioFailed, match="not clients of this test's MPS daemon"):
        run_scenario([SMALL, SMALL], _OneClientMisdirected(), target, SHORT, tmp_path)
    assert our_mps_processes(target.scratch) == {}


def test_partition_limits_take_effect_in_each_worker(target, tmp_path, evidence):
    result = run_scenario([SMALL, SMALL], PartitionedMpsMode(), target, SHORT, tmp_path)
    total = target.gpu_sm_count
    seen = [w.mode_facts["sm_count_seen"] for w in result.workers]
    evidence("mps_partition_limits", {
        "gpu_sm_count": total,
        "workers": [{k: w.mode_facts.get(k) for k in ("sm_percent", "memory_limit_mb", "sm_count_seen",
                                                   "device_memory_seen_bytes")} for w in result.workers],
    })
    assert all(0 < s <= total // 2 + 1 for s in seen), seen
    assert our_mps_processes(target.scratch) == {}


def test_workload_over_its_memory_cap_does_not_fit(target, tmp_path):
    big = Workload("resnet152-imagenet", batch_size=128, memory_limit_mb=1024)
    with pytest.raises(ScenarioFailed, match="does not fit in its partition") as failure:
        run_scenario([big, SMALL], PartitionedMpsMode(), target, SHORT, tmp_path)
    assert "1024 MB" in str(failure.value)
    assert our_mps_processes(target.scratch) == {}


def test_naive_workers_do_not_join_a_running_daemon(target, tmp_path):
    # A daemon is running on the GPU; naive workers must stay plain CUDA processes (no MPS client).
    system_like = mps.MpsDaemon(target.scratch / "system", target.gpu.uuid).start()
    try:
        result = run_scenario([SMALL, SMALL], NaiveMode(), target, SHORT, tmp_path)
        assert system_like.clients() == []
        assert all(w.mode_facts == {} for w in result.workers)
    finally:
        system_like.stop()


def kill_later(find_victims, delay_s: float) -> list[int]:
    """In the background: once ``find_victims()`` returns pids, wait ``delay_s`` (into the measurement),
    SIGKILL them, and list them in the returned list."""
    import signal
    import threading

    killed: list[int] = []

    def watch():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            if find_victims():
                time.sleep(delay_s)
                for pid in find_victims():
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()
    return killed


def test_worker_killed_under_mps_fails_cleanly(target, tmp_path):
    settings = Settings(rounds=20, round_s=0.5, warmup_s=1.0, warmup_steps=5, timeout_s=180)

    def first_of_two_workers():
        workers = worker_processes(os.getpid())
        return workers[:1] if len(workers) == 2 else []

    killed = kill_later(first_of_two_workers, delay_s=12)
    with pytest.raises(ScenarioFailed, match="killed by SIGKILL"):
        run_scenario([SMALL, SMALL], MpsMode(), target, settings, tmp_path)
    assert killed
    assert our_mps_processes(target.scratch) == {}


def test_mps_daemon_killed_mid_test_fails_without_hanging_or_leftovers(target, tmp_path, evidence):
    settings = Settings(rounds=20, round_s=0.5, warmup_s=1.0, warmup_steps=5, timeout_s=60)

    def daemon_once_serving():
        ours = our_mps_processes(target.scratch)
        serving = any(info["name"] == "nvidia-cuda-mps-server" for info in ours.values())
        return list(ours) if serving else []

    killed = kill_later(daemon_once_serving, delay_s=10)
    begin = time.monotonic()
    outcome = "passed"
    try:
        run_scenario([SMALL, SMALL], MpsMode(), target, settings, tmp_path)
    except ScenarioFailed as failure:
        outcome = str(failure).splitlines()[0]
    evidence("mps_daemon_killed", {"killed_pids": killed, "outcome": outcome,
                                   "seconds": time.monotonic() - begin})
    assert killed
    assert time.monotonic() - begin < 150
    assert our_mps_processes(target.scratch) == {}


def test_fatal_gpu_fault_under_mps_fails_cleanly_and_the_next_test_is_unaffected(target, tmp_path, evidence):
    # A fatal fault in one client puts the MPS server in FAULT: it refuses new clients until all of
    # its clients have exited. The test must fail with an error, leave nothing, and the next scenario
    # (a fresh private daemon) must measure normally.
    faulty = Workload("tests.user_workloads:tiny", batch_size=64,
                      options={"fail_after": 200, "failure": "device-assert"})
    settings = Settings(rounds=20, round_s=0.5, warmup_s=1.0, warmup_steps=5, timeout_s=120)
    (tmp_path / "fault").mkdir()
    (tmp_path / "after").mkdir()
    begin = time.monotonic()
    with pytest.raises(ScenarioFailed) as failure:
        run_scenario([SMALL, faulty], MpsMode(), target, settings, tmp_path / "fault")
    seconds = time.monotonic() - begin
    assert our_mps_processes(target.scratch) == {}
    after = run_scenario([SMALL, SMALL], MpsMode(), target, SHORT, tmp_path / "after")
    evidence("mps_fatal_fault", {"outcome": str(failure.value).splitlines()[:3], "seconds": seconds,
                                 "log_tail": failure.value.diagnostics.splitlines()[-8:],
                                 "next_scenario_samples_per_s": after.aggregate_throughput})
    assert "device-side assert" in str(failure.value) or "fault" in str(failure.value).lower()
    assert seconds < 120
    assert after.aggregate_throughput > 0 and our_mps_processes(target.scratch) == {}


def test_sigint_during_an_mps_scenario_leaves_nothing(pytester_like_run, evidence):
    outcome = pytester_like_run(signal_after_s=12)
    evidence("sigint_during_mps", outcome)
    assert outcome["leftover_processes"] == [] and outcome["leftover_dirs"] == []
    assert outcome["returncode"] != 0


@pytest.fixture
def pytester_like_run(tmp_path):
    """Run pytest on a small MPS scenario in a child process group, interrupt it, look from outside."""
    import signal
    import subprocess

    def run(signal_after_s: float) -> dict:
        test_file = tmp_path / "test_interrupted.py"
        test_file.write_text(
            "import pytest\nfrom pytest_gpucolloc import Workload\n"
            "@pytest.mark.gpucolloc_quick\n"
            "def test_long(collocate):\n"
            "    collocate([Workload('resnet26-cifar10', batch_size=32)] * 2)\n"
        )
        before = set(Path("/tmp").glob("gc-*"))
        # Only the interrupted run's processes count: this session's own fork server lives on until it ends.
        tag = f"{os.getpid()}-{tmp_path.name}"
        child = subprocess.Popen(pytest_command(str(test_file), "--gpu-mode=mps", "--colloc-rounds=100",
                                                "--colloc-round-seconds=1", "-p", "no:cacheprovider"),
                                 cwd=tmp_path, env={**os.environ, "GPUCOLLOC_TEST_TAG": tag},
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        time.sleep(signal_after_s)
        child.send_signal(signal.SIGINT)
        try:
            output, _ = child.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            output, _ = child.communicate()
        time.sleep(1)
        leftovers = [str(pid) for pid in plugin_processes() if environment_has(pid, f"GPUCOLLOC_TEST_TAG={tag}")]
        daemons = list(our_mps_processes())
        return {"returncode": child.returncode, "leftover_processes": leftovers + daemons,
                "leftover_dirs": [str(p) for p in set(Path("/tmp").glob("gc-*")) - before],
                "output_tail": output.decode(errors="replace").splitlines()[-5:]}

    return run


def test_public_mps_daemon_fixture(mps_daemon):
    env = mps_daemon.client_env()
    assert Path(env["CUDA_MPS_PIPE_DIRECTORY"]).is_dir() and env["CUDA_VISIBLE_DEVICES"].startswith("GPU-")
    assert mps_daemon.daemon_pids() and mps_daemon.servers() == []  # servers start with the first client
    mps_daemon.set_default("set_default_active_thread_percentage", "50")
    assert "control.log" in mps_daemon.log_tail()


def test_one_partitioned_client_is_the_mps_measurement_not_a_second_one(pytester):
    """One mps-partitioned client's equal share is the whole GPU: the scenario records the mps measurement of the
    same job (the same process), saying so, instead of measuring it again."""
    pytester.makepyfile(test_one=(
        "from pytest_gpucolloc import Workload\n"
        "def test_one(collocate):\n"
        "    collocate([Workload('resnet26-cifar10', batch_size=32)])\n"))
    result = pytester.runpytest_subprocess("--gpu-mode=mps,mps-partitioned", "--colloc-alone=off",
                                           "--benchmark-json=run.json", "--colloc-rounds=3", "--colloc-max-rounds=3",
                                           "--colloc-round-seconds=0.5", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    records = {b["name"]: b["extra_info"] for b in json.loads((pytester.path / "run.json").read_text())["benchmarks"]}
    mps_one, partitioned = records["test_one[mps]"], records["test_one[mps-partitioned]"]
    assert partitioned["mode"] == "mps-partitioned" and partitioned["measurement"]["same_as"] == "mps"
    assert partitioned["workers"][0]["pid"] == mps_one["workers"][0]["pid"]
    assert partitioned["aggregate_round_throughputs"] == mps_one["aggregate_round_throughputs"]
    assert "same_as" not in mps_one["measurement"]
