"""Sharing modes, one module each, behind ``base.SharingMode``."""
from __future__ import annotations

from .base import ModeConfigError, SharingMode, Target, WorkerCheckFailed
from .mig import MigMode
from .mps import MpsMode, PartitionedMpsMode
from .naive import NaiveMode
from .sequential import SequentialMode

MODES: dict[str, type[SharingMode]] = {
    mode.name: mode for mode in (SequentialMode, NaiveMode, MpsMode, PartitionedMpsMode, MigMode)
}


def parse_modes(text: str) -> list[str]:
    """``"sequential,naive"`` -> names in the given order; unknown names are a usage error."""
    names = [part.strip() for part in (text or "").split(",") if part.strip()]
    if not names:
        raise ValueError(f"--gpu-mode needs at least one mode; valid modes: {', '.join(MODES)}")
    unknown = [n for n in names if n not in MODES]
    if unknown:
        raise ValueError(f"unknown --gpu-mode {', '.join(map(repr, unknown))}; valid modes: {', '.join(MODES)}")
    return list(dict.fromkeys(names))


__all__ = ["MODES", "parse_modes", "SharingMode", "Target", "ModeConfigError", "WorkerCheckFailed"]
