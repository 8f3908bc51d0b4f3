"""The figures of saved runs (matplotlib, no display needed), drawn once for ``pytest-gpucolloc plot`` (files) and
``pytest-gpucolloc report`` (a page that links the same files).

The rules every figure keeps:
- one machine kind per figure (one GPU model and driver, or CPU smoke mode): CPU smoke runs never share a figure
  with GPU runs, and a mode has one colour everywhere;
- a figure grows with the distinct scenarios, never with the number of runs: several runs of a scenario are one row
  or one set of dots (their median drawn), and many scenarios are split into several figures of a readable size;
- a run the gate judged ``regressed`` is a red downward triangle wherever it is drawn.
"""
from __future__ import annotations

import math
import re
import statistics
import textwrap
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from .history import SavedRun
from .modes import MODE_COLOURS, MODES
from .modes.mig import MigMode
from .record import ScenarioRecord, jobs

# a regressed run, in every figure
REGRESSED: dict[str, Any] = {"marker": "v", "color": "tab:red", "s": 70, "zorder": 4}
PANELS = 9  # small multiples per scaling figure
ROWS = 36  # rows per row figure: more are split into several figures

Entries = list[tuple[str, ScenarioRecord]]


@dataclass
class Figure:
    section: str  # the heading it belongs under
    stem: str  # file name without the extension
    caption: str
    figure: Any  # a matplotlib figure, None once written
    notes: list[str] = field(default_factory=list)  # lines shown under it (e.g. why a MIG layout cannot exist)


def slug(text: str) -> str:
    """A file-name-safe form of a scenario or machine name."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", text).strip("-")[:120] or "scenario"


def machine_kind(run: SavedRun, scenario: ScenarioRecord) -> str:
    """What a figure may put side by side: one GPU model and driver, or CPU smoke mode."""
    if scenario.device == "cpu":
        return "CPU smoke mode (batches capped, small inputs)"
    name = (scenario.gpu or {}).get("name") or run.machine.get("gpu_name") or "GPU"
    return f"{name}, driver {run.machine.get('driver_version', '?')}"


def by_kind(runs: list[SavedRun]) -> dict[str, Entries]:
    kinds: dict[str, Entries] = defaultdict(list)
    for run in runs:
        for name, scenario in run.scenarios.items():
            kinds[machine_kind(run, scenario)].append((name, scenario))
    return dict(sorted(kinds.items()))


def regressed(scenario: ScenarioRecord) -> bool:
    return scenario.verdict == "regressed"


def _alone(mode: str) -> bool:
    """The mode's scenarios are the jobs alone (the baseline): nothing shared to show."""
    return mode in MODES and MODES[mode].alone


def mode_order(mode: str) -> int:
    return list(MODES).index(mode) if mode in MODES else len(MODES)


def thousands(value: float, _position=None) -> str:
    return f"{value / 1000:g}k" if abs(value) >= 1000 else f"{value:g}"


def _mode_handles(modes) -> list:
    return [Patch(color=MODE_COLOURS.get(mode), label=mode) for mode in sorted(modes, key=mode_order)]


def in_chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)] or [[]]


def part_stem(base: str, part: int, parts: int) -> str:
    return base if parts == 1 else f"{base}-{part + 1}"


def panel_grids(keys: list, columns: int, width: float, height: float) -> Iterator[tuple[int, int, list, Any, Any]]:
    """Small multiples, at most PANELS a figure and ``columns`` wide: (part, parts, its keys, figure, axes grid),
    the grid's unused axes hidden."""
    chunks = in_chunks(keys, PANELS)
    for part, chunk in enumerate(chunks):
        cols = min(columns, len(chunk))
        rows = math.ceil(len(chunk) / cols)
        figure, grid = plt.subplots(rows, cols, figsize=(width * cols, height * rows + 0.8), squeeze=False,
                                    layout="constrained")
        for axes in grid.flat[len(chunk):]:
            axes.set_visible(False)
        yield part, len(chunks), chunk, figure, grid


