"""A user's service beside two of the zoo's GPU-bound training jobs, under the test's sharing mode (--gpu-mode).

Select them with `-m zoo_service` (one service with `-k vit` or `-k decoder`). The rate is fixed (requests/s), well
below what the service answers back to back beside the trainers on an H200, as a user's service level is. The
requests arrive evenly, or as a Poisson process with ``ZOO_ARRIVALS=poisson`` (read at collection).
"""
import os

import pytest

from pytest_gpucolloc import Workload

pytestmark = [pytest.mark.zoo_service, pytest.mark.gpucolloc_quick]  # quick: CPU smoke mode runs them too

TRAINER = Workload("zoo.models:transformer_encoder", batch_size=32, precision="bf16")
ARRIVALS = os.environ.get("ZOO_ARRIVALS", "even")


def test_vit_service(collocate):
    collocate([Workload("zoo.services:vit", batch_size=4, precision="bf16", rate=50, arrivals=ARRIVALS)]
              + [TRAINER] * 2)


def test_decoder_service(collocate):
    collocate([Workload("zoo.services:decoder", batch_size=8, precision="bf16", rate=50, arrivals=ARRIVALS)]
              + [TRAINER] * 2)
