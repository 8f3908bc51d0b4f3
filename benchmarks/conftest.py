"""The project's benchmark suite saves every run (pytest-benchmark's ``--benchmark-autosave``, unless the run names
its own ``--benchmark-save``), so that ``pytest-gpucolloc gate``, ``history``, ``report`` and ``advise`` have
something to read after the first ``pytest benchmarks/``."""
import pytest
from pytest_benchmark.utils import get_tag


@pytest.hookimpl(tryfirst=True)  # before pytest-benchmark reads its options
def pytest_configure(config):
    if not config.getoption("benchmark_save", None) and not config.getoption("benchmark_autosave", None):
        config.option.benchmark_autosave = get_tag()  # the name --benchmark-autosave gives: commit and time
