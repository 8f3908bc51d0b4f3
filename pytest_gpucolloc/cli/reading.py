"""The commands that read and draw saved runs: info, check, table, report, advise, plot."""
from __future__ import annotations

import json
from pathlib import Path

from .. import advisor, checkup, history, nvml, report
from ..modes import MODES
from ..report import cell
from ..scratch import can_write_in
from ..table_fit import tabular, terminal_width
from .common import (
    CPU_SMOKE,
    NEGATIVE,
    NOTHING_TO_READ,
    OK,
    UNWRITABLE,
    USAGE,
    CommandError,
    failing,
    load_history,
    named_runs,
    newest,
)


def out_folder(path) -> Path:
    """An output folder that exists and can be written, or exit code 4 before anything is drawn."""
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CommandError(f"cannot write into {folder}: {error.strerror or error}", UNWRITABLE) from None
    if not can_write_in(folder):
        raise CommandError(f"cannot write into {folder}: a file cannot be created there", UNWRITABLE)
    return folder


def cmd_info(args) -> int:
    reason = nvml.init()
    info: dict = {"modes": {name: mode.summary for name, mode in MODES.items()}}
    if reason:
        info.update(gpus=[], note=reason)
    else:
        info.update(driver=nvml.driver(), gpus=[{"index": g.index, "uuid": g.uuid, "name": g.name,
                                                 "memory_total_bytes": g.memory_total_bytes, "mig_mode": g.mig_mode,
                                                 **g.extra} for g in nvml.gpus()])
    print(json.dumps(info, indent=2))
    return 0


def cmd_check(args) -> int:
    """What would make a benchmark's numbers unsteady here; exit 1 when anything would (checkup.py)."""
    findings = checkup.check()
    rows = [[f.severity, f.check, f.finding, f.fix or "-"] for f in findings]
    print(tabular(rows, ["severity", "check", "finding", "what to do"], args.format))
    unsteady = sum(f.severity == checkup.UNSTEADY for f in findings)
    if args.format in ("table", "markdown"):
        print(f"\n{unsteady} finding(s) that make numbers unsteady" if unsteady
              else "\nnothing found that makes numbers unsteady")
    return NEGATIVE if unsteady else OK


def cmd_table(args) -> int:
    entries, labelled = [], []
    runs = named_runs(args.files, args.storage)
    # Speedups are against the sequential run of the same session and GPU: rows of several files say which, in a
    # terminal by the run's number where it names one run alone (as the commands take it); data keeps the file
    files = [f"{run.path.parent.name}/{run.path.name}" for run in runs]
    labels = history.numbered([run.run_id for run in runs], files) if args.format in ("table", "markdown") else files
    for run, label in zip(runs, labels):
        if not run.scenarios and not run.problems:
            raise CommandError(f"{run.path} holds no pytest-gpucolloc scenarios", NOTHING_TO_READ)
        entries += [(history.short_name(name), scenario) for name, scenario in run.scenarios.items()]
        labelled += [label] * len(run.scenarios)
    if args.format == "json":  # data for jq or pandas: numbers, and every row's file
        print(json.dumps([{"run": file, **row} for file, row in zip(labelled, report.facts(entries))], indent=2))
        return OK
    sources = [f"{label} on {(scenario.gpu_uuid or 'cpu')[:12]}" for label, (_, scenario) in zip(labelled, entries)]
    shown = sources if len(runs) > 1 else None
    if args.format == "csv":
        rows = report.rows(entries)
        headers = report.HEADERS if shown is None else ["run", *report.HEADERS]
        print(tabular(rows if shown is None else [[s, *row] for s, row in zip(shown, rows)], headers, "csv"))
    else:
        print(report.table(entries, fmt="github" if args.format == "markdown" else "simple", sources=shown,
                           shown=args.columns, width=terminal_width()))
        if entries and all(scenario.device == "cpu" for _, scenario in entries):
            print(CPU_SMOKE)
    return OK


def cmd_report(args) -> int:
    from .. import html_report  # matplotlib loads only for a report

    # the runs named, else the storage's latest, as every command takes them; --storage adds its history
    loaded = load_history(args.storage) if args.storage else None
    runs = named_runs(args.runs, args.storage or Path(".benchmarks"), loaded if not args.runs else None)
    if not any(run.scenarios for run in runs) and loaded is None:
        raise CommandError("no pytest-gpucolloc scenarios in the given runs (name run files, or --storage)",
                           NOTHING_TO_READ)
    out = out_folder(args.out)
    with failing(OSError, UNWRITABLE, f"cannot write the report into {out}: "):
        page = html_report.build([run for run in runs if run.scenarios], loaded, out,
                                 loaded.recent(args.last, args.since) if loaded is not None else [])
    print(f"wrote {page} ({page.stat().st_size / 1e3:,.0f} KB) and its figures in {page.parent / 'figures'}")
    return OK


