"""Scenarios for a gate experiment of ci/gpu-check (not part of the suite): cuDNN autotuning on (the default:
algorithms timed in each process, so two processes may choose differently) against off (chosen by cuDNN's
heuristics, the same in every process). Does choosing them the same way in every process make runs steady enough
for a 2% gate with 5 baseline runs? Graphed ResNet26 bs128 alone and x7 (launch-bound without the graph), and the
GPU-bound ResNet152 bs128 x2 under the test's mode. On H200s it did for all three (runs 0.08-0.12% apart, against
0.2-0.8% with autotuning): docs/results/2026-12-01-h200-gate-cudnn-heuristics/ and 2026-12-02-h200-gate-gpu-bound-heuristics/. Run them as the gate part's scenarios:

    GPUCHECK_SKIP="tests bench fidelity overhead graphs ab modern spawn mps-study xdist" \\
    GPUCHECK_GATE_IDS=research/scenarios/test_cudnn_autotune.py ci/gpu-check
"""
import pytest

from pytest_gpucolloc import Workload

AUTOTUNE = pytest.mark.parametrize("autotune", [True, False], ids=["autotune", "heuristics"])


@AUTOTUNE
@pytest.mark.parametrize("n", [1, 7], ids=lambda n: f"n{n}")
def test_resnet26_cifar10_graphed_bs128(collocate, n, autotune):
    collocate([Workload("resnet26-cifar10", batch_size=128, cuda_graph=True,
                        options={"cudnn_autotune": autotune})] * n)


@AUTOTUNE
def test_resnet152_imagenet_bs128_n2(collocate, autotune):
    collocate([Workload("resnet152-imagenet", batch_size=128, options={"cudnn_autotune": autotune})] * 2)
