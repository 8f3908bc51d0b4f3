"""Quick tier: a few scenarios that run in minutes on a GPU and in CPU smoke mode anywhere."""
import pytest

from pytest_gpucolloc import Workload

pytestmark = pytest.mark.gpucolloc_quick


@pytest.mark.parametrize("n", [1, 2], ids=lambda n: f"n{n}")
def test_resnet26_cifar10_bs128(collocate, n):
    collocate([Workload("resnet26-cifar10", batch_size=128)] * n)


@pytest.mark.parametrize("n", [1, 2], ids=lambda n: f"n{n}")
def test_resnet26_cifar10_bs128_graphed(collocate, n):
    """The same job with its whole training step captured as a CUDA graph (no CPU launch noise)."""
    collocate([Workload("resnet26-cifar10", batch_size=128, cuda_graph=True)] * n)


def test_resnet50_imagenet64_bs32_x2(collocate):
    collocate([Workload("resnet50-imagenet64", batch_size=32)] * 2)


def test_mixed_resnet26_resnet152(collocate):
    collocate([Workload("resnet26-cifar10", batch_size=32), Workload("resnet152-imagenet", batch_size=32)])
