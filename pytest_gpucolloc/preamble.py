"""What a session says before anything runs: pytest's header lines (the modes and device, the machine warm-up, what
was saved or cleaned up) and, once collected, how long the selected scenarios may take. Read from the session
(``session.CollocSession``); it changes nothing but starting the live progress line."""
from __future__ import annotations

import contextlib

from . import benchmark_api, progress, report, timings
from .device import DeviceUnavailable
from .table_fit import terminal_width, wrapped
from .words import count

SCENARIO_OVERHEAD_S = 5.0  # start-up before warm-up (spawn, import torch, CUDA context, build), for time estimates


def machine_warmup_line(s) -> str:
    limit = s.machine_warmup_limit()
    if s.device().gpu is None:
        return "gpucolloc: machine warm-up: none on the CPU (nothing to warm)"
    if not limit:
        return "gpucolloc: machine warm-up: off (--colloc-machine-warmup)"
    return (f"gpucolloc: machine warm-up: a GPU load before the first measurement until power and SM clock are "
            f"steady, at most {limit:g} s (--colloc-machine-warmup)")


def header_lines(s, config) -> list[str]:
    try:
        where = s.device().reason
    except DeviceUnavailable as exc:
        where = str(exc)
    lines = [f"gpucolloc: modes {', '.join(s.modes)}; {where}"]
    with contextlib.suppress(DeviceUnavailable):
        lines.append(machine_warmup_line(s))
    if s.autosaved:
        lines.append(f"gpucolloc: --colloc-gate saves this run into "
                     f"{benchmark_api.storage_path(config.getoption('benchmark_storage', None))} as "
                     "--benchmark-autosave does: the next gated runs judge against it")
    if s.stale_removed:
        lines.append(f"gpucolloc: removed {len(s.stale_removed)} directories (and their MPS daemons) left "
                     f"by killed runs: {', '.join(s.stale_removed)}")
    if s.orphans_killed:
        lines.append(f"gpucolloc: killed {len(s.orphans_killed)} processes that workers of killed runs had "
                     f"started: pids {', '.join(map(str, s.orphans_killed))}")
    return [wrapped(line, terminal_width()) for line in lines]  # as wide as the summary's tables


def collection_lines(s, config, items) -> list[str]:
    """How long the selected scenarios may take, and what was left out; starts the live progress line."""
    scenarios = [item for item in items if "collocate" in getattr(item, "fixturenames", ())]
    lines = []
    if scenarios:
        settings = s.settings()
        rounds = max(settings.max_rounds, settings.rounds)
        each = SCENARIO_OVERHEAD_S + settings.warmup_s + rounds * settings.round_s
        total = report.duration(len(scenarios) * each)
        lines.append(f"gpucolloc: {count(len(scenarios), 'scenario')}, at most about {total} ({each:.0f} s "
                     "each at the longest warm-up and the most rounds), " + ("plus each distinct job measured "
                     "alone once" if s.options.colloc_alone else "no job measured alone (--colloc-alone=off)"))
        last = timings.last_seconds(config, s.machine_kind(), settings) if s.xdist_index is None else {}
        if estimate := timings.expected([item.nodeid for item in scenarios], last, each):
            lines.append(estimate)
        if s.xdist_index is None:  # the live progress of these scenarios (xdist workers write nothing)
            progress.start(config.pluginmanager.get_plugin("terminalreporter"), [i.nodeid for i in scenarios], last)
    if s.deselected_full:
        lines.append(f"gpucolloc: {count(s.deselected_full, 'scenario')} of the full matrix (marker "
                     "gpucolloc_full) deselected; --colloc-full runs them")
    return [wrapped(line, terminal_width()) for line in lines]  # as wide as the summary's tables
