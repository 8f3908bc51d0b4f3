"""GPU tier: a process that is not ours computes on the GPU during a measurement; the result is flagged."""
import os
import subprocess
import sys
import time

import pytest

from pytest_gpucolloc import Workload, report, telemetry
from pytest_gpucolloc.modes.naive import NaiveMode
from pytest_gpucolloc.scenario import Settings, run_scenario
from pytest_gpucolloc.session import standalone_target

pytestmark = pytest.mark.gpu

# Holds a CUDA context (and keeps a kernel busy) for a while: what another team's job would look like.
INTRUDER = ("import time, torch\n"
            "x = torch.ones(1024, 1024, device='cuda')\n"
            "end = time.time() + 60\n"
            "while time.time() < end:\n"
            "    x = x @ x / 1024\n"
            "    torch.cuda.synchronize()\n")


def test_a_foreign_process_during_measurement_flags_the_result(tmp_path):
    settings = Settings(rounds=8, round_s=1.0, warmup_s=1.0, warmup_steps=5, timeout_s=120)
    with standalone_target("cuda") as target:
        intruder = subprocess.Popen([sys.executable, "-c", INTRUDER],
                                    env=dict(os.environ, CUDA_VISIBLE_DEVICES=target.gpu.uuid))
        try:
            time.sleep(3)  # its context exists before the measurement window opens
            result = run_scenario([Workload("resnet26-cifar10", batch_size=32)], NaiveMode(), target, settings,
                                  tmp_path, telemetry.sampler_factory(target.gpu.uuid))
        finally:
            intruder.kill()
            intruder.wait()
    assert intruder.pid in result.foreign_pids
    info = result.extra_info()
    assert info["foreign_pids"] == result.foreign_pids
    assert "FOREIGN PIDS" in report.rows([("test_x", info)])[0][-1]
