"""The paper's matrix (Robroek et al., EuroMLSys '24): 1, 2, 3 and 7 processes per GPU, batch 32 and 128.
Deselected by default; ``--colloc-full`` runs it (its expected time is shown before it starts)."""
import pytest

from pytest_gpucolloc import Workload

pytestmark = pytest.mark.gpucolloc_full

PROCESSES = [1, 2, 3, 7]
BATCH_SIZES = [32, 128]


@pytest.mark.parametrize("batch", BATCH_SIZES, ids=lambda b: f"bs{b}")
@pytest.mark.parametrize("n", PROCESSES, ids=lambda n: f"n{n}")
def test_resnet26_cifar10(collocate, n, batch):
    collocate([Workload("resnet26-cifar10", batch_size=batch)] * n)


@pytest.mark.parametrize("batch", BATCH_SIZES, ids=lambda b: f"bs{b}")
@pytest.mark.parametrize("n", PROCESSES, ids=lambda n: f"n{n}")
def test_resnet26_cifar10_graphed(collocate, n, batch):
    """ResNet26 with its whole training step captured as a CUDA graph: when graphs alone beat collocation,
    and when the two compound."""
    collocate([Workload("resnet26-cifar10", batch_size=batch, cuda_graph=True)] * n)


@pytest.mark.parametrize("batch", BATCH_SIZES, ids=lambda b: f"bs{b}")
@pytest.mark.parametrize("n", PROCESSES, ids=lambda n: f"n{n}")
def test_resnet50_imagenet64(collocate, n, batch):
    collocate([Workload("resnet50-imagenet64", batch_size=batch)] * n)


@pytest.mark.parametrize("batch", BATCH_SIZES, ids=lambda b: f"bs{b}")
@pytest.mark.parametrize("n", PROCESSES, ids=lambda n: f"n{n}")
def test_resnet152_imagenet(collocate, n, batch):
    collocate([Workload("resnet152-imagenet", batch_size=batch)] * n)


@pytest.mark.parametrize("batch", BATCH_SIZES, ids=lambda b: f"bs{b}")
@pytest.mark.parametrize("mix", [["resnet26-cifar10", "resnet152-imagenet"]], ids=lambda mix: "+".join(
    name.split("-")[0] for name in mix))
def test_mixed(collocate, mix, batch):
    collocate([Workload(name, batch_size=batch) for name in mix])
