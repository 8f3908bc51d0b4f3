"""A service's figures. ``trade_offs``: its p99 against the share of their speed alone its training neighbours kept.
``for_runs``: its latency distribution on HdrHistogram's usual axes, latency (ms) against the percentile on a log
scale of 1/(1 - q), so that p50, p90, p99 and p99.9 are evenly apart and the tail is as visible as the median; one
curve per histogram (an ab arm's requests, or a saved run's). Drawing only: the numbers come from the records.
"""
from __future__ import annotations

import math
import statistics
import textwrap
from collections import defaultdict
from typing import Any

from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from .history import short_name
from .modes import MODE_COLOURS
from .plots import Entries, Figure, by_kind, machine_kind, mode_order, panel_grids, part_stem, plt, slug
from .record import service_as_asked as service_of
from .record import sm_reserved
from .serving import decode, merged
from .words import count

TICKS = (50, 90, 99, 99.9, 99.99)


def _points(histogram) -> tuple[list[float], list[float]]:
    """(1/(1-q), latency ms) along the histogram's recorded values, up to its largest."""
    total = histogram.get_total_count()
    xs, ys, seen = [], [], 0
    for item in histogram.get_recorded_iterator():
        seen += item.count_at_value_iterated_to
        q = min(seen / total, 1 - 1 / (10 * total))  # the last value at a finite x
        xs.append(1 / (1 - q))
        ys.append(histogram.get_highest_equivalent_value(item.value_iterated_to) / 1000)
    return xs, ys


def figure(curves: dict[str, Any], title: str) -> Any:
    """A matplotlib figure: one curve per labelled histogram (empty ones left out)."""
    shown, axes = plt.subplots(figsize=(7.5, 4.2))
    top = 2.0
    for label, histogram in curves.items():
        if not histogram.get_total_count():
            continue
        xs, ys = _points(histogram)
        axes.step(xs, ys, where="post", label=f"{label} ({histogram.get_total_count():,} requests)")
        top = max(top, max(xs))
    axes.set_xscale("log")
    ticks = [t for t in TICKS if 1 / (1 - t / 100) <= top * 1.01]
    axes.set_xticks([1 / (1 - t / 100) for t in ticks], [f"p{t:g}" for t in ticks])
    axes.minorticks_off()
    axes.set_xlim(1, top)
    axes.set_ylim(bottom=0)
    axes.set_xlabel("percentile (log scale of 1 / (1 - q))")
    axes.set_ylabel("latency, ms (scheduled arrival to answer)")
    axes.set_title(title, fontsize=10)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8, loc="upper left")
    shown.tight_layout()
    return shown


CURVES = 8  # runs drawn per scenario: the most recent ones


