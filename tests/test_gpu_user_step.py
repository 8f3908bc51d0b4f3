"""GPU tier: a user's training step runs with PyTorch's settings as its own code leaves them; the worker does not
turn on cuDNN's autotuning for it (each fresh process would time its own convolution algorithms, so processes
differ: the noise a gate cannot take out). Named convolutional workloads still choose it (``cudnn_autotune``)."""
import pytest

from pytest_gpucolloc import Workload
from pytest_gpucolloc.modes.naive import NaiveMode
from pytest_gpucolloc.scenario import Settings, run_scenario

pytestmark = pytest.mark.gpucolloc_gpu

SHORT = Settings(rounds=2, round_s=0.3, warmup_s=0.5, warmup_steps=3, timeout_s=120)


def test_a_user_step_keeps_pytorchs_cudnn_default(target, tmp_path):
    job = Workload("tests.user_workloads:tiny", batch_size=8, options={"expect_cudnn_benchmark": False})
    result = run_scenario([job], NaiveMode(), target, SHORT, tmp_path)  # the factory raises if the flag was set
    assert result.aggregate_throughput > 0
