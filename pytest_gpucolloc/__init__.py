"""pytest-gpucolloc: a performance-regression suite for GPU collocation, as a pytest plugin."""
from importlib.metadata import PackageNotFoundError, version

from .scenario import ScenarioResult
from .workloads import Workload, known_workloads

try:  # the installed distribution's version (pyproject.toml), the one number to bump
    __version__ = version("pytest-gpucolloc")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
__all__ = ["Workload", "ScenarioResult", "known_workloads", "__version__"]
