"""Figures over saved runs (matplotlib, no display needed): the collocation scaling curve, per-workload
slowdown, and each scenario's throughput history with the gate's decisions."""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

from .history import History, SavedRun, short_name  # noqa: E402

MARKERS = {"regressed": ("v", "tab:red"), "improved": ("^", "tab:green"), "unchanged": ("o", "tab:blue"),
           "inconclusive": ("o", "tab:orange")}


def slug(text: str) -> str:
    """A file-name-safe form of a scenario or machine name."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", text).strip("-")[:120] or "scenario"


def _family(name: str) -> str:
    """Scenario name without its parameters: test_resnet26_cifar10[mps-7-128] -> test_resnet26_cifar10."""
    return short_name(name).split("[")[0]


def scaling(run: SavedRun, out: Path, fmt: str) -> list[Path]:
    """Aggregate throughput against the number of collocated processes, one line per mode, per family
    and first workload label; the 'ideal' reference where it was recorded."""
    curves: dict[tuple[str, str], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    ideal: dict[tuple[str, str], list] = defaultdict(list)
    for name, scenario in run.scenarios.items():
        key = (_family(name), scenario.workloads[0])
        if not scenario.homogeneous:
            continue  # mixed scenarios have no process-count axis
        curves[key][scenario.mode].append((scenario.n_workers, scenario.throughput))
        if scenario.ideal_throughput:
            ideal[key].append((scenario.n_workers, scenario.ideal_throughput))
    written = []
    for (family, label), modes in curves.items():
        figure, axes = plt.subplots(figsize=(6, 4))
        for mode, points in sorted(modes.items()):
            xs, ys = zip(*sorted(points))
            axes.plot(xs, ys, marker="o", label=mode)
        if ideal[(family, label)]:
            xs, ys = zip(*sorted(ideal[(family, label)]))
            axes.plot(xs, ys, linestyle="--", color="grey", label="ideal (one process, summed batch)")
        axes.set(xlabel="collocated processes", ylabel="aggregate samples/s", title=f"{label} ({run.run_id})")
        axes.legend()
        axes.grid(alpha=0.3)
        written.append(_save(figure, out / f"scaling-{slug(family)}-{slug(label)}.{fmt}"))
    return written


def slowdown(run: SavedRun, out: Path, fmt: str) -> list[Path]:
    """Each worker's throughput relative to the same job alone (sequential run of the same file)."""
    alone = {}
    for scenario in run.scenarios.values():
        if scenario.mode == "sequential":
            for worker in scenario.workers:
                alone[worker.workload] = worker.throughput
    bars = []
    for name, scenario in sorted(run.scenarios.items()):
        if scenario.mode == "sequential":
            continue
        for i, worker in enumerate(scenario.workers):
            if alone.get(worker.workload):
                bars.append((f"{short_name(name)} w{i}", worker.throughput / alone[worker.workload]))
    if not bars:
        return []
    figure, axes = plt.subplots(figsize=(8, max(3, 0.25 * len(bars))))
    labels, values = zip(*bars)
    axes.barh(range(len(values)), values, color="tab:blue")
    axes.set_yticks(range(len(values)), labels, fontsize=6)
    axes.axvline(1.0, color="grey", linestyle="--")
    axes.set(xlabel="throughput relative to running alone", title=f"per-workload slowdown ({run.run_id})")
    return [_save(figure, out / f"slowdown.{fmt}")]


def history(hist: History, out: Path, fmt: str) -> list[Path]:
    """Throughput of each scenario across saved runs (oldest first), marked with the gate's verdict
    where the run was gated, and a dashed line where a level shift starts (``changepoints``)."""
    from . import changepoints

    index_of = {run.run_id: index for index, run in enumerate(hist.runs)}
    shifts: dict[str, list] = defaultdict(list)
    for shift in changepoints.find(hist)[0]:
        shifts[shift.scenario].append(shift)
    series: dict[str, list] = defaultdict(list)
    for index, run in enumerate(hist.runs):
        for name, scenario in run.scenarios.items():
            verdict = (scenario.gate or {}).get("verdict", "unchanged")
            label = (run.commit or run.run_id)[:8]
            series[name].append((index, scenario.throughput, verdict, label))
    written = []
    for name, points in series.items():
        figure, axes = plt.subplots(figsize=(7, 3.5))
        xs = [p[0] for p in points]
        axes.plot(xs, [p[1] for p in points], color="lightgrey", zorder=1)
        for x, y, verdict, _ in points:
            marker, colour = MARKERS.get(verdict, ("o", "tab:grey"))
            axes.scatter([x], [y], marker=marker, color=colour, zorder=2)
        for shift in shifts[name]:
            axes.axvline(index_of[shift.run_id] - 0.5, color="tab:purple", linestyle="--", linewidth=1,
                         label=f"level shift {shift.change:+.1%} ({shift.gpu[:12]}, p={shift.p_value:.1g})")
        if shifts[name]:
            axes.legend(fontsize=7)
        axes.set_xticks(xs, [p[3] for p in points], rotation=45, fontsize=7)
        axes.set(ylabel="aggregate samples/s", title=short_name(name))
        axes.grid(alpha=0.3)
        written.append(_save(figure, out / f"history-{slug(short_name(name))}.{fmt}"))
    return written


def _save(figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, bbox_inches="tight")  # long labels widen the picture instead of being cut off
    plt.close(figure)
    return path
