"""Sharing modes, one module each, behind ``base.SharingMode``; ``MODES`` is the registry (its order is the
order of every listing and legend)."""
from __future__ import annotations

from .base import ModeConfigError, ModeFailed, ModeUnavailable, SharingMode, Target, WorkerCheckFailed
from .mig import MigMode
from .mps import MpsMode, PartitionedMpsMode
from .mps_half import HalfMpsMode
from .naive import NaiveMode
from .sequential import SequentialMode

MODES: dict[str, type[SharingMode]] = {
    mode.name: mode for mode in (SequentialMode, NaiveMode, MpsMode, PartitionedMpsMode, HalfMpsMode, MigMode)
}

# Colours for modes that name none, in registry order (tab:red is left out: it marks regressions).
SPARE_COLOURS = ["tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:grey", "tab:blue", "tab:green",
                 "tab:purple", "tab:orange"]


def _colours() -> dict[str, str]:
    # a mode's own colour, not one inherited from the mode it extends (mps-half is not drawn as mps)
    named = {name: vars(mode)["colour"] for name, mode in MODES.items() if vars(mode).get("colour")}
    spare = [c for c in SPARE_COLOURS if c not in named.values()] or SPARE_COLOURS
    unnamed = [name for name in MODES if name not in named]
    return {name: named.get(name) or spare[unnamed.index(name) % len(spare)] for name in MODES}


MODE_COLOURS: dict[str, str] = _colours()  # a mode has one colour in every figure


def parse_modes(text: str) -> list[str]:
    """``"sequential,naive"`` -> names in the given order; unknown names are a usage error."""
    names = [part.strip() for part in (text or "").split(",") if part.strip()]
    if not names:
        raise ValueError(f"--gpu-mode needs at least one mode; valid modes: {', '.join(MODES)}")
    unknown = [n for n in names if n not in MODES]
    if unknown:
        raise ValueError(f"unknown --gpu-mode {', '.join(map(repr, unknown))}; valid modes: {', '.join(MODES)}")
    return list(dict.fromkeys(names))


__all__ = ["MODES", "MODE_COLOURS", "parse_modes", "SharingMode", "Target", "ModeConfigError", "ModeFailed",
           "ModeUnavailable", "WorkerCheckFailed"]
