"""One self-contained HTML page of saved runs (``pytest-gpucolloc report``): figures embedded in the page (it
needs no network and no other file to be viewed) and also written beside it as PNG and SVG.

Every figure is drawn per machine kind (one GPU model and driver, or CPU smoke mode), so CPU smoke runs are never
drawn with GPU runs; a mode has one colour in every figure.
"""
from __future__ import annotations

import base64
import html
import io
import statistics
from collections import defaultdict
from pathlib import Path

from . import changepoints
from .history import History, SavedRun, series_gpu, short_name
from .modes import MODES
from .plots import plt, slug as _slug  # matplotlib without a display, set up once
from .record import ScenarioRecord

MODE_COLOURS = dict(zip(MODES, ["tab:grey", "tab:blue", "tab:green", "tab:purple", "tab:orange"]))


def machine_kind(run: SavedRun, scenario: ScenarioRecord) -> str:
    """What a figure may put side by side: one GPU model and driver, or CPU smoke mode."""
    if scenario.device == "cpu":
        return "CPU smoke mode (batches capped, small inputs)"
    name = (scenario.gpu or {}).get("name") or run.machine.get("gpu_name") or "GPU"
    return f"{name}, driver {run.machine.get('driver_version', '?')}"


# Counts the figures the browser could draw, so that a test (or a reader's console) sees a broken one.
CHECK = ("<script>addEventListener('load', () => { const images = [...document.images]; "
         "document.body.dataset.figures = images.length; "
         "document.body.dataset.broken = images.filter(i => !i.complete || i.naturalWidth === 0).length; });</script>")


class Page:
    """Figures in order, each kept as PNG and SVG files and embedded as a PNG."""

    def __init__(self, out: Path):
        self.out = out
        self.sections: list[tuple[str, list[tuple[str, str]]]] = []  # (heading, [(caption, <img> or text)])
        (out / "figures").mkdir(parents=True, exist_ok=True)

    def section(self, heading: str) -> None:
        self.sections.append((heading, []))

    def figure(self, figure, stem: str, caption: str) -> None:
        figure.tight_layout()
        buffer = io.BytesIO()
        # "tight": long labels (a mix of five jobs) widen the picture instead of being cut off at its edge
        figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
        (self.out / "figures" / f"{stem}.png").write_bytes(buffer.getvalue())
        figure.savefig(self.out / "figures" / f"{stem}.svg", bbox_inches="tight")
        plt.close(figure)
        data = base64.b64encode(buffer.getvalue()).decode()
        self.sections[-1][1].append((caption, f'<img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'))

    def note(self, text: str) -> None:
        self.sections[-1][1].append(("", f"<p>{html.escape(text)}</p>"))

    def write(self, title: str, intro: list[str]) -> Path:
        body = [f"<h1>{html.escape(title)}</h1>"] + [f"<p>{html.escape(line)}</p>" for line in intro]
        for heading, items in self.sections:
            body.append(f"<h2>{html.escape(heading)}</h2>")
            for caption, element in items:
                body.append(f"<figure>{element}<figcaption>{html.escape(caption)}</figcaption></figure>"
                            if caption else element)
        page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
                "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}img{max-width:100%}"
                "figure{margin:1em 0}figcaption{color:#444;font-size:90%}</style></head><body>"
                + "\n".join(body) + CHECK + "</body></html>")
        path = self.out / "index.html"
        path.write_text(page)
        return path


