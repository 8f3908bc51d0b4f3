"""Quick tier, the default run: about three minutes on a GPU, each distinct job also measured alone once (three
here), and CPU smoke mode anywhere. Launch-bound small jobs eager and with CUDA graphs, and a small job beside a
big one.

Under the CI gate (--colloc-gate) the graphed scenario is judged against its history; the two with eager
launch-bound jobs are measured and saved but left to paired A/B (``gpucolloc_gate(by="ab")``): their fresh processes
and runs differ by 7-11% on H200s (docs/gate.md), so a history gate could only ever
answer `inconclusive` for them, where `pytest-gpucolloc ab` decides in minutes."""
import pytest

from pytest_gpucolloc import Workload

pytestmark = pytest.mark.gpucolloc_quick
HEURISTICS = {"cudnn_autotune": False}


@pytest.mark.gpucolloc_gate(by="ab")
@pytest.mark.parametrize("n", [2], ids=lambda n: f"n{n}")
def test_resnet26_cifar10_bs128(collocate, n):
    collocate([Workload("resnet26-cifar10", batch_size=128)] * n)


@pytest.mark.parametrize("n", [2], ids=lambda n: f"n{n}")
def test_resnet26_cifar10_bs128_graphed(collocate, n):
    """The same job with its whole training step captured as a CUDA graph (no CPU launch noise), its convolution
    algorithms chosen by cuDNN's heuristics, the same in every process: on an H200 its runs then varied by 0.1%
    instead of 0.6-0.8%, which a 2% gate needs (docs/gate.md)."""
    collocate([Workload("resnet26-cifar10", batch_size=128, cuda_graph=True, options=HEURISTICS)] * n)


@pytest.mark.gpucolloc_gate(by="ab")
@pytest.mark.parametrize("mix", [[("resnet26-cifar10", 128), ("resnet152-imagenet", 32)]],
                         ids=lambda mix: "+".join(name.split("-")[0] for name, _ in mix))
def test_mixed(collocate, mix):
    collocate([Workload(name, batch_size=batch) for name, batch in mix])
