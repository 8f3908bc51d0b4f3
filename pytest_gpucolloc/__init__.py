"""pytest-gpucolloc: a performance-regression suite for GPU collocation, as a pytest plugin."""
from .machine import PLUGIN_VERSION as __version__
from .scenario import ScenarioResult
from .workloads import Workload, known_workloads

__all__ = ["Workload", "ScenarioResult", "known_workloads", "__version__"]
