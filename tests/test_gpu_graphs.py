"""GPU tier: CUDA-graph workloads capture and replay under every mode that can run here, and a step that
cannot be captured fails with the reason."""
import pytest

from pytest_gpucolloc import Workload, record
from pytest_gpucolloc.modes.mps import MpsMode
from pytest_gpucolloc.modes.naive import NaiveMode
from pytest_gpucolloc.scenario import ScenarioFailed, Settings, run_scenario

pytestmark = pytest.mark.gpucolloc_gpu

SHORT = Settings(rounds=3, round_s=0.5, warmup_s=1.0, warmup_steps=5, timeout_s=180)


@pytest.mark.parametrize("mode", [NaiveMode, MpsMode], ids=["naive", "mps"])
def test_a_graphed_workload_is_captured_once_and_replayed(target, tmp_path, mode, evidence):
    jobs = [Workload("resnet26-cifar10", batch_size=32, cuda_graph=True)] * 2
    result = run_scenario(jobs, mode(), target, SHORT, tmp_path)
    saved = record.write(result)
    phases = [w["startup_phases_s"] for w in saved["workers"]]
    evidence(f"cuda_graph_{mode.name}", {"throughput": result.aggregate_throughput, "cv": result.cv,
                                         "startup_phases_s": phases})
    assert all("cuda_graph_capture" in p for p in phases)
    assert result.aggregate_throughput > 0 and saved["workloads"] == ["resnet26-cifar10/bs32/graph"] * 2


def test_a_step_that_cannot_be_captured_fails_with_the_reason(target, tmp_path):
    # .item() synchronises with the host: not allowed inside a CUDA graph capture
    job = Workload("tests.user_workloads:tiny", batch_size=8, cuda_graph=True, options={"host_sync": True})
    with pytest.raises(ScenarioFailed, match="cannot be captured as a CUDA graph"):
        run_scenario([job], NaiveMode(), target, SHORT, tmp_path)


@pytest.mark.parametrize("graphed", [False, True], ids=["eager", "graphed"])
def test_a_language_model_trains_in_bf16_and_counts_tokens(target, tmp_path, graphed, evidence):
    job = Workload("gpt-mini", batch_size=4, precision="bf16", options={"seq_len": 256}, cuda_graph=graphed)
    result = run_scenario([job], NaiveMode(), target, SHORT, tmp_path)
    saved = record.read(record.write(result))
    worker = saved.workers[0]
    evidence(f"language_model_{'graphed' if graphed else 'eager'}", {
        "samples_per_s": worker.throughput, "tokens_per_s": worker.tokens_per_s,
        "peak_memory_bytes": worker.peak_memory_bytes, "cv": result.cv})
    assert worker.tokens_per_s == pytest.approx(256 * worker.throughput) and worker.peak_memory_bytes > 0


def test_a_language_model_too_big_for_the_gpu_fails_with_the_numbers(target, tmp_path):
    job = Workload("gpt2-small", batch_size=4096, precision="bf16", options={"seq_len": 4096})
    with pytest.raises(ScenarioFailed, match="does not fit in the GPU's memory: it tried to allocate") as failure:
        run_scenario([job], NaiveMode(), target, SHORT, tmp_path)
    assert "GiB free" in str(failure.value)