def _mode_legend(axes, modes: set[str]) -> None:
    from matplotlib.patches import Patch

    axes.legend(handles=[Patch(color=MODE_COLOURS.get(mode), label=mode) for mode in MODES if mode in modes],
                fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the bars, never over them


def scaling(page: Page, kind: str, entries: list[tuple[str, ScenarioRecord]]) -> None:
    """Aggregate throughput against processes per workload: one colour per mode, a dot per run with its round spread
    as error bars, the line through the median of the runs at each process count; N x the job alone (dashed, the
    median of the runs' alone measurements) and one process with the summed batch (dotted) where measured."""
    curves: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    alone_runs: dict[str, list[float]] = defaultdict(list)
    ideal: dict[str, list] = defaultdict(list)
    for name, scenario in entries:
        if not scenario.homogeneous:
            continue
        label = scenario.workloads[0]
        spread = statistics.stdev(scenario.rounds) if len(scenario.rounds) > 1 else 0.0
        curves[label][scenario.mode].append((scenario.n_workers, scenario.throughput, spread))
        if scenario.alone_of(0):
            alone_runs[label].append(scenario.alone_of(0))
        if scenario.ideal_throughput:
            ideal[label].append((scenario.n_workers, scenario.ideal_throughput))
    alone = {label: statistics.median(values) for label, values in alone_runs.items()}
    for label, modes in sorted(curves.items()):
        figure, axes = plt.subplots(figsize=(6.5, 4))
        counts = sorted({n for points in modes.values() for n, _, _ in points})
        ticks = sorted({1, *counts}) if label in alone else counts  # the job alone (1) is known: from there
        for mode, points in sorted(modes.items(), key=lambda item: list(MODES).index(item[0])):
            colour = MODE_COLOURS.get(mode)
            axes.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points], fmt="o",
                          capsize=3, color=colour, alpha=0.8 if len(points) == len({p[0] for p in points}) else 0.45)
            at = sorted({n for n, _, _ in points})
            axes.plot(at, [statistics.median(t for n, t, _ in points if n == x) for x in at], color=colour,
                      label=mode)
        if label in alone and len(ticks) > 1:
            axes.plot(ticks, [n * alone[label] for n in ticks], linestyle="--", color="black", linewidth=1,
                      label="N x the job alone")
        if ideal[label]:
            xs, ys = zip(*sorted(ideal[label]))
            axes.plot(xs, ys, linestyle=":", color="black", label="one process, summed batch")
        axes.set(xlabel="processes", ylabel="aggregate samples/s", title=f"{label}\n{kind}")
        axes.set_ylim(bottom=0)  # throughput from zero: a lone point or a flat curve is not magnified
        axes.set_xticks(ticks)
        axes.legend(fontsize=8)
        axes.grid(alpha=0.3)
        page.figure(figure, f"scaling-{_slug(kind)}-{_slug(label)}",
                    f"{label}: aggregate throughput per sharing mode ({kind}); a dot per run, bars: its "
                    "round-to-round spread; the line joins the median of the runs")


def per_job(page: Page, kind: str, entries: list[tuple[str, ScenarioRecord]]) -> None:
    """Each job's throughput relative to the same job alone, one row per scenario and run (a dot per job, a line
    from the slowest job to the fastest: how fairly the GPU was shared), coloured by mode; one figure per test, so
    that a page of many runs stays readable, with a scenario's runs next to each other."""
    groups: dict[str, list] = defaultdict(list)
    for name, scenario in entries:
        shares = [worker.throughput / scenario.alone_of(i) for i, worker in enumerate(scenario.workers)
                  if scenario.alone_of(i)]
        if scenario.mode != "sequential" and shares:
            label = short_name(name)
            groups[label.split("[")[0]].append((label, scenario.mode, shares))
    for test, rows in sorted(groups.items()):
        rows.sort(key=lambda row: row[0])
        figure, axes = plt.subplots(figsize=(8, max(2.5, 0.2 * len(rows) + 1)))
        for y, (_, mode, values) in enumerate(rows):
            colour = MODE_COLOURS.get(mode)
            axes.plot([min(values), max(values)], [y, y], color=colour, linewidth=1)
            axes.scatter(values, [y] * len(values), color=colour, s=14, zorder=2)
        axes.set_yticks(range(len(rows)), [name for name, _, _ in rows], fontsize=7)
        axes.set_ylim(len(rows) - 0.5, -0.5)
        axes.axvline(1.0, color="black", linestyle="--", linewidth=1)
        _mode_legend(axes, {mode for _, mode, _ in rows})
        axes.set(xlabel="each job's throughput relative to the same job alone",
                 title=f"per-job throughput: {test}\n{kind}")
        page.figure(figure, f"per-job-{_slug(kind)}-{_slug(test)}", f"{test}: each job's throughput while sharing, "
                    f"relative to alone, a dot per job and a line from the slowest to the fastest ({kind})")


