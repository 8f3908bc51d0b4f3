"""A mix named on the command line, as ``pytest-gpucolloc advise`` prints it for a mix it could only predict:
``GPUCOLLOC_MIX='[{"model": "resnet26-cifar10", "batch_size": 128, "count": 3}, ...]' pytest benchmarks/test_mix.py
--gpu-mode=sequential,naive,mps``: each job as ``Workload`` takes it, with how many copies. Skipped without it."""
import json
import os

import pytest

from pytest_gpucolloc import Workload


def jobs_of(text: str) -> list[Workload]:
    """The JSON list of GPUCOLLOC_MIX -> the workloads, each repeated ``count`` times (default 1)."""
    try:
        items = json.loads(text)
        jobs = [Workload.from_dict({k: v for k, v in item.items() if k != "count"})
                for item in items for _ in range(int(item.get("count", 1)))]
    except (ValueError, TypeError, AttributeError) as error:
        raise pytest.UsageError(f"GPUCOLLOC_MIX is not a JSON list of workloads with counts: {error}") from None
    if not jobs:
        raise pytest.UsageError("GPUCOLLOC_MIX names no job")
    return jobs


@pytest.mark.skipif(not os.environ.get("GPUCOLLOC_MIX"), reason="GPUCOLLOC_MIX names no mix (pytest-gpucolloc "
                    "advise prints the command for a mix it predicted)")
def test_mix(collocate):
    collocate(jobs_of(os.environ["GPUCOLLOC_MIX"]))
