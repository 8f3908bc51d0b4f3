"""A latency-sensitive service beside training jobs: what a training neighbour does to the service's p99 under each
sharing mode, and what training keeps. Requests arrive open loop at 50% and 80% of the rate the service answers back
to back alone on this GPU. Part of the full matrix (--colloc-full); e.g.

    pytest benchmarks/test_serving.py --colloc-full --gpu-mode=naive,mps,mps-partitioned,mig
"""
import pytest

from pytest_gpucolloc import Workload

pytestmark = pytest.mark.gpucolloc_full

# ResNet50 at 224 px, bf16, 4 images a request; a small language model's forward pass over 256 tokens, as a CUDA graph
SERVICES = {
    "resnet50": Workload("resnet50-imagenet224", batch_size=4, precision="bf16"),
    "gpt-mini-graph": Workload("gpt-mini", batch_size=1, precision="bf16", cuda_graph=True, options={"seq_len": 256}),
}
TRAINER = Workload("resnet50-imagenet64", batch_size=64)  # the paper's middle training job


@pytest.mark.parametrize("neighbours", [0, 1, 3, 6], ids=lambda n: f"{n}train")
@pytest.mark.parametrize("rate", ["50%", "80%"], ids=lambda r: f"rate{r[:-1]}")
@pytest.mark.parametrize("service", ["resnet50"])
def test_service_beside_training(collocate, service, rate, neighbours):
    collocate([SERVICES[service].at_rate(rate)] + [TRAINER] * neighbours)


@pytest.mark.parametrize("neighbours", [0, 3], ids=lambda n: f"{n}train")
def test_language_model_service_beside_training(collocate, neighbours):
    collocate([SERVICES["gpt-mini-graph"].at_rate("80%")] + [TRAINER] * neighbours)


@pytest.mark.parametrize("reserved", [20, 30, 50], ids=lambda p: f"reserve{p}")
@pytest.mark.parametrize("neighbours", [1, 3, 6], ids=lambda n: f"{n}train")
@pytest.mark.parametrize("rate", ["50%", "80%"], ids=lambda r: f"rate{r[:-1]}")
def test_service_with_sms_reserved(collocate, gpu_mode, rate, neighbours, reserved):
    """mps-partitioned: the service may use ``reserved`` percent of the SMs and the training clients share the rest
    evenly, so neither side can take the other's SMs."""
    if gpu_mode != "mps-partitioned":
        pytest.skip("SM reservations are an mps-partitioned scenario")
    service = Workload("resnet50-imagenet224", batch_size=4, precision="bf16", rate=rate, sm_percent=reserved)
    trainer = Workload("resnet50-imagenet64", batch_size=64, sm_percent=(100 - reserved) // neighbours)
    collocate([service] + [trainer] * neighbours)
