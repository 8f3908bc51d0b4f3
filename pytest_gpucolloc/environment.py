"""The environment every process the plugin starts (workers, their fork server, a probe of torch) begins from: the
caller's, less the variables that a sharing mode or the controller decides, with this package importable."""
from __future__ import annotations

import os
from pathlib import Path

from .process_marks import MARK_ENV
from .protocol import MSG_FD_ENV

PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)
# Variables a worker must never inherit: the mode decides them.
_CONTROLLED_PREFIXES = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_", "NVIDIA_VISIBLE_DEVICES", MSG_FD_ENV, MARK_ENV)


def base_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CONTROLLED_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, os.getcwd(), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env
