"""GPU tier: the sampler on a real GPU. A process that is not ours computing during a measurement flags the
result; the memory recorded per worker covers what the worker's own allocator holds."""
import os
import subprocess
import sys
import time

import pytest

from pytest_gpucolloc import Workload, record, report, telemetry
from pytest_gpucolloc.device import standalone_target
from pytest_gpucolloc.modes.mps import MpsMode
from pytest_gpucolloc.modes.naive import NaiveMode
from pytest_gpucolloc.scenario import Settings, run_scenario

pytestmark = pytest.mark.gpucolloc_gpu

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
                                  tmp_path, telemetry.sampler_factory(target.gpu))
        finally:
            intruder.kill()
            intruder.wait()
    assert intruder.pid in result.foreign_pids
    info = record.write(result)
    assert info["foreign_pids"] == result.foreign_pids
    assert "FOREIGN PIDS" in report.rows([("test_x", record.read(info))])[0][-1]


@pytest.mark.parametrize("mode", [NaiveMode, MpsMode], ids=["naive", "mps"])
def test_memory_per_worker_covers_what_its_allocator_holds(tmp_path, mode, evidence):
    settings = Settings(rounds=3, round_s=0.5, warmup_s=1.0, warmup_steps=5, timeout_s=120)
    with standalone_target("cuda") as target:
        result = run_scenario([Workload("resnet26-cifar10", batch_size=32)], mode(), target, settings, tmp_path,
                              telemetry.sampler_factory(target.gpu))
    worker = record.write(result)["workers"][0]
    memory = {key: worker[key] for key in ("device_memory_bytes", "reserved_memory_bytes", "peak_memory_bytes")}
    evidence(f"memory_accounting_{mode.name}", memory)
    # NVML's figure for the process (an MPS client's included) is what the summary shows as memory per worker:
    # it must at least hold the tensors PyTorch's allocator keeps on the device.
    assert memory["reserved_memory_bytes"] > 0
    assert memory["device_memory_bytes"] >= memory["reserved_memory_bytes"], memory


def test_jobs_that_cannot_fit_in_memory_together_are_skipped_before_any_starts(pytester):
    """The memory each job used alone (NVML) adds up to more than the GPU has: the scenario is skipped saying so,
    before a worker starts, instead of spending its start-up on workers that run out of memory."""
    pytester.makepyfile(test_fit=(
        "import pynvml\n"
        "from pytest_gpucolloc import Workload\n"
        "JOB = Workload('resnet26-cifar10', batch_size=128)\n"
        "used = {}\n"
        "def test_1_alone(collocate):\n"
        "    used['bytes'] = collocate([JOB]).workers[0].device_memory_bytes\n"
        "def test_2_too_many(collocate):\n"
        "    pynvml.nvmlInit()\n"
        "    total = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total\n"
        "    collocate([JOB] * (total // used['bytes'] + 1))\n"))
    result = pytester.runpytest_subprocess("--gpu-mode=mps", "--colloc-rounds=3", "--colloc-max-rounds=3",
                                           "--colloc-round-seconds=0.5", "-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*test_2_too_many*mps: does not fit in the GPU's memory: the jobs used * GB alone "
                                 "(*x resnet26-cifar10/bs128 * GB); the NVIDIA * has * GB*"])
