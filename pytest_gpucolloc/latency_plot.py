"""A service's latency distribution on HdrHistogram's usual axes: latency (ms) against the percentile, the percentile
on a log scale of 1/(1 - q) so that p50, p90, p99 and p99.9 are evenly apart and the tail is as visible as the median.
One curve per histogram (an ab arm's requests, or a saved run's). Drawing only: the histograms come from ``serving``.
"""
from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

from .history import short_name  # noqa: E402
from .plots import Figure, machine_kind, slug  # noqa: E402
from .words import count  # noqa: E402

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
    axes.set_xlim(1, max(top, 2.0))
    axes.set_ylim(bottom=0)
    axes.set_xlabel("percentile (log scale of 1 / (1 - q))")
    axes.set_ylabel("latency, ms (scheduled arrival to answer)")
    axes.set_title(title, fontsize=10)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8, loc="upper left")
    shown.tight_layout()
    return shown


def save(shown: Any, path) -> None:
    shown.savefig(path, dpi=110)
    plt.close(shown)



CURVES = 8  # runs drawn per scenario: the most recent ones


def for_runs(runs: list) -> list:
    """The report's figures: per serving scenario and machine kind, the latency distribution of each run's requests
    beside its neighbours, the most recent CURVES runs (``plots.Figure``s, drawn here)."""
    from . import serving  # hdrhistogram loads only where a report has a service

    found: dict[tuple[str, str], dict[str, Any]] = {}
    for run in runs:
        for name, scenario in run.scenarios.items():
            encoded = (scenario.serving or {}).get("histogram")
            if encoded and not scenario.serving.get("saturated"):
                found.setdefault((machine_kind(run, scenario), short_name(name)), {})[run.run_id] = \
                    serving.decode(encoded)
    figures = []
    for (kind, name), curves in sorted(found.items()):
        shown = dict(list(curves.items())[-CURVES:])
        figures.append(Figure("Serving: latency distributions", f"latency-{slug(kind)}-{slug(name)}",
                              f"{name} on {kind}: each run's request latencies beside its neighbours (the last "
                              f"{count(len(shown), 'run')}; percentile on HdrHistogram's log axis)",
                              figure(shown, f"{name} ({kind})")))
    return figures
