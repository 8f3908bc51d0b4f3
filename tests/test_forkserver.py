"""--colloc-spawn=forkserver: workers forked from one process that has imported torch already, on the CPU for
real: each is its own process with the controller's environment, directory and descriptors; hangs and a dying
server end as they do for fresh workers (failures: test_workers.py, both ways); nothing is left behind."""
import dataclasses
import os
import signal
import time
from pathlib import Path

import pytest

from pytest_gpucolloc import Workload, forkserver, protocol
from pytest_gpucolloc import pool as pool_module
from pytest_gpucolloc.device import standalone_target
from pytest_gpucolloc.environment import base_environment
from pytest_gpucolloc.modes.naive import NaiveMode
from pytest_gpucolloc.pool import WorkerPool, WorkerSlot
from pytest_gpucolloc.scenario import ScenarioFailed, run_scenario
from test_workers import FAST, tiny

FORKED = dataclasses.replace(FAST, spawn="forkserver")


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def cpu_target():
    with standalone_target("cpu") as target:
        yield target
    forkserver.close_shared()


def test_forked_workers_are_measured_and_start_without_importing_torch(cpu_target, tmp_path):
    result = run_scenario([tiny(), tiny()], NaiveMode(), cpu_target, FORKED, tmp_path)
    server = forkserver.shared()
    pids = {w.ready.pid for w in result.workers}
    assert len(pids) == 2 and os.getpid() not in pids and server.process.pid not in pids
    for worker in result.workers:
        assert worker.stats.throughput > 0
        assert worker.ready.startup_phases_s["import"] < 0.5  # torch came with the fork
    assert not any(alive(pid) for pid in pids)  # stopped with their scenario
    server_pid = server.process.pid
    forkserver.close_shared()
    assert not alive(server_pid) and not server.log_path.exists()


def test_a_forked_worker_has_the_controllers_environment_and_directory(cpu_target, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here_only.py").write_text("from tests.user_workloads import tiny as factory\n")
    slot = WorkerSlot(Workload("here_only:factory", batch_size=4), env={"CUDA_VISIBLE_DEVICES": "7"})
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    with WorkerPool([slot], device="cpu", warmup_s=0.1, warmup_steps=2, log_dir=tmp_path,
                    forkserver=forkserver.shared()) as pool:
        ready = pool.wait_ready(60)[0]
        assert parent_of(ready.pid) == forkserver.shared().process.pid
        assert os.getsid(ready.pid) == ready.pid  # its own session, as a fresh worker's
    assert ready.cuda_visible_devices == "7"  # the slot's environment, not the server's


def test_a_hanging_forked_worker_times_out_and_is_stopped(cpu_target, tmp_path):
    settings = dataclasses.replace(FORKED, rounds=2, timeout_s=10)
    with pytest.raises(ScenarioFailed, match="timed out after 10s"):
        run_scenario([tiny(fail_after=4, failure="hang")], NaiveMode(), cpu_target, settings, tmp_path)
    time.sleep(0.2)
    assert forkserver.shared().exits  # the server reaped it


def test_workers_die_with_their_fork_server(cpu_target, tmp_path):
    slot = WorkerSlot(tiny())
    server = forkserver.shared()
    with WorkerPool([slot, slot], device="cpu", warmup_s=0.1, warmup_steps=2, log_dir=tmp_path,
                    forkserver=server) as pool:
        pids = [ready.pid for ready in pool.wait_ready(60)]
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait()
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(pid) for pid in pids)
        assert all(worker.process.poll() == -signal.SIGKILL for worker in pool.workers)
    assert forkserver.shared() is not server  # the next scenario gets a new server


def test_closing_the_server_ends_its_workers_before_it_returns(cpu_target, tmp_path):
    """The controller going away (a session's end, Ctrl-C) stops the server, which kills the workers it still has
    and waits for them: when close() returns none of them exists, not even as a zombie."""
    slot = WorkerSlot(tiny())
    server = forkserver.ForkServer(base_environment())
    with WorkerPool([slot, slot], device="cpu", warmup_s=0.1, warmup_steps=2, log_dir=tmp_path,
                    forkserver=server) as pool:
        pids = [ready.pid for ready in pool.wait_ready(60)]
        server.close()
        assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == []
        assert server.process.returncode == 0  # it ended by itself, not killed after the close timeout


