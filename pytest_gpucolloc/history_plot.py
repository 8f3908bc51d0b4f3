"""The history figures: each scenario's saved runs per physical GPU, oldest first, with the gate's verdicts, its
baseline band and the level shifts (``history_shifts``)."""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from . import history_shifts
from .history import History, SavedRun, short_name
from .plots import REGRESSED, Figure, plt, slug, thousands


def figures(loaded: History, recent: list[SavedRun] | None = None) -> Iterator[Figure]:
    """Each scenario's saved runs per physical GPU (two or more) among the ``recent`` runs (default: all), oldest
    first, labelled by time and by commit where it changes; the legend inside says what the marks mean: the gate's
    verdicts, its baseline band (from the baseline down by the threshold), runs that were not comparable (hollow)
    and level shifts (dashed, found over the whole history). Older runs are not drawn: a note says how many, and
    their level shifts."""
    recent = loaded.runs if recent is None else recent
    shown = {run.run_id for run in recent}
    shifts = defaultdict(list)
    for shift in history_shifts.find(loaded)[0]:
        shifts[(shift.scenario, shift.gpu)].append(shift)
    series: dict[tuple[str, str], list] = defaultdict(list)
    for run in recent:  # only these runs' files are read
        for name, scenario in run.scenarios.items():
            series[(name, run.gpu(name))].append((run, scenario))
    older = Counter((name, run.gpu(name)) for run in loaded.runs if run.run_id not in shown for name in run.scenarios)
    for (name, gpu), points in sorted(series.items()):
        if len(points) > 1:  # one run is no history: the run's own figures show it
            figure = _history_figure(name, gpu, points, [s for s in shifts[(name, gpu)] if s.run_id in shown])
            before = [s for s in shifts[(name, gpu)] if s.run_id not in shown]
            if older[(name, gpu)]:
                figure.notes.append(f"{older[(name, gpu)]:,} older run(s) not drawn (--last, --since)"
                                    + (": level shifts " + ", ".join(f"{s.change:+.1%} at {s.run_id.split('_')[0]} "
                                                                     f"({s.datetime[:10]})" for s in before)
                                       if before else ", no level shift among them"))
            yield figure


VERDICT_MARKS: dict[str, dict[str, Any]] = {
    "regressed": REGRESSED, "improved": {"marker": "^", "color": "tab:green", "s": 50, "zorder": 3},
    "unchanged": {"marker": "o", "color": "tab:blue", "s": 26, "zorder": 3},
    "inconclusive": {"marker": "o", "color": "tab:orange", "s": 30, "zorder": 3}}
RUN_MARK: dict[str, Any] = {"marker": "o", "color": "tab:grey", "s": 20, "zorder": 3}  # a run the gate did not judge
MANY_POINTS = 300  # beyond this many runs in a figure, marks shrink so that the line between them stays readable


def _history_figure(name: str, gpu: str, points: list, shifts: list) -> Figure:
    figure, axes = plt.subplots(figsize=(8, 3.6), layout="constrained")
    xs = list(range(len(points)))
    axes.plot(xs, [s.throughput for _, s in points], color="lightgrey", zorder=1)
    handles: list[Any] = []
    size = 1.0 if len(points) <= MANY_POINTS else max(0.1, MANY_POINTS / len(points))
    groups: dict[tuple[str, bool], list[int]] = defaultdict(list)  # one scatter per kind of mark, not per run
    for x, (_, scenario) in zip(xs, points):
        groups[(scenario.verdict or "", bool(scenario.throttled or scenario.foreign_pids))].append(x)
    for (verdict, hollow), where in groups.items():
        mark = dict(VERDICT_MARKS.get(verdict, RUN_MARK))
        mark["s"] *= size
        if hollow:
            mark["facecolors"], mark["edgecolors"] = "none", mark.pop("color")
        axes.scatter(where, [points[x][1].throughput for x in where], **mark)
    for verdict in sorted({v for v, _ in groups}, key=lambda v: v not in VERDICT_MARKS):
        mark = VERDICT_MARKS.get(verdict, RUN_MARK)
        handles.append(Line2D([], [], linestyle="", marker=mark.get("marker"), color=mark["color"],
                              label=f"gate: {verdict}" if verdict else "a run (not gated)"))
    if any(hollow for _, hollow in groups):
        handles.append(Line2D([], [], marker="o", linestyle="", markerfacecolor="none", color="tab:grey",
                              label="not comparable (throttled, or other processes)"))
    regressed = [x for x in groups.get(("regressed", False), []) + groups.get(("regressed", True), [])
                 if (points[x][1].gate or {}).get("change") is not None]
    for x in regressed[-20:]:  # the newest: more would cover the figure
        scenario = points[x][1]
        axes.annotate(f"{scenario.gate['change']:+.1%}", (x, scenario.throughput), textcoords="offset points",
                      xytext=(0, -14), ha="center", fontsize=7, color="tab:red")
    gates = [(points[x][1].gate or {}) for x in xs]
    if any(g.get("baseline") for g in gates):  # what the gate compared each run with: its baseline, the threshold below
        high = [g["baseline"] if g.get("baseline") else math.nan for g in gates]
        low = [g["baseline"] * (1 - g.get("threshold", 0.0)) if g.get("baseline") else math.nan for g in gates]
        axes.fill_between(xs, low, high, step="mid", color="tab:orange", alpha=0.25, linewidth=0)
        handles.append(Patch(color="tab:orange", alpha=0.25, label="gate's band: its baseline down to the threshold"))
    index = {run.run_id: x for x, (run, _) in zip(xs, points)}
    for shift in shifts:
        axes.axvline(index[shift.run_id] - 0.5, color="tab:purple", linestyle="--")
    for shift in shifts[-6:]:  # the legend names the newest; the rest are drawn
        handles.append(Line2D([], [], color="tab:purple", linestyle="--",
                              label=f"level shift {shift.change:+.1%} (p={shift.p_value:.1g})"))
    axes.legend(handles=handles, fontsize=7, loc="best", framealpha=0.85)
    labels = _run_labels([run for run, _ in points])  # a tick where there is a label: not thousands of them
    axes.set_xticks(list(labels), list(labels.values()), fontsize=7, rotation=45, ha="right", rotation_mode="anchor")
    axes.yaxis.set_major_formatter(FuncFormatter(thousands))
    axes.margins(y=0.15)  # room for a regressed run's change under it
    axes.set(ylabel="aggregate samples/s")
    axes.set_title(f"{short_name(name)}\non {gpu}", fontsize=9)
    axes.grid(alpha=0.3)
    return Figure("History per scenario and physical GPU", f"history-{slug(short_name(name))}-{slug(gpu)}",
                  f"{short_name(name)} on {gpu}: its saved runs, oldest first", figure)


def _run_labels(runs: list[SavedRun]) -> dict[int, str]:
    """Position -> date and time of the run, and its commit where the commit changes; at most about 25 labels (where
    commits change more often than that, evenly spaced runs are labelled)."""
    every = max(1, math.ceil(len(runs) / 25))
    commits = [(run.commit or "")[:8] for run in runs]
    changes = [i for i in range(len(runs)) if i == 0 or commits[i] != commits[i - 1]]
    changes = changes if len(changes) <= 25 else []  # a commit per run: the times alone
    return {i: runs[i].datetime[5:16].replace("T", " ") + (f"\n{commits[i]}" if commits[i] and i in changes else "")
            for i in sorted(set(range(0, len(runs), every)) | set(changes))}