def cmd_advise(args) -> int:
    if args.p99_within is not None:
        return _advise_serving(args)
    advice = _advice(args, advisor.parse_jobs, args.jobs, lambda runs, jobs: advisor.advise(jobs, runs))
    if args.format == "json":
        print(json.dumps({**advice, "options": [vars(o) for o in advice["options"]]}, indent=2))
        return OK
    rows = [[o.way, o.scenario, o.run_id, cell(o.speedup, ".2f", "x"), cell(o.worst_share, ".0%"),
             cell(o.samples_per_joule, ".1f"), cell(o.memory_headroom_gb, ".0f")] for o in advice["options"]]
    headers = ["way", "scenario", "run", "speedup", "slowest job", "samples/J", "memory free GB"]
    if args.format == "csv":
        print(tabular(rows, headers, "csv"))
        return OK
    for line in advice.get("predicted_lines", []):  # a mix nobody measured: predicted, said as such
        print(line)
    print(advice["recommendation"] + ".")
    print(tabular(rows, headers, args.format))
    if advice["not_measured"]:
        print(f"Not measured for this mix: {', '.join(advice['not_measured'])} ({advice['measure_with']}).")
    if not advice["graphed_measured"]:
        print("Not measured: the graphed variants (Workload(..., cuda_graph=True)).")
    return OK


def _advice(args, parse, text: str, answer, unsaved: str | None = None) -> dict:
    """The advisor's answer to the question asked: a question it cannot read exits 2, runs that cannot answer it 3;
    ``unsaved``: what is missing where no run is named and the storage holds no run of its history."""
    with failing(advisor.AdviceError, USAGE):
        asked = parse(text)
    if unsaved is not None and not args.runs and not (args.storage.is_dir() and history.load(args.storage).runs):
        raise CommandError(unsaved, NOTHING_TO_READ)  # nothing saved: said as what the question needs
    runs = named_runs(args.runs, args.storage)
    with failing(advisor.AdviceError, NOTHING_TO_READ):
        return answer(runs, asked)


def _advise_serving(args) -> int:
    """``advise --p99-within``: per service and number of training jobs, the way within the p99 budget where training
    keeps the most; exit 1 when a service has none."""
    advice = _advice(args, advisor.parse_budget, args.p99_within, advisor.serving_advice,
                     f"no saved run to read under {args.storage}, so no serving job beside training jobs and no p99 to "
                     f"bound: {advisor.MEASURE_SERVICE}, or point --storage at saved runs")
    code = OK if advice["met"] else NEGATIVE
    if args.format == "json":
        answers = [{**a, "option": vars(a["option"])} for a in advice["answers"]]
        print(json.dumps({**advice, "answers": answers}, indent=2))
        return code
    rows = []
    for answer in advice["answers"]:
        o = answer["option"]
        rows.append([answer["service"], str(answer["training_jobs"]), "yes" if answer["within"] else "no", o.way,
                     o.scenario, str(o.runs), "saturated" if o.saturated else cell(o.p99_ms, ",.1f"),
                     "-" if o.saturated else cell(o.p99_vs_alone, ".2f", "x"), cell(o.training_kept, ".0%")])
    headers = ["service", "training jobs", f"p99 within {advice['budget']}", "way", "scenario", "runs", "p99 ms",
               "p99 vs alone", "training kept"]
    if args.format != "csv":
        print("\n".join(advice["advice"]))
    print(tabular(rows, headers, args.format))
    return code


def cmd_plot(args) -> int:
    import itertools

    from .. import history_plot, latency_plot, plots  # matplotlib loads only for a figure

    loaded = load_history(args.storage)
    run = next((run for run in loaded.runs if run.matches(args.run)), None) if args.run \
        else newest(loaded, args.storage)
    if run is None:
        raise CommandError(f"no saved run {args.run!r} under {args.storage}", USAGE)
    out = out_folder(args.out)
    with failing(OSError, UNWRITABLE, f"cannot write the figures into {out}: "):
        written = plots.write(itertools.chain(plots.for_runs([run]), latency_plot.trade_offs([run]),
                                              history_plot.figures(loaded, loaded.recent(args.last, args.since))),
                              out, args.format)
    for figure, path in written:
        print(path)
        for note in figure.notes:  # e.g. the older runs not drawn, and their level shifts
            print(f"  {note}")
    return OK