def test_an_unknown_spawn_method_is_a_usage_error(pytester):
    result = pytester.runpytest("--colloc-spawn=thread")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--colloc-spawn must be one of fresh, forkserver, got 'thread'*"])


def test_a_session_with_the_fork_server_measures_and_leaves_no_process_behind(pytester):
    from processes import plugin_processes
    from test_plugin import FAST as FAST_ARGS
    from test_plugin import SCENARIOS, TINY

    pytester.makepyfile(tiny_workload=TINY, test_scenarios=SCENARIOS.format(sleep=0.0))
    out = pytester.path / "run.json"
    result = pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", "--colloc-spawn=forkserver",
                                f"--benchmark-json={out}", *FAST_ARGS)
    result.assert_outcomes(passed=2)
    assert plugin_processes(os.getpid()) == []  # the server stopped with the session, and its workers with it


def test_the_server_loads_torchvision_only_for_a_job_that_imports_it(cpu_target, tmp_path):
    """A user's small job on the CPU does without torchvision (about 2 s a session); a named ResNet, or any job on a
    GPU, has it loaded before its fork."""
    forkserver.close_shared()  # a server an earlier test of this process used may have loaded it for a ResNet
    run_scenario([tiny()], NaiveMode(), cpu_target, FORKED, tmp_path)
    maps = Path(f"/proc/{forkserver.shared().process.pid}/maps").read_text()
    assert "/torch/" in maps and "torchvision" not in maps
    spec = dict(cpus=None, threads=None, warmup_s=0.1, warmup_steps=2, image_size=None)
    assert pool_module._uses_vision(protocol.Spec(workload=Workload("resnet26-cifar10").to_dict(), device="cpu",
                                                  **spec))
    assert pool_module._uses_vision(protocol.Spec(workload=tiny().to_dict(), device="cuda", **spec))
    assert not pool_module._uses_vision(protocol.Spec(workload=tiny().to_dict(), device="cpu", **spec))


def test_a_server_asked_for_vision_has_it_loaded_before_its_first_fork():
    """A GPU session's server imports torchvision as it starts: an A/B's two arms start theirs at the same time,
    before either is told to start its workers, so neither block waits for those imports."""
    server = forkserver.ForkServer(base_environment(), vision=True)
    try:
        assert "torchvision" in Path(f"/proc/{server.process.pid}/maps").read_text()
    finally:
        server.close()


def test_on_a_gpu_each_worker_starts_once_the_one_before_has_set_up_its_device(cpu_target, tmp_path, monkeypatch):
    """On a GPU the pool starts each worker once the one before said its device (its CUDA context) is set up, so that
    MPS's clients connect in the scenario's order (a random order is the suspect for a service's two levels beside
    trainers). On the CPU workers start at once; here they are asked to start in order."""
    assert pool_module.connects_in_order("cuda") and not pool_module.connects_in_order("cpu")
    slot = WorkerSlot(tiny())
    with WorkerPool([slot, slot], device="cpu", warmup_s=0.1, warmup_steps=2, log_dir=tmp_path,
                    forkserver=forkserver.shared()) as pool:
        pool.wait_ready(60)
        assert pool.workers[1].spawned_at < (pool.workers[0].connected_at or float("inf"))
    monkeypatch.setattr(pool_module, "connects_in_order", lambda device: True)
    with WorkerPool([slot, slot], device="cpu", warmup_s=0.1, warmup_steps=2, log_dir=tmp_path,
                    forkserver=forkserver.shared()) as pool:
        ready = pool.wait_ready(60)
        first, second = pool.workers
        assert first.connected_at is not None and second.spawned_at >= first.connected_at
        assert [r.pid for r in ready] == pool.pids  # every worker's Ready still arrives, in its slot