def for_runs(runs: list[SavedRun]) -> Iterator[Figure]:
    """Every figure of these runs, per machine kind, in page order (drawn one kind and figure type at a time)."""
    kinds = by_kind(runs)
    for draw in (scaling, mixes, per_job, efficiency):
        for kind, entries in kinds.items():
            yield from draw(kind, entries)


def scaling(kind: str, entries: Entries) -> list[Figure]:
    """Aggregate throughput against processes, a panel per workload: one colour per mode, a dot per run with its
    round spread, the line through the runs' median at each count; N x the job alone (dashed) and one process with
    the summed batch (dotted) where measured."""
    curves: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    alone_runs: dict[str, list[float]] = defaultdict(list)
    ideal: dict[str, list] = defaultdict(list)
    for _, scenario in entries:
        if not scenario.homogeneous:
            continue
        label = scenario.workloads[0]
        spread = statistics.stdev(scenario.rounds) if len(scenario.rounds) > 1 else 0.0
        curves[label][scenario.mode].append((scenario.n_workers, scenario.throughput, spread, regressed(scenario)))
        if alone := scenario.alone_of(0):
            alone_runs[label].append(alone)
        if scenario.ideal_throughput:
            ideal[label].append((scenario.n_workers, scenario.ideal_throughput))
    if not curves:
        return []
    figures = []
    for part, parts, labels, figure, grid in panel_grids(sorted(curves), 3, 3.9, 2.9):
        for axes, label in zip(grid.flat, labels):
            alone = statistics.median(alone_runs[label]) if alone_runs[label] else None
            _scaling_panel(axes, label, curves[label], alone, ideal[label])
        modes = {mode for label in labels for mode in curves[label]}
        handles = _mode_handles(modes) + [
            Line2D([], [], linestyle="--", color="black", linewidth=1, label="N x the job alone"),
            Line2D([], [], linestyle=":", color="black", label="one process, summed batch")]
        if any(point[3] for label in labels for points in curves[label].values() for point in points):
            handles.append(Line2D([], [], linestyle="", marker="v", color="tab:red", label="gate: regressed"))
        figure.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8, frameon=False)
        figure.suptitle(f"Aggregate throughput against processes ({kind})", fontsize=10)
        stem = part_stem(f"scaling-{slug(kind)}", part, parts)
        figures.append(Figure("Scaling: aggregate throughput per sharing mode", stem,
                              f"Aggregate throughput per sharing mode ({kind}): a dot per run, bars: its "
                              "round-to-round spread; the line joins the median of the runs", figure))
    return figures


def _scaling_panel(axes, label: str, modes: dict[str, list], alone: float | None, ideal: list) -> None:
    counts = sorted({point[0] for points in modes.values() for point in points})
    ticks = sorted({1, *counts}) if alone else counts  # the job alone (1) is known: from there
    for mode, points in sorted(modes.items(), key=lambda item: mode_order(item[0])):
        colour = MODE_COLOURS.get(mode)
        several = len(points) > len({p[0] for p in points})
        axes.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points], fmt="o",
                      markersize=4, capsize=2, color=colour, alpha=0.45 if several else 0.85)
        at = sorted({p[0] for p in points})
        axes.plot(at, [statistics.median(p[1] for p in points if p[0] == x) for x in at], color=colour)
        if bad := [p for p in points if p[3]]:
            axes.scatter([p[0] for p in bad], [p[1] for p in bad], **REGRESSED)
    if alone and len(ticks) > 1:
        axes.plot(ticks, [n * alone for n in ticks], linestyle="--", color="black", linewidth=1)
    if ideal:
        xs, ys = zip(*sorted(ideal))
        axes.plot(xs, ys, linestyle=":", color="black")
    axes.set_title("\n".join(textwrap.wrap(label, 40)), fontsize=8)
    axes.set_ylim(bottom=0)  # throughput from zero: a lone point or a flat curve is not magnified
    axes.set_xticks(ticks)
    axes.tick_params(labelsize=7)
    axes.yaxis.set_major_formatter(FuncFormatter(thousands))
    axes.set_xlabel("processes", fontsize=7)
    axes.set_ylabel("samples/s", fontsize=7)
    axes.grid(alpha=0.3)


