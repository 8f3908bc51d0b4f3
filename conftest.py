import json
import os
from pathlib import Path

import pytest
import scipy.stats  # noqa: F401  (see below)

# pytester drives real pytest runs of the plugin in the integration tests. Its in-process runs drop the modules
# they imported afterwards, and a C extension (numpy, under scipy) cannot be imported twice in one process: the
# gate's statistics are loaded here once, before any in-process run.
pytest_plugins = ["pytester"]


@pytest.fixture
def evidence():
    """Record a measured fact of a GPU-tier test: ci/gpu-check collects them in one JSON file
    (GPUCOLLOC_EVIDENCE), one key per fact; elsewhere this does nothing."""
    def record(name: str, data) -> None:
        path = os.environ.get("GPUCOLLOC_EVIDENCE")
        if path:
            known = json.loads(Path(path).read_text()) if Path(path).exists() else {}
            known[name] = data
            Path(path).write_text(json.dumps(known, indent=2))
    return record


@pytest.fixture
def target():
    """The GPU as the target of a GPU-tier test (run_scenario's ``target``), with its scratch directory."""
    from pytest_gpucolloc.device import standalone_target

    with standalone_target("cuda") as where:
        yield where

