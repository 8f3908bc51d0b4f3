"""The report page (``pytest-gpucolloc report``): the answer first, then the summary table, the run warnings and
the serving jobs' latencies, then the figures.

The page is small: its figures (``plots``, the same ones ``pytest-gpucolloc plot`` draws) are PNG files beside it in
``figures/``, linked, never also embedded; copy the folder as a whole. Sections without content are left out.
"""
from __future__ import annotations

import html
import itertools
from collections import Counter
from pathlib import Path

from . import history_plot, latency_plot, plots, record, report
from .history import History, SavedRun, short_name
from .modes import MODES

# Counts the figures the browser could draw, so that a test (or a reader's console) sees a broken one.
CHECK = ("<script>addEventListener('load', () => { const images = [...document.images]; "
         "document.body.dataset.figures = images.length; "
         "document.body.dataset.broken = images.filter(i => !i.complete || i.naturalWidth === 0).length; });</script>")

STYLE = ("body{font-family:sans-serif;max-width:1150px;margin:auto;padding:0 1em;color:#222}img{max-width:100%}"
         ".answer{font-size:130%;margin:.6em 0}.alert{color:#b00;font-weight:bold}"
         "table{border-collapse:collapse;font-size:88%;margin:.5em 0}th,td{border:1px solid #ccc;padding:3px 7px;"
         "text-align:right}th:first-child,td:first-child{text-align:left}th{background:#f3f3f3}"
         "td.best{background:#dff3df;font-weight:bold}td small{color:#555;font-weight:normal}"
         ".regressed{color:#b00;font-weight:bold}.warned{color:#a60}.warnings th,.warnings td{text-align:left}"
         "figure{margin:1.2em 0}figcaption{color:#444;font-size:90%}")


def _e(text: object) -> str:
    return html.escape(str(text))


def _summary_table(rows: list[report.SummaryRow], warned: Counter) -> str:
    """``warned``: per row's (jobs, mixed), how many of its scenarios carry run warnings."""
    modes = [mode for mode in MODES if any(mode in row.cells for row in rows)]
    gated = any(row.verdicts for row in rows)  # a gate column only where the runs were gated
    head = "".join(f"<th>{_e(mode)}</th>" for mode in modes)
    body = []
    for i, row in enumerate(rows):
        if row.mixed and (i == 0 or not rows[i - 1].mixed):  # the mixes follow the workloads
            body.append(f"<tr><th colspan={len(modes) + 2 + gated}>mixes of different jobs</th></tr>")
        cells = []
        for mode in modes:
            cell = row.cells.get(mode)
            if cell is None:
                cells.append("<td>-</td>")
                continue
            runs = f", median of {cell.runs} runs" if cell.runs > 1 else ""
            shares_best = mode == row.best and len(row.cells) > 1  # one mode measured: not the best of anything
            cells.append(f"<td{' class=best' if shares_best else ''} title='{cell.n} jobs{runs}'>"
                         f"{cell.speedup:.2f}x<br><small>{cell.n} jobs, {cell.throughput:,.0f}/s</small></td>")
        ranked = sorted(row.cells, key=lambda mode: -row.cells[mode].speedup)
        best = (f"{_e(row.best)} <small>+{row.margin:.0%} over {_e(ranked[1])}</small>" if len(ranked) > 1
                else f"<small>only {_e(row.best)} measured</small>")
        verdicts = f"<td>{_verdicts(row.verdicts)}</td>" if gated else ""
        n = warned[(row.jobs, row.mixed)]
        mark = (f" <a class=warned href='#warnings' title='{n} of its scenarios carry run warnings'>&#9888; {n}</a>"
                if n else "")
        body.append(f"<tr><td>{_e(row.jobs)}{mark}</td>{''.join(cells)}<td>{best}</td>{verdicts}</tr>")
    return (f"<table class=summary><tr><th>jobs</th>{head}<th>best way to share</th>{'<th>gate</th>' * gated}</tr>"
            + "".join(body) + "</table>")


def _warnings(runs: list[SavedRun]) -> str:
    """What made a scenario's numbers doubtful, as the run said it (``run_warnings``): one row per sentence."""
    rows = [f"<tr><td>{_e(short_name(name))}</td><td>{_e(run.run_id)}</td><td>{_e(warning)}</td></tr>"
            for run in runs for name, scenario in run.scenarios.items() for warning in scenario.warnings]
    if not rows:
        return ""
    return ("<h2 id=warnings>Warnings</h2><p>What makes these scenarios' numbers doubtful, as the run warned "
            "(&#9888; in the summary).</p><table class=warnings><tr><th>scenario</th><th>run</th><th>warning</th>"
            "</tr>" + "".join(rows) + "</table>")


def _serving(runs: list[SavedRun]) -> str:
    """Each scenario with a serving job, per machine kind: its latency percentiles beside what its training jobs
    kept (``report.serving_rows``); a saturated service says why below its table."""
    kinds: dict[str, list] = {}
    for run in runs:
        for name, scenario in run.scenarios.items():
            if scenario.serving:
                kinds.setdefault(plots.machine_kind(run, scenario), []).append((run.run_id, short_name(name), scenario))
    if not kinds:
        return ""
    parts = ["<h2 id=serving>Serving</h2><p>Each serving job's latency from a request's scheduled arrival to its "
             "answer (open loop), over every request measured, beside what its training neighbours kept of their "
             "speed alone; p99 vs alone: against the same service alone at the same rate.</p>"]
    for kind, found in sorted(kinds.items()):
        entries = [(name, scenario) for _, name, scenario in found]
        rows = "".join("<tr><td>" + "</td><td>".join(_e(cell) for cell in [row[0], run_id, *row[1:]]) + "</td></tr>"
                       for (run_id, _, _), row in zip(found, report.serving_rows(entries)))
        head = "".join(f"<th>{_e(h)}</th>" for h in [report.SERVING_HEADERS[0], "run", *report.SERVING_HEADERS[1:]])
        parts.append((f"<h3>{_e(kind)}</h3>" if len(kinds) > 1 else "") + f"<table class=serving><tr>{head}</tr>"
                     + rows + "</table>")
        parts += [f"<p>{_e(name)}: {_e(why)}</p>" for name, why in report.saturated(entries)]
    return "".join(parts)


