"""Ctrl-C and SIGTERM to a running pytest, during warm-up, during measurement and while the run is saved, for the
modes that run without a GPU; and the leftovers of a killed run. Checked from outside the pytest process."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_gpucolloc.index import LOCK
from pytest_gpucolloc.scratch import OWNER_FILE, clean_stale_scratch, scratch_base
from tests.ctrl_c import pytest_command
from tests.processes import environment_has, fork_servers, plugin_processes, worker_processes

SCENARIO = '''
import pytest
from pytest_gpucolloc import Workload
@pytest.mark.gpucolloc_quick
def test_long(collocate):
    collocate([Workload("tests.user_workloads:tiny", batch_size=b, options={"step_sleep": 0.001}) for b in (4, 2)])
'''


def of_run(pids: list[int], tag: str) -> list[str]:
    """The processes started by the run tagged ``tag`` (they inherit the run's environment), so that other pytest
    runs on the machine do not count."""
    return [str(pid) for pid in pids if environment_has(pid, f"GPUCOLLOC_TEST_TAG={tag}")]


@pytest.mark.parametrize("mode", ["sequential", "naive"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("after_s", [0.3, 5.0], ids=["warm-up", "measurement"])
def test_interrupted_run_leaves_nothing_behind(tmp_path, mode, sig, after_s):
    (tmp_path / "test_long.py").write_text(SCENARIO)
    before_dirs = set(scratch_base().glob("gc-*"))
    tag = f"{os.getpid()}-{tmp_path.name}"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "GPUCOLLOC_TEST_TAG": tag}
    child = subprocess.Popen(
        pytest_command(str(tmp_path / "test_long.py"), f"--gpu-mode={mode}", "--colloc-device=cpu",
                       "--colloc-rounds=200", "--colloc-round-seconds=0.5", "--colloc-warmup-seconds=3",
                       "-p", "no:cacheprovider", "--colloc-gate", f"--benchmark-storage=file://{tmp_path / 'runs'}"),
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not of_run(worker_processes(), tag) and time.monotonic() < deadline:
        time.sleep(0.1)  # wait until the run has started its workers (warm-up lasts 3 s)
    time.sleep(after_s)
    child.send_signal(sig)
    output, _ = child.communicate(timeout=60)
    time.sleep(0.5)
    assert child.returncode != 0
    assert b"KeyboardInterrupt" in output
    assert of_run(plugin_processes(), tag) == [], output.decode()[-2000:]  # no worker, no fork server
    ours = {p for p in set(scratch_base().glob("gc-*")) - before_dirs
            if (p / "owner.pid").exists() and (p / "owner.pid").read_text().strip() == str(child.pid)}
    assert ours == set()


@pytest.mark.alone  # another session of the plugin, beside it, would remove the stale directory first
def test_a_killed_runs_scratch_directory_is_removed_by_the_next_run(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = Path(scratch_base(), "gc-stale-test")
    stale.mkdir(mode=0o700, exist_ok=True)
    (stale / OWNER_FILE).write_text(str(dead.pid))
    (stale / "mps").mkdir()
    alive = Path(scratch_base(), "gc-alive-test")
    alive.mkdir(mode=0o700, exist_ok=True)
    (alive / OWNER_FILE).write_text(str(os.getpid()))
    try:
        removed = clean_stale_scratch()
        assert str(stale) in removed and not stale.exists()
        assert alive.exists()  # its owner is still running
    finally:
        for path in (stale, alive):
            if path.exists():
                (path / OWNER_FILE).unlink()
                for child in path.iterdir():
                    child.rmdir()
                path.rmdir()


ORPHAN = '''
import pytest
from pytest_gpucolloc import Workload
@pytest.mark.gpucolloc_quick
def test_x(collocate):
    collocate([Workload("tests.user_workloads:forks_a_session_leader", batch_size=4,
                        options={{"pid_file": "{pid_file}", "step_sleep": 0.01}})])
'''


def stat_of(pid: int) -> list[str]:
    """State, parent, process group, session, ... of a process; empty once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def test_a_forked_session_leader_left_by_a_killed_run_is_killed_by_the_next_run(pytester, tmp_path):
    """Under the fork server (the default) a workload forks, without exec, a child that starts its own session: the
    environment /proc shows for it is the server's, without its worker's mark, and nothing reaches it when pytest
    and its fork server are SIGKILLed together (its workers die with the server). The next run's sweep finds it by
    the descriptor it inherited and kills it, and removes what the killed run left in its scratch directories, the
    fork server's log included."""
    pid_file = tmp_path / "children"
    pytester.makepyfile(test_orphan=ORPHAN.format(pid_file=pid_file))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                       os.environ.get("PYTHONPATH", "")]))
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--colloc-device=cpu",
                            "--gpu-mode=naive", "--colloc-round-seconds=30", "test_orphan.py"],
                           cwd=pytester.path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    child, deadline = None, time.monotonic() + 120
    while child is None and time.monotonic() < deadline:
        time.sleep(0.1)
        text = pid_file.read_text() if pid_file.exists() else ""  # created before the child's pid is written in
        pid = int(text) if text.strip() else 0
        if pid and stat_of(pid)[3:4] == [str(pid)]:  # it has started its own session
            child = pid
    assert child, "the workload never forked its child"
    scratch = [path for path in scratch_base().glob("gc-*") if (path / OWNER_FILE).is_file()
               and (path / OWNER_FILE).read_text().strip() == str(run.pid)]
    assert any((path / "forkserver.log").is_file() for path in scratch)
    for pid in [run.pid, *fork_servers(run.pid)]:  # SIGKILL: nothing of the plugin runs; the workers die with
        os.kill(pid, signal.SIGKILL)              # their server, the child does not
    run.wait()
    # The next run's sweep: this one's, unless another pytest session on the machine started first.
    pytester.runpytest_subprocess("--colloc-device=cpu", "--co")
    assert stat_of(child)[:1] in ([], ["Z"]), "the workload's child escaped"
    assert not any(path.exists() for path in scratch)


