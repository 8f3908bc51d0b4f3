"""Two copies of each zoo job under the test's sharing mode (--gpu-mode), the zoo's default tier.

Select them with `-m zoo` (and one job with `-k`, e.g. `-k unet`). Launch-bound or GPU-bound, each is left as a
user leaves it: default batch size, no CUDA graphs, cuDNN's defaults.
"""
import pytest

from pytest_gpucolloc import Workload

pytestmark = [pytest.mark.zoo, pytest.mark.gpucolloc_quick]  # quick: CPU smoke mode runs them too


def test_transformer_encoder(collocate):
    collocate([Workload("zoo.models:transformer_encoder", batch_size=32, precision="bf16")] * 2)


def test_char_lstm(collocate):
    collocate([Workload("zoo.models:char_lstm", batch_size=32)] * 2)


def test_unet(collocate):
    collocate([Workload("zoo.models:unet", batch_size=32)] * 2)


def test_mlp(collocate):
    collocate([Workload("zoo.models:mlp", batch_size=32)] * 2)
