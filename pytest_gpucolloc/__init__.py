"""pytest-gpucolloc: a performance-regression suite for GPU collocation, as a pytest plugin."""
from __future__ import annotations

import importlib

# Loaded when first asked for (PEP 562): a command such as `pytest-gpucolloc gate` imports the package but needs
# none of the measuring code (pytest, the modes, the worker pool: a third of its start-up).
_EXPORTS = {"Workload": "workloads", "known_workloads": "workloads", "ScenarioResult": "scenario",
            "__version__": "machine"}

__all__ = ["Workload", "ScenarioResult", "known_workloads", "__version__"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f".{_EXPORTS[name]}", __name__)
    return getattr(module, "PLUGIN_VERSION" if name == "__version__" else name)
