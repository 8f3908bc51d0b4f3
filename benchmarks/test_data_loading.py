"""Data loading that competes for the CPU: ResNet50 on ImageNet-64 fed by 4 DataLoader workers each (as the paper's
jobs were), decoding and augmenting JPEG images on the CPU every step; alone and 3 and 7 to a GPU. The same job
on a synthetic batch resident on the GPU is ``test_paper.py::test_resnet50_imagenet64`` (same ids): the
difference is what the CPU costs. Part of the full matrix (--colloc-full)."""
import pytest

from pytest_gpucolloc import Workload

pytestmark = pytest.mark.gpucolloc_full


@pytest.mark.parametrize("batch", [128], ids=lambda b: f"bs{b}")
@pytest.mark.parametrize("n", [1, 3, 7], ids=lambda n: f"n{n}")
def test_resnet50_imagenet64_loader(collocate, n, batch):
    collocate([Workload("resnet50-imagenet64", batch_size=batch, data="loader", loader_workers=4)] * n)
