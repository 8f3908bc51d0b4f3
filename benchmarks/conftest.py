"""The project's benchmark suite saves every run (pytest-benchmark's ``--benchmark-autosave``, unless the run names
its own ``--benchmark-save``), so that ``pytest-gpucolloc gate``, ``history``, ``report`` and ``advise`` have
something to read after the first ``pytest benchmarks/``."""
import pytest


@pytest.hookimpl(tryfirst=True)  # before pytest-benchmark reads its options
def pytest_configure(config):
    if not config.getoption("benchmark_save", None):
        config.option.benchmark_autosave = True
