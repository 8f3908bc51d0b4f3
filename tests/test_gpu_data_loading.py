"""GPU tier: data-loader workloads feed the GPU from pinned memory, eager and with the step captured as a CUDA
graph (each batch copied into the tensors the graph reads), and say how long they waited for data."""
import pytest

from pytest_gpucolloc import Workload, record
from pytest_gpucolloc.modes.mps import MpsMode
from pytest_gpucolloc.scenario import Settings, run_scenario

pytestmark = pytest.mark.gpucolloc_gpu

SHORT = Settings(rounds=3, round_s=0.5, warmup_s=2.0, warmup_steps=5, timeout_s=180)


@pytest.mark.parametrize("graphed", [False, True], ids=["eager", "graphed"])
def test_a_loader_job_trains_on_the_gpu_and_reports_its_data_wait(target, tmp_path, graphed, evidence):
    jobs = [Workload("resnet50-imagenet64", batch_size=128, data="loader", loader_workers=4, cuda_graph=graphed)] * 2
    result = run_scenario(jobs, MpsMode(), target, SHORT, tmp_path)
    saved = record.read(record.write(result))
    evidence(f"data_loader_{'graphed' if graphed else 'eager'}", {
        "aggregate_samples_per_s": saved.throughput, "cv": saved.cv, "cpu_affinity": saved.cpu_affinity,
        "data_wait_share": [w.data_wait_share for w in saved.workers]})
    assert saved.workloads[0] == "resnet50-imagenet64/bs128" + ("/graph" if graphed else "") + "/loader4"
    assert all(w.throughput > 0 and 0 <= w.data_wait_share < 1 for w in saved.workers)