def _verdicts(counts: Counter) -> str:
    if not counts:
        return "-"
    return ", ".join(f"<span class=regressed>{n} regressed</span>" if verdict == "regressed" else f"{n} {_e(verdict)}"
                     for verdict, n in sorted(counts.items(), key=lambda item: item[0] != "regressed"))


def _gate_history(loaded: History, recent: list[SavedRun]) -> tuple[str, int]:
    """Per scenario and physical GPU: its runs and the latest gate verdict among the ``recent`` runs; with how many
    are regressed now."""
    counts: Counter = Counter((name, run.gpu(name)) for run in loaded.runs for name in run.scenarios)
    latest: dict[tuple[str, str], tuple] = {}
    for run in recent:  # only these runs' files are read
        for name, scenario in run.scenarios.items():
            if scenario.verdict:
                latest[(name, run.gpu(name))] = (run, scenario)
    rows, regressed = [], 0
    for (name, gpu), (run, scenario) in sorted(latest.items()):
        verdict, change = scenario.verdict or "", (scenario.gate or {}).get("change")
        regressed += verdict == "regressed"
        shown = f"<span class=regressed>{verdict}</span>" if verdict == "regressed" else _e(verdict)
        rows.append(f"<tr><td>{_e(short_name(name))}</td><td>{_e(gpu)}</td><td>{counts[(name, gpu)]}</td>"
                    f"<td>{shown}</td><td>{'-' if change is None else f'{change:+.1%}'}</td>"
                    f"<td>{_e(run.datetime[:16].replace('T', ' '))} {_e((run.commit or '')[:8])}</td></tr>")
    if not rows:
        return "", 0
    return ("<table><tr><th>scenario</th><th>GPU</th><th>runs</th><th>latest gate verdict</th><th>change</th>"
            "<th>of the run</th></tr>" + "".join(rows) + "</table>"), regressed


def build(runs: list[SavedRun], loaded: History | None, out: Path, recent: list[SavedRun] | None = None) -> Path:
    """Write ``out/index.html`` and its figures in ``out/figures/``; return the page's path. ``recent``: the runs of
    ``loaded`` whose verdicts and figures are shown (default: all)."""
    recent = loaded.runs if loaded is not None and recent is None else recent or []
    body = ["<h1>pytest-gpucolloc report</h1>"]
    kinds = plots.by_kind(runs)
    tables = []
    for kind, entries in kinds.items():
        rows = report.summary(entries)
        prefix = f"<b>{_e(kind)}:</b> " if len(kinds) > 1 else ""
        cpu = all(scenario.device == "cpu" for _, scenario in entries)
        body.append(f"<p class=answer>{prefix}{_e(report.answer(rows, cpu))}</p>")
        if rows:  # with, per row's (jobs, mixed) as ``report.summary`` groups them, its scenarios with run warnings
            tables.append((kind, rows, Counter((record.jobs(s), not s.homogeneous) for _, s in entries if s.warnings)))
    regressed = sum(plots.regressed(s) for entries in kinds.values() for _, s in entries)
    gate_table, regressed_now = _gate_history(loaded, recent) if loaded is not None else ("", 0)
    if regressed or regressed_now:
        body.append(f"<p class=alert>The gate judged {regressed + regressed_now} regressed: "
                    "marked red in the tables and figures below.</p>")
    if tables:
        body.append("<h2>Summary</h2><p>Per workload or mix and sharing mode: the speedup (the jobs' progress "
                    "together against one after another) at the number of jobs where it was largest, median of "
                    "the runs there, and the aggregate throughput in samples/s; green: the best way to share.</p>")
        for kind, rows, warned in tables:
            body.append((f"<h3>{_e(kind)}</h3>" if len(tables) > 1 else "") + _summary_table(rows, warned))
    body += [part for part in (_warnings(runs), _serving(runs)) if part]  # sections without content left out
    if gate_table:
        body.append("<h2>Gate over the stored history</h2>" + gate_table)
    figures = itertools.chain(plots.for_runs(runs), latency_plot.trade_offs(runs), latency_plot.for_runs(runs),
                              history_plot.figures(loaded, recent) if loaded is not None else [])
    section = None
    for item, _ in plots.write(figures, out / "figures", "png"):
        if item.section != section:
            section = item.section
            body.append(f"<h2>{_e(section)}</h2>")
        src = f"figures/{item.stem}.png"
        body.append(f"<figure><a href='{src}'><img alt='{_e(item.caption)}' src='{src}'></a>"
                    f"<figcaption>{_e(item.caption)}</figcaption></figure>")
        body += [f"<p>{_e(note)}</p>" for note in item.notes]
    if runs:
        body.append("<h2>Runs</h2><p>" + ", ".join(f"{_e(run.run_id)} ({_e(run.datetime[:16].replace('T', ' '))})"
                                                   for run in runs) + ". Machines: " + _e("; ".join(kinds))
                    + ". CPU smoke runs are never drawn or summed with GPU runs.</p>")
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>pytest-gpucolloc report</title>"
            f"<style>{STYLE}</style></head><body>" + "\n".join(body) + CHECK + "</body></html>")
    path = out / "index.html"
    path.write_text(page)
    return path