def _medians(entries: Entries, value) -> dict[tuple[str, int], dict[str, list]]:
    """(jobs, count) -> mode -> the values of its runs, for scenarios where ``value`` says something."""
    rows: dict[tuple[str, int], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for _, scenario in entries:
        found = value(scenario)
        if found is not None:
            rows[(jobs(scenario), scenario.n_workers)][scenario.mode].append(found)
    return rows


def _row_order(key: tuple[str, int]) -> tuple:
    label, n = key
    return ("+" in label, label, n)  # the workloads, then the mixes


def mixes(kind: str, entries: Entries) -> list[Figure]:
    """Mixed scenarios (different jobs together): each mode's speedup, a row per mix; a mix whose MIG layout cannot
    exist on this GPU says so in its row, and under the figure with the planner's reason."""
    mixed = [(name, s) for name, s in entries if not s.homogeneous and s.n_workers > 1 and not _alone(s.mode)]
    rows = _medians(mixed, lambda s: s.speedup)
    impossible = {jobs(s): s.mig_cannot_exist for _, s in mixed if s.mig_cannot_exist}
    if not rows:
        return []
    keys = sorted(rows, key=_row_order)
    return _rows_figure("Mixed jobs", f"mixes-{slug(kind)}", f"Mixed jobs: speedup per sharing mode, median of the "
                        f"runs ({kind}); 1 (dashed) is no gain over running the jobs one after another",
                        f"Mixed jobs ({kind})", keys,
                        [("speedup: the jobs' progress together against one after another", rows, False)],
                        reference=1.0, flagged={key: "MIG: this layout cannot exist on this GPU" for key in keys
                                                if key[0] in impossible},
                        notes=[f"{mix} under mig: {reason}" for mix, reason in impossible.items()])


def _rows_figure(section: str, stem: str, caption: str, title: str, keys: list, panels: list,
                 reference: float | None = None, flagged: dict | None = None, notes: list[str] | None = None
                 ) -> list[Figure]:
    """Rows of (jobs, count), a dot per mode (median of its runs) in each panel; ``panels`` holds (x label,
    key -> mode -> [values] or [ranges], logarithmic x). ``reference``: a dashed line at that x; ``flagged``: a
    row's note, written in it. Split into figures of at most ROWS rows."""
    chunks = in_chunks(keys, ROWS)
    figures = []
    for part, chunk in enumerate(chunks):
        figure, grid = plt.subplots(1, len(panels), figsize=(4.4 * len(panels) + 3.5, 0.24 * len(chunk) + 1.6),
                                    sharey=True, squeeze=False, layout="constrained")
        modes = set()
        for axes, (xlabel, data, log) in zip(grid[0], panels):
            for row, key in enumerate(chunk):
                if row:
                    axes.axhline(row - 0.5, color="#eee", linewidth=0.6, zorder=0)
                if flagged and key in flagged:
                    axes.text(0.99, row, flagged[key], transform=axes.get_yaxis_transform(), ha="right",
                              va="center", fontsize=7, color=MODE_COLOURS[MigMode.name])
                present = sorted(data.get(key, {}), key=mode_order)
                for k, mode in enumerate(present):
                    y = row + (k - (len(present) - 1) / 2) * min(0.18, 0.7 / len(present))
                    values = data[key][mode]
                    colour = MODE_COLOURS.get(mode)
                    modes.add(mode)
                    if isinstance(values[0], tuple):  # a range: each job's share, slowest to fastest
                        low, high = values[0]
                        axes.plot([low, high], [y, y], color=colour, linewidth=1.2)
                        axes.scatter([low], [y], color=colour, s=16, zorder=3)
                        axes.scatter([high], [y], color=colour, s=16, zorder=3, facecolors="white")
                    else:
                        axes.scatter([statistics.median(values)], [y], color=colour, s=18, zorder=3)
            if log:
                axes.set_xscale("log")
                axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
            if reference is not None:
                axes.axvline(reference, color="black", linestyle="--", linewidth=1)
            axes.set_xlabel(xlabel, fontsize=8)
            axes.tick_params(labelsize=7)
            axes.grid(alpha=0.3)
        first = grid[0][0]
        labels = [label if "+" in label or n == 1 else f"{n}x {label}" for label, n in chunk]  # a mix names its jobs
        first.set_yticks(range(len(chunk)), labels, fontsize=7)
        first.set_ylim(len(chunk) - 0.5, -0.5)
        figure.legend(handles=_mode_handles(modes), loc="outside lower center", ncol=len(modes), fontsize=8,
                      frameon=False)
        figure.suptitle(title + (f" ({part + 1} of {len(chunks)})" if len(chunks) > 1 else ""), fontsize=10)
        figures.append(Figure(section, part_stem(stem, part, len(chunks)), caption, figure,
                              notes if part == len(chunks) - 1 and notes else []))
    return figures


def per_job(kind: str, entries: Entries) -> list[Figure]:
    """How fairly the GPU was shared: per workload (at the most copies measured) and per mix, each mode's slowest
    and fastest job relative to the same job alone (medians of the runs, job by job)."""
    shares: dict[tuple[str, int], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    most: dict[str, int] = defaultdict(int)
    for _, scenario in entries:
        if not _alone(scenario.mode) and scenario.n_workers > 1:
            most[jobs(scenario)] = max(most[jobs(scenario)], scenario.n_workers)
    for _, scenario in entries:
        alone = [scenario.alone_of(i) for i in range(scenario.n_workers)]
        values = [w.throughput / a for w, a in zip(scenario.workers, alone) if a]
        key = (jobs(scenario), scenario.n_workers)
        if not _alone(scenario.mode) and len(values) > 1 and most[key[0]] == key[1]:
            shares[key][scenario.mode].append(values)
    if not shares:
        return []
    ranges = {key: {mode: [_slowest_to_fastest(runs)] for mode, runs in modes.items()} for key, modes in shares.items()}
    return _rows_figure("Each job while sharing", f"per-job-{slug(kind)}",
                        f"Each job's throughput while sharing, relative to the same job alone ({kind}): per mode "
                        "the slowest job (filled) to the fastest (hollow), medians of the runs; workloads at the most "
                        "copies measured", f"How fairly each mode shares ({kind})",
                        sorted(ranges, key=_row_order), [("each job's share of its speed alone", ranges, False)],
                        reference=1.0)


def _slowest_to_fastest(runs: list[list[float]]) -> tuple[float, float]:
    each = [statistics.median(job) for job in zip(*runs)]  # job by job over the runs
    return min(each), max(each)


def efficiency(kind: str, entries: Entries) -> list[Figure]:
    """Samples per joule and SM activity per workload, count and mode, where GPU telemetry measured them."""
    joules = _medians(entries, lambda s: s.samples_per_joule or None)
    activity = _medians(entries, lambda s: s.sm_activity)
    keys = sorted(set(joules) | set(activity), key=_row_order)
    if not keys:
        return []
    return _rows_figure("Energy and SM activity", f"efficiency-{slug(kind)}",
                        f"Samples per joule and SM activity per scenario and mode, medians of the runs ({kind})",
                        f"Energy and SM activity ({kind})", keys,
                        [("samples per joule (GPU energy), logarithmic", joules, True),
                         ("SM activity (%)", activity, False)])


def write(figures: Iterable[Figure], out: Path, fmt: str = "png") -> list[tuple[Figure, Path]]:
    """Save each figure once, as ``out/<stem>.<fmt>``, and close it (a figure is drawn only when the one before it
    is saved: a page of many is never all in memory)."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for item in figures:
        path = out / f"{item.stem}.{fmt}"
        item.figure.savefig(path, dpi=100, bbox_inches="tight")  # long labels widen the picture, never cut off
        plt.close(item.figure)
        item.figure = None
        written.append((item, path))
    return written
