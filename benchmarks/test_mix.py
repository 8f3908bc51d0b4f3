"""A mix named on the command line, as ``pytest-gpucolloc advise`` prints it for a mix it could only predict:
``GPUCOLLOC_MIX='[{"model": "resnet26-cifar10", "batch_size": 128, "count": 3}, ...]' pytest benchmarks/test_mix.py
--gpu-mode=sequential,naive,mps``: each job as ``Workload`` takes it, with how many copies. A list of such lists
measures several mixes in one session (each job measured alone once). Skipped without it."""
import json
import os

import pytest

from pytest_gpucolloc import Workload


def mixes_of(text: str) -> list[list[Workload]]:
    """GPUCOLLOC_MIX (a JSON list of workloads with counts, or a list of such lists) -> each mix's workloads."""
    try:
        items = json.loads(text)
        mixes = items if items and all(isinstance(item, list) for item in items) else [items]
        jobs = [[Workload.from_dict({k: v for k, v in item.items() if k != "count"})
                 for item in mix for _ in range(int(item.get("count", 1)))] for mix in mixes]
    except (ValueError, TypeError, AttributeError) as error:
        raise pytest.UsageError(f"GPUCOLLOC_MIX is not a JSON list of workloads with counts: {error}") from None
    if not all(jobs):
        raise pytest.UsageError("GPUCOLLOC_MIX names a mix of no job")
    return jobs


def _count(text: str) -> int:
    """How many mixes the test is run for: a text that does not parse still makes one test, which says why."""
    try:
        items = json.loads(text)
    except ValueError:
        return 1
    return len(items) if isinstance(items, list) and items and all(isinstance(i, list) for i in items) else 1


@pytest.mark.skipif(not os.environ.get("GPUCOLLOC_MIX"), reason="GPUCOLLOC_MIX names no mix (pytest-gpucolloc "
                    "advise prints the command for a mix it predicted)")
@pytest.mark.parametrize("mix", range(_count(os.environ.get("GPUCOLLOC_MIX", ""))))
def test_mix(collocate, mix):
    collocate(mixes_of(os.environ["GPUCOLLOC_MIX"])[mix])