def mixes(page: Page, kind: str, entries: list[tuple[str, ScenarioRecord]]) -> None:
    """Mixed scenarios (different jobs together): the speedup of each sharing mode as bars, one row per mix; a
    mix whose MIG layout cannot exist on this GPU gets a hatched cell saying so, with the planner's reason."""
    from .report import describe_workers

    rows: dict[str, dict[str, float]] = defaultdict(dict)
    impossible: dict[str, str] = {}
    for _, scenario in entries:
        if scenario.homogeneous or scenario.n_workers < 2:
            continue
        mix = describe_workers(list(scenario.workloads))
        if scenario.speedup is not None:
            rows[mix][scenario.mode] = scenario.speedup
        reason = scenario.mig_cannot_exist
        if reason:
            impossible[mix] = reason
    if not rows:
        return
    modes = [mode for mode in MODES if any(mode in cells for cells in rows.values()) or (mode == "mig" and impossible)]
    height = 0.8 / len(modes)
    figure, axes = plt.subplots(figsize=(8, max(2.5, 0.35 * len(rows) * len(modes) / 2 + 1)))
    top = max(value for cells in rows.values() for value in cells.values())
    for row, (mix, cells) in enumerate(rows.items()):
        for k, mode in enumerate(modes):
            y = row + (k - (len(modes) - 1) / 2) * height
            if mode in cells:
                axes.barh(y, cells[mode], height=height, color=MODE_COLOURS.get(mode))
            elif mode == "mig" and mix in impossible:
                axes.barh(y, top, height=height, color="none", edgecolor=MODE_COLOURS["mig"], hatch="//")
                axes.text(top * 0.02, y, "MIG: this layout cannot exist on this GPU", va="center", fontsize=7)
    axes.set_yticks(range(len(rows)), list(rows), fontsize=7)
    axes.axvline(1.0, color="black", linestyle="--", linewidth=1)
    axes.invert_yaxis()
    _mode_legend(axes, set(modes))
    axes.set(xlabel="speedup (sum of each job's throughput relative to alone)", title=f"mixed jobs\n{kind}")
    page.figure(figure, f"mixes-{_slug(kind)}", f"Mixed jobs: speedup per sharing mode ({kind}); hatched: a MIG "
                "layout that cannot exist on this GPU")
    for mix, reason in impossible.items():
        page.note(f"{mix} under mig: {reason}")


def efficiency(page: Page, kind: str, entries: list[tuple[str, ScenarioRecord]]) -> None:
    """Samples per joule and SM activity per scenario and mode, where telemetry measured them."""
    rows = [(short_name(name), scenario.mode, scenario.samples_per_joule, scenario.sm_activity)
            for name, scenario in entries if scenario.samples_per_joule or scenario.sm_activity is not None]
    if not rows:
        page.note(f"{kind}: no energy or SM activity measured (no GPU telemetry).")
        return
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, max(2.5, 0.22 * len(rows) + 1)), sharey=True)
    for row, (name, mode, joule, activity) in enumerate(rows):
        left.barh(row, joule or 0, color=MODE_COLOURS.get(mode))
        right.barh(row, activity or 0, color=MODE_COLOURS.get(mode))
    left.set_yticks(range(len(rows)), [name for name, *_ in rows], fontsize=7)
    left.set_ylim(len(rows) - 0.5, -0.5)  # first row on top, no empty margin
    left.set(xlabel="samples per joule (GPU energy)", title=kind)
    _mode_legend(right, {mode for _, mode, _, _ in rows})
    right.set(xlabel="SM activity (%)")
    page.figure(figure, f"efficiency-{_slug(kind)}", f"Samples per joule and SM activity per scenario ({kind})")