def for_runs(runs: list) -> list:
    """The report's figures: per serving scenario and machine kind, the latency distribution of each run's requests
    beside its neighbours, the most recent CURVES runs (``plots.Figure``s, drawn here)."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for run in runs:
        for name, scenario in run.scenarios.items():
            encoded = (scenario.serving or {}).get("histogram")
            if encoded and not scenario.serving.get("saturated"):
                found.setdefault((machine_kind(run, scenario), short_name(name)), {})[run.run_id] = decode(encoded)
    figures = []
    for (kind, name), curves in sorted(found.items()):
        shown = dict(list(curves.items())[-CURVES:])
        figures.append(Figure("Serving: latency distributions", f"latency-{slug(kind)}-{slug(name)}",
                              f"{name} on {kind}: each run's request latencies beside its neighbours (the last "
                              f"{count(len(shown), 'run')}; percentile on HdrHistogram's log axis)",
                              figure(shown, f"{name} ({kind})")))
    return figures


def draw_ab(latency: dict[str, list[dict[str, list[dict]]]], labels: tuple[str, str], out, say) -> None:
    """Each serving scenario of an A/B: its latency distribution per arm (every block's requests) in ``out``."""
    for test, blocks in latency.items():
        curves = {label: merged([w for block in blocks for w in block.get(label, [])]) for label in labels}
        name = short_name(test)
        path = out / f"latency-{slug(test)}.png"
        try:
            shown = figure(curves, f"{name}: latency per arm, {count(len(blocks), 'block')}")
            shown.savefig(path, dpi=110)
            plt.close(shown)
        except (OSError, ValueError) as error:  # a picture never costs the verdicts
            say(f"{name}: the latency picture could not be drawn ({error})")
            continue
        say(f"{name}: latency distribution per arm in {path}")


def trade_offs(runs: list) -> list[Figure]:
    """The service/training trade-off of these runs, a figure (or several) per machine kind."""
    return [item for kind, entries in by_kind(runs).items() for item in serving(kind, entries)]


MODE_MARKERS = "osD^P*X<>h"  # a mode's marker beside its colour where modes' points overlap ("v": regressed)


def _mode_marker(mode: str) -> str:
    return MODE_MARKERS[mode_order(mode) % len(MODE_MARKERS)]


def _two_and_five(value: float, _position=None) -> str:
    """A logarithmic axis's minor ticks: only 2 and 5 of each decade are labelled, enough to read without crowding."""
    leading = round(value / 10 ** math.floor(math.log10(value))) if value > 0 else 0
    return f"{value:g}" if leading in (2, 5) else ""


def serving(kind: str, entries: Entries) -> list[Figure]:
    """The service/training trade-off, a panel per service (its label names its rate as asked): each scenario's p99
    against what its training jobs kept of their speed alone, a colour and marker per mode, labelled with its training
    jobs and the SMs reserved for the service; p99 logarithmic, the service alone at the same rate dashed. Several
    runs of a scenario are one point (their medians); a saturated service, whose p99 measures its queue, is hollow."""
    # service -> (mode, training jobs, SMs reserved) -> [(training kept, p99 ms, saturated)]
    points: dict[str, dict[tuple, list]] = defaultdict(lambda: defaultdict(list))
    alone: dict[str, list[float]] = defaultdict(list)
    for _, scenario in entries:
        facts = scenario.serving
        if not facts:
            continue
        service = service_of(facts)
        if facts.get("alone_p99_ms"):
            alone[service].append(facts["alone_p99_ms"])
        if facts.get("training_kept") is not None and facts.get("p99_ms"):
            key = (scenario.mode, facts.get("training_jobs", 0), sm_reserved(scenario))
            points[service][key].append((facts["training_kept"], facts["p99_ms"], bool(facts.get("saturated"))))
    if not points:
        return []
    figures = []
    for part, parts, services, figure, grid in panel_grids(sorted(points), 2, 5.2, 3.6):
        modes, hollow = set(), False
        for axes, service in zip(grid.flat, services):
            for (mode, n, reserved), runs in sorted(points[service].items(), key=lambda kv: mode_order(kv[0][0])):
                kept, p99 = (statistics.median(r[i] for r in runs) for i in (0, 1))
                saturated = any(r[2] for r in runs)
                colour = MODE_COLOURS.get(mode)
                modes.add(mode)
                hollow |= saturated
                axes.scatter([kept], [p99], marker=_mode_marker(mode), s=40, zorder=3, linewidths=1.2,
                             **({"facecolors": "none", "edgecolors": colour} if saturated else {"color": colour}))
                axes.annotate(f"{n} train" + (f", {reserved:g}% SMs" if reserved else ""), (kept, p99),
                              textcoords="offset points", xytext=(5, 3), fontsize=7, color=colour)
            if alone[service]:
                axes.axhline(statistics.median(alone[service]), color="black", linestyle="--", linewidth=1)
            axes.set_yscale("log")
            axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
            axes.yaxis.set_minor_formatter(FuncFormatter(_two_and_five))
            axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.0%}"))
            axes.set_xlim(0, max(1.05, max(r[0] for runs in points[service].values() for r in runs) * 1.1))
            axes.set_title("\n".join(textwrap.wrap(service, 50)), fontsize=8)
            axes.set_xlabel("training kept (share of its speed alone)", fontsize=7)
            axes.set_ylabel("service p99 (ms), logarithmic", fontsize=7)
            axes.tick_params(labelsize=7, which="both")
            axes.grid(alpha=0.3, which="both")
        handles = [Line2D([], [], linestyle="", marker=_mode_marker(mode), color=MODE_COLOURS.get(mode), label=mode)
                   for mode in sorted(modes, key=mode_order)]
        handles.append(Line2D([], [], linestyle="--", color="black", linewidth=1, label="the service alone"))
        if hollow:
            handles.append(Line2D([], [], linestyle="", marker="o", markerfacecolor="none", color="grey",
                                  label="saturated: its p99 measures the queue"))
        figure.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8, frameon=False)
        figure.suptitle(f"Service p99 against what training keeps ({kind})", fontsize=10)
        stem = part_stem(f"serving-{slug(kind)}", part, parts)
        figures.append(Figure("Serving: p99 against what training keeps", stem,
                              f"Each serving scenario's p99 against its training jobs' share of their speed alone "
                              f"({kind}): a point per scenario (median of its runs), labelled with its training jobs "
                              "and the SMs reserved for the service; dashed: the service alone at the same rate; "
                              "up and to the right is worse for the service and better for training", figure))
    return figures
