"""The plugin's markers: what they are (declared to pytest), which tests invite the plugin, and what a test's markers
ask for (its gate threshold, A/B instead of history, fresh-process repeats), each checked where it was written."""
from __future__ import annotations

import pytest

from .options import MAX_THRESHOLD, Config
from .verdict import Policy

DECLARED = [
    "gpucolloc_quick: scenario of the quick tier (also run in CPU smoke mode)",
    "gpucolloc_full: scenario of the full matrix, deselected unless --colloc-full is given",
    "gpucolloc_gpu: test needs a real NVIDIA GPU; skipped with the reason without one",
    "gpucolloc_mig_layout(layout): MIG layout of this scenario, e.g. '3g,2g,1g*2'",
    "gpucolloc_gate(threshold=PERCENT, by='history'|'ab'): this scenario's regression threshold; by='ab': the "
    "history gate measures and saves it but leaves judging it to paired A/B (pytest-gpucolloc ab)",
    "gpucolloc_repeats(K): start this scenario's workers K times afresh (see --colloc-repeats)",
]
FIXTURES = {"collocate", "gpu_mode", "mps_daemon"}


def uses_plugin(item) -> bool:
    """A collected test that invites the plugin: it uses one of its fixtures or markers."""
    return bool(FIXTURES & set(getattr(item, "fixturenames", ()))) \
        or any(mark.name.startswith("gpucolloc_") for mark in item.iter_markers())


def gate_policy(node, options: Config) -> Policy | None:
    """The gate's policy for the test (its marker may set the threshold); None where it is left to A/B (``by="ab"``)."""
    if left_to_ab(node):  # its fresh processes differ by more than a threshold: history cannot decide
        return None
    marker = node.get_closest_marker("gpucolloc_gate")
    threshold = (marker.kwargs if marker else {}).get("threshold", options.colloc_gate_threshold)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= MAX_THRESHOLD:
        pytest.fail(f"gpucolloc_gate(threshold=...) must be a percentage between 0 and {MAX_THRESHOLD:g}, "
                    f"got {threshold!r}", pytrace=False)
    return Policy(threshold=threshold / 100, alpha=options.colloc_gate_alpha,
                  runs=options.colloc_gate_runs, min_runs=options.colloc_gate_min_runs)


def left_to_ab(node) -> bool:
    """Whether the test's gpucolloc_gate marker leaves judging it to paired A/B (``by="ab"``); checked in every
    run, gated or not, so that a misspelt value fails where it was written, not first in CI."""
    marker = node.get_closest_marker("gpucolloc_gate")
    by = marker.kwargs.get("by", "history") if marker else "history"
    if by not in ("history", "ab"):
        pytest.fail(f"gpucolloc_gate(by=...) is 'history' (the gate judges it against its saved runs) or 'ab' "
                    f"(paired A/B judges it), got {by!r}", pytrace=False)
    return by == "ab"


def repeats(node, default: int) -> int:
    marker = node.get_closest_marker("gpucolloc_repeats")
    if marker is None:
        return default
    value = marker.args[0] if marker.args else marker.kwargs.get("k")
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000:
        pytest.fail(f"gpucolloc_repeats(K) takes a whole number of repeats from 1 to 1000, got {value!r}",
                    pytrace=False)
    return value
