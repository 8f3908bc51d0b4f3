"""pytest-gpucolloc: a performance-regression suite for GPU collocation, as a pytest plugin."""
from .scenario import ScenarioResult
from .workloads import Workload, known_workloads

__version__ = "0.1.0"
__all__ = ["Workload", "ScenarioResult", "known_workloads", "__version__"]