SAVE_BLOCKS = '''
import time
from pathlib import Path
import pytest_benchmark.utils as utils

_dumps = utils.safe_dumps

def blocks_until_signalled(*args, **kwargs):  # the run's save (at the session's end) waits for the test's signal
    Path("saving").touch()
    deadline = time.monotonic() + 60
    while not Path("signalled").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return _dumps(*args, **kwargs)

utils.safe_dumps = blocks_until_signalled
'''


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_run_is_saved_lets_the_save_finish_and_says_so_in_one_line(tmp_path, sig):
    """A CI job cancelled as pytest-benchmark saves the run: said as it arrives; the run is saved whole, then
    stopped, in one line."""
    (tmp_path / "conftest.py").write_text(SAVE_BLOCKS)
    (tmp_path / "test_b.py").write_text("def test_b(benchmark):\n    benchmark(lambda: None)\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen(pytest_command("test_b.py", "--colloc-device=cpu", "-p", "no:cacheprovider",
                                            "--benchmark-autosave", "--benchmark-storage=file://runs"),
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not (tmp_path / "saving").exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    child.send_signal(sig)
    (tmp_path / "signalled").touch()
    output = child.communicate(timeout=120)[0].decode()
    saved = [path for path in (tmp_path / "runs").rglob("*") if path.is_file() and path.name != LOCK]
    assert [path.suffix for path in saved] == [".json"], output[-3000:]  # saved whole, nothing left aside
    assert json.loads(saved[0].read_text())["benchmarks"][0]["name"] == "test_b"
    assert child.returncode == 2 and "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    assert f"Exit: {sig.name} arrived as the session ended: stopped once its end was done (the run saved whole: " \
           f"{saved[0]})" in output, output[-3000:]
    assert f"{sig.name}: stopping once the run is saved; again to stop at once" in output, output[-3000:]
