"""Ctrl-C and SIGTERM to a running pytest, during warm-up and during measurement, for the modes that run
without a GPU; and the leftovers of a killed run. Checked from outside the pytest process."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_gpucolloc.scratch import OWNER_FILE, clean_stale_scratch, scratch_base
from tests.ctrl_c import pytest_command
from tests.processes import environment_has, plugin_processes, worker_processes

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
                       "-p", "no:cacheprovider"),
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
