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
    and when the two compound. cuDNN's heuristics choose its convolution algorithms, the same in every process,
    so that its runs are steady enough to gate (as in the quick tier)."""
    collocate([Workload("resnet26-cifar10", batch_size=batch, cuda_graph=True, options={"cudnn_autotune": False})] * n)


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


# The paper's mixed experiment: batch 128 except ResNet152 at 32; under mig each job gets the instance size matched
# to its model (ResNet26 -> 1g, ResNet50 -> 2g, ResNet152 -> 4g). Three of these layouts need more than the
# 7 compute slices a GPU has (4g+2g+2g, 4g+2g+1g+1g, 4g+2g+1g x3): the mig mode skips them with the planner's
# reason and the nearest layout that fits.
JOBS = {"r26": ("resnet26-cifar10", 128, "1g"), "r50": ("resnet50-imagenet64", 128, "2g"),
        "r152": ("resnet152-imagenet", 32, "4g")}
MIXES = ["r50+r26", "r50+2r26", "2r50+r26", "r50+3r26", "2r50+2r26", "3r50+r26", "r152+r26", "r152+2r26",
         "r152+3r26", "r152+r50", "r152+r50+r26", "r152+2r50", "r152+r50+2r26", "r152+r50+3r26"]


def jobs_of(mix: str) -> list[Workload]:
    """'r152+2r26' -> one ResNet152 and two ResNet26 workloads, each with its MIG size."""
    jobs = []
    for part in mix.split("+"):
        count, key = (int(part[0]), part[1:]) if part[0].isdigit() else (1, part)
        name, batch, size = JOBS[key]
        jobs += [Workload(name, batch_size=batch, mig=size)] * count
    return jobs


@pytest.mark.parametrize("mix", MIXES)
def test_paper_mix(collocate, mix):
    collocate(jobs_of(mix))
