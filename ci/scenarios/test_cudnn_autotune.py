"""Scenarios for a gate experiment of ci/gpu-check (not part of the suite): graphed ResNet26 bs128 alone and x7
under the test's mode, with cuDNN autotuning on (the default: algorithms timed in each process, then frozen into
the graph) and off (chosen by cuDNN's heuristics). Does choosing them the same way in every process make runs
steady enough for a 2% gate with 5 baseline runs? Run it as the gate part's scenarios:

    GPUCHECK_SKIP="tests bench fidelity overhead graphs ab modern spawn mps-study xdist" \\
    GPUCHECK_GATE_IDS=ci/scenarios/test_cudnn_autotune.py ci/gpu-check
"""
import pytest

from pytest_gpucolloc import Workload


@pytest.mark.parametrize("autotune", [True, False], ids=["autotune", "heuristics"])
@pytest.mark.parametrize("n", [1, 7], ids=lambda n: f"n{n}")
def test_resnet26_cifar10_graphed_bs128(collocate, n, autotune):
    collocate([Workload("resnet26-cifar10", batch_size=128, cuda_graph=True,
                        options={"cudnn_autotune": autotune})] * n)