def history_figures(page: Page, loaded: History) -> None:
    """Each scenario's saved runs per physical GPU, with dates: gated runs marked by verdict with the gate's
    baseline band (from the baseline down by the threshold), runs that were not comparable hollow, level shifts
    dashed."""
    shifts = defaultdict(list)
    for shift in changepoints.find(loaded)[0]:
        shifts[(shift.scenario, shift.gpu)].append(shift)
    per_series: dict[tuple[str, str], list] = defaultdict(list)
    for run in loaded.runs:
        for name, scenario in run.scenarios.items():
            per_series[(name, series_gpu(run, scenario))].append((run, scenario))
    for (name, gpu), points in sorted(per_series.items()):
        figure, axes = plt.subplots(figsize=(7, 3.2))
        xs = list(range(len(points)))
        axes.plot(xs, [s.throughput for _, s in points], color="lightgrey", zorder=1)
        for x, (run, scenario) in zip(xs, points):
            verdict = (scenario.gate or {}).get("verdict")
            colour = {"regressed": "tab:red", "improved": "tab:green"}.get(verdict, "tab:blue")
            axes.scatter([x], [scenario.throughput], zorder=2, color=colour,
                         facecolors="none" if scenario.throttled or scenario.foreign_pids else colour)
            gate = scenario.gate or {}
            if gate.get("baseline"):  # what the gate compared this run with: its baseline and the threshold below it
                axes.fill_between([x - 0.4, x + 0.4], gate["baseline"] * (1 - gate.get("threshold", 0.0)),
                                  gate["baseline"], color="tab:orange", alpha=0.25, linewidth=0)
        index = {run.run_id: x for x, (run, _) in zip(xs, points)}
        for shift in shifts[(name, gpu)]:
            axes.axvline(index[shift.run_id] - 0.5, color="tab:purple", linestyle="--",
                         label=f"level shift {shift.change:+.1%} (p={shift.p_value:.1g})")
        if shifts[(name, gpu)]:
            axes.legend(fontsize=7)
        dates = [run.datetime[:10] for run, _ in points]
        if len(set(dates)) < len(dates):  # several runs a day: the time tells them apart
            dates = [run.datetime[:16].replace("T", " ") for run, _ in points]
        axes.set_xticks(xs, dates, rotation=45, fontsize=7)
        axes.set(ylabel="aggregate samples/s", title=f"{short_name(name)} on {gpu[:20]}")
        axes.grid(alpha=0.3)
        page.figure(figure, f"history-{_slug(short_name(name))}-{_slug(gpu)}",
                    f"{short_name(name)} on {gpu}: saved runs by date (red: regressed, hollow: not comparable, "
                    "orange: the gate's baseline band, dashed: level shift)")


def build(runs: list[SavedRun], loaded: History | None, out: Path) -> Path:
    page = Page(out)
    by_kind: dict[str, list[tuple[str, ScenarioRecord]]] = defaultdict(list)
    for run in runs:
        for name, scenario in run.scenarios.items():
            by_kind[machine_kind(run, scenario)].append((name, scenario))
    for heading, draw in (("Scaling: aggregate throughput per sharing mode", scaling), ("Mixed jobs", mixes),
                          ("Each job while sharing", per_job), ("Energy and SM activity", efficiency)):
        page.section(heading)
        for kind, entries in sorted(by_kind.items()):
            draw(page, kind, entries)
    if loaded is not None and loaded.runs:
        page.section("History per scenario and physical GPU")
        history_figures(page, loaded)
    intro = [f"{len(runs)} run(s): " + ", ".join(f"{run.run_id} ({run.datetime[:19]})" for run in runs),
             "Machines: " + "; ".join(sorted(by_kind)) + ". CPU smoke runs are never drawn with GPU runs."]
    return page.write("pytest-gpucolloc report", intro)
