"""pytest-gpucolloc: read, judge and draw the collocation scenarios that pytest saved (pytest-benchmark's
storage and JSON files), plan MIG layouts, and compare two revisions or environments in one job (A/B)."""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from pathlib import Path

from . import __version__, nvml
from .history import LATENCY, METRICS
from .modes import MODES

# Exit codes, the same for every command (docs/cli.md): each means one thing.
OK, NEGATIVE, USAGE, NOTHING_TO_READ, UNWRITABLE = 0, 1, 2, 3, 4
PIPE_CLOSED = 141  # stdout closed by its reader (``| head``): what a shell reports for a process ended by SIGPIPE
INTERRUPTED = 130
FORMATS = ["table", "markdown", "csv", "json"]
EXIT_CODES = """exit codes (every command):
  0  done; no regression
  1  the answer is no: a scenario regressed (gate, compare, ab), a MIG layout does not fit (mig plan),
     the machine would make numbers unsteady (check)
  2  usage error or bad input (an option, a file that cannot be read as a run)
  3  nothing to read: storage that does not exist or holds no saved runs, runs without scenarios, no GPU
  4  an output (--out, --markdown, --json) cannot be written
  130 interrupted; 141 stdout closed by its reader (e.g. | head)
details: docs/cli.md"""


class CommandError(Exception):
    """What a command could not do, in one line, and its exit code."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def cmd_info(args) -> int:
    reason = nvml.init()
    info: dict = {"modes": {name: mode.summary for name, mode in MODES.items()}}
    if reason:
        info["gpus"] = []
        info["note"] = reason
    else:
        info["driver"] = nvml.driver()
        info["gpus"] = [{"index": g.index, "uuid": g.uuid, "name": g.name, "memory_total_bytes": g.memory_total_bytes,
                         "mig_mode": g.mig_mode, **g.extra} for g in nvml.gpus()]
    print(json.dumps(info, indent=2))
    return 0


def cmd_check(args) -> int:
    """What would make a benchmark's numbers unsteady here; exit 1 when anything would (checkup.py)."""
    from . import checkup

    findings = checkup.check()
    rows = [[f.severity, f.check, f.finding, f.fix or "-"] for f in findings]
    print(_tabular(rows, ["severity", "check", "finding", "what to do"], args.format))
    unsteady = sum(f.severity == checkup.UNSTEADY for f in findings)
    if args.format in ("table", "markdown"):
        print(f"\n{unsteady} finding(s) that make numbers unsteady" if unsteady
              else "\nnothing found that makes numbers unsteady")
    return NEGATIVE if unsteady else OK


def _read_runs(paths) -> list:
    from . import history

    runs = []
    for path in paths:
        try:
            runs.append(history.read_run(Path(path)))
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise CommandError(f"cannot read {path}: {str(error)[:200]}", USAGE) from None
        for problem in runs[-1].problems:  # scenarios skipped: named by every command that reads files
            print(f"warning: {problem}", file=sys.stderr)
    return runs


def _write(path, text: str) -> None:
    """Write an output file (its folder made if need be), or fail with exit code 4."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    except OSError as error:
        raise CommandError(f"cannot write {path}: {error.strerror or error}", UNWRITABLE) from None


def _out_folder(path) -> Path:
    """An output folder that exists and can be written, or exit code 4 before anything is drawn."""
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CommandError(f"cannot write into {folder}: {error.strerror or error}", UNWRITABLE) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CommandError(f"cannot write into {folder}: permission denied", UNWRITABLE)
    return folder


def _tabular(rows: list[list], headers: list[str], fmt: str) -> str:
    """Rows in one of FORMATS (json: one object per row, keyed by the headers)."""
    from tabulate import tabulate

    if fmt == "json":
        return json.dumps([dict(zip(headers, row)) for row in rows], indent=2)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(headers)
        writer.writerows(rows)
        return out.getvalue().rstrip("\n")
    return tabulate(rows, headers=headers, tablefmt="github" if fmt == "markdown" else "simple", disable_numparse=True)


def cmd_table(args) -> int:
    from . import history, report

    entries, sources = [], []
    runs = _read_runs(args.files)
    for path, run in zip(args.files, runs):
        if not run.scenarios and not run.problems:
            raise CommandError(f"{path} holds no pytest-gpucolloc scenarios", NOTHING_TO_READ)
        entries += [(history.short_name(name), scenario) for name, scenario in run.scenarios.items()]
        # Speedups are against the sequential run of the same session and GPU: rows of several files say which.
        sources += [f"{path.parent.name}/{path.name} on {(scenario.gpu_uuid or 'cpu')[:12]}"
                    for scenario in run.scenarios.values()]
    shown = sources if len(args.files) > 1 else None
    if args.format in ("csv", "json"):
        rows = report.rows(entries)
        headers = report.HEADERS if shown is None else ["run", *report.HEADERS]
        print(_tabular(rows if shown is None else [[s, *row] for s, row in zip(shown, rows)], headers, args.format))
    else:
        print(report.table(entries, fmt="github" if args.format == "markdown" else "simple", sources=shown))
    return OK


def _gpu(selector: str, hint: str = ""):
    """The GPU named by index or UUID, or exit with why not."""
    reason = nvml.init()
    gpus = [] if reason else nvml.gpus()
    if not gpus:
        raise CommandError(f"no GPU ({reason or 'NVML sees none'}){hint}", NOTHING_TO_READ)
    gpu = nvml.find_gpu(selector, gpus)
    if gpu is None:
        raise CommandError(f"no GPU {selector!r}; present: {nvml.describe_gpus(gpus)}", USAGE)
    return gpu


def _mig_table(args):
    from .mig.profiles import UnknownTable, live_table, named_table

    if args.table:
        try:
            return named_table(args.table)
        except UnknownTable as error:
            raise CommandError(str(error), USAGE) from None
    gpu = _gpu(args.gpu, "; name a table with --table (h200, h100-80gb, a100-40gb, a100-80gb)")
    return live_table(gpu.uuid, gpu.name)


def cmd_mig_profiles(args) -> int:
    table = _mig_table(args)
    if args.format == "json" or args.json:
        print(json.dumps(table.to_dict(), indent=1))
        return OK
    rows = [[p.name, p.profile_id, p.nvml_index, p.slice_count, p.instance_count, p.memory_mb,
             p.multiprocessor_count, "{" + ",".join(map(str, p.starts)) + "}:" + str(p.size)] for p in table.profiles]
    headers = ["profile", "id", "nvml index", "compute slices", "instances", "memory MB", "SMs", "placements"]
    if args.format != "csv":
        print(f"{table.gpu} ({table.source}): {table.compute_slices} compute slices, "
              f"{table.memory_slices} memory slices")
    print(_tabular(rows, headers, args.format))
    return OK


def cmd_mig_plan(args) -> int:
    from .mig import planner

    table = _mig_table(args)
    try:
        layout = planner.parse_layout(args.layout)
        plan = planner.plan(table, layout)
    except planner.LayoutError as error:
        raise CommandError(str(error), USAGE) from None
    print(f"{args.layout} on {table.gpu}:")
    print(plan.explain())
    return OK if plan.feasible else NEGATIVE


def cmd_mig_restore(args) -> int:
    from .mig.nvml_backend import NvmlMigBackend
    from .mig.profiles import live_table
    from .mig.provision import MigProvisioner
    from .modes.mig import DEFAULT_CHECKPOINT_DIR

    gpu = _gpu(args.gpu)
    provisioner = MigProvisioner(NvmlMigBackend(gpu.uuid), live_table(gpu.uuid, gpu.name), gpu.uuid, gpu.index,
                                 allow_reconfigure=True,
                                 checkpoint_dir=Path(args.checkpoint_dir or DEFAULT_CHECKPOINT_DIR))
    print("restored the saved MIG layout" if provisioner.recover() else "no saved MIG layout to restore")
    return 0


def _policy(args):
    from .gate import Policy

    return Policy(threshold=args.threshold / 100, alpha=args.alpha, runs=args.runs, min_runs=args.min_runs)


def _storage(text: str) -> Path:
    """--storage as pytest's --benchmark-storage takes it: a folder or a file:// URL."""
    from .benchmark_api import storage_path

    path = storage_path(text)
    if path is None:
        raise argparse.ArgumentTypeError(f"{text!r}: only pytest-benchmark's file storage can be read "
                                         "(a folder, or a file:// URL)")
    return path


def _history(root: Path):
    """The saved runs under ``root``; storage that does not exist or holds no run of this plugin is exit code 3,
    never an empty history (a mis-set storage path must not pass as "no baseline")."""
    from . import history

    if not root.is_dir():
        raise CommandError(f"no storage folder {root}" + (" (a file)" if root.exists() else "") + ": check --storage "
                           "(pytest saves runs there with --benchmark-autosave)", NOTHING_TO_READ)
    loaded = history.load(root)
    for problem in loaded.problems:
        print(f"warning: {problem}", file=sys.stderr)
    if not loaded.runs:
        raise CommandError(f"no saved pytest-gpucolloc runs under {root}"
                           + (f" ({len(loaded.problems)} files could not be read, above)" if loaded.problems else "")
                           + ": check --storage (pytest saves runs there with --benchmark-autosave)", NOTHING_TO_READ)
    return loaded


def _regressed(rows) -> int:
    return NEGATIVE if any(r.verdict["verdict"] == "regressed" for r in rows) else OK


def cmd_compare(args) -> int:
    from . import compare

    loaded = _history(args.storage)
    try:
        before, after, a, b = compare.select(loaded, runs=args.runs_ids, commits=args.commits,
                                             group_by=args.group_by, groups=args.groups)
    except compare.SelectionError as error:
        raise CommandError(str(error), USAGE) from None
    rows = compare.compare(before, after, _policy(args))
    print(compare.render(rows, args.format, f"{b} vs {a} ({len(after)} vs {len(before)} runs)"))
    return _regressed(rows)


def cmd_gate(args) -> int:
    from . import gate

    run = _read_runs([args.run])[0]
    if not run.scenarios:
        raise CommandError(f"{args.run} holds no pytest-gpucolloc scenarios", NOTHING_TO_READ)
    loaded = _history(args.storage)
    policy = _policy(args)
    # Judge the run as the gate would have when it was made: against the runs saved before it.
    excluded = {run.run_id} | {r.run_id for r in loaded.runs if r.datetime >= run.datetime}
    verdicts = []
    for name in run.scenarios:
        verdict = gate.decide(run.sample(name), loaded.samples(name, exclude=excluded), policy)
        for metric in LATENCY:  # a serving job: its latency judged too
            latency = run.sample(name, metric)
            if latency is not None:
                gate.with_latency(verdict, gate.decide(latency, loaded.samples(name, exclude=excluded, metric=metric),
                                                       policy))
        verdicts.append((name, verdict))
    if args.markdown:  # written first: an output that cannot be written is said before the verdicts
        _write(args.markdown, _gate_render(verdicts, "markdown", f"Collocation regression gate: {run.run_id}") + "\n")
    print(_gate_render(verdicts, args.format, f"gate: {run.run_id}"))
    return NEGATIVE if any(verdict.failed for _, verdict in verdicts) else OK


def _gate_render(verdicts, fmt: str, title: str) -> str:
    """The gate's table: a row per scenario, and below a serving scenario's a row per latency judged
    (``report.gate_rows``). JSON: each verdict as saved, the latency ones inside it."""
    from . import report

    if fmt == "json":
        return json.dumps([{"scenario": name, **verdict.to_dict()} for name, verdict in verdicts], indent=2)
    table = _tabular(report.gate_rows([(name, verdict.to_dict()) for name, verdict in verdicts]),
                     report.GATE_HEADERS, fmt)
    return {"csv": table, "markdown": f"### {title}\n\n{table}"}.get(fmt, f"{title}\n{table}")


def cmd_history(args) -> int:
    from . import changepoints, report
    from .history import short_name

    loaded = _history(args.storage)
    try:
        points, looked = changepoints.find(loaded, args.scenario, args.gpu, args.alpha, args.min_runs, args.metric)
    except ImportError as missing:  # a dependency left out of the install, e.g. an offline machine's --no-deps
        raise CommandError(f"pytest-gpucolloc history needs the {missing.name} package, a dependency of "
                           f"pytest-gpucolloc that is not installed in this environment: pip install {missing.name}",
                           USAGE) from None
    p99 = args.metric != "throughput"  # a latency
    if not looked:
        filters = " and ".join(
            f"{flag} {value}" for flag, value in (("--scenario", args.scenario), ("--gpu", args.gpu)) if value)
        what = f"no saved scenario with a serving job's {args.metric} (Workload(..., rate=...), not saturated)" if p99 \
            else "no saved scenario"
        raise CommandError(what + (f" matches {filters}" if filters else ""), USAGE)
    if args.format == "json":
        print(json.dumps({"metric": args.metric, "change_points": [p.to_dict() for p in points],
                          "series": [{"scenario": s, "gpu": g, "runs": n} for s, g, n in looked]}, indent=2))
        return 0
    level = report.ms if p99 else (lambda value: f"{value:,.0f}")
    rows = [[short_name(p.scenario), p.gpu[:16], p.run_id, (p.commit or "-")[:10], p.driver or "-", p.datetime[:19],
             level(p.before), level(p.after), f"{p.change:+.1%}", f"{p.p_value:.2g}", f"{p.runs_before}/{p.runs_after}"]
            for p in points]
    unit = f"{args.metric} ms" if p99 else "samples/s"
    headers = ["scenario", "GPU", "starts at run", "commit", "driver", "date", f"before {unit}", f"after {unit}",
               "change", "p", "runs before/after"]
    if args.format == "csv":
        print(_tabular(rows, headers, "csv"))
        return OK
    print(f"{len(points)} level shift(s) in {len(looked)} series (scenario x physical GPU)"
          + (f" of the serving job's {args.metric} latency (a + change is slower)" if p99 else "")
          + f"; a level must hold for {args.min_runs} runs and differ at p < {args.alpha:g} with any one run left out")
    if points:
        print(_tabular(rows, headers, args.format))
    short = [(s, g, n) for s, g, n in looked if not changepoints.can_hold_a_shift(n, args.min_runs)]
    if short:  # "0 level shifts" must not read as "steady" where no shift could have been found
        print(f"{len(short)} of the series have fewer than {2 * args.min_runs} runs (two levels of {args.min_runs}): "
              "no shift can be found in them yet: " + ", ".join(
                  f"{short_name(s)} on {g[:16]} ({n} run{'s' if n != 1 else ''})" for s, g, n in short))
    return 0


def cmd_ab(args) -> int:
    from . import ab

    here = Path.cwd()
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    settings = ab.Settings(threshold=args.threshold / 100, alpha=args.alpha, min_blocks=args.ab_min_blocks,
                           max_blocks=max(args.ab_max_blocks, args.ab_min_blocks), pairs_per_block=args.ab_pairs,
                           window_s=args.ab_window_seconds, scenario_budget_s=60 * args.ab_scenario_minutes,
                           budget_s=60 * args.ab_budget_minutes, alone=args.ab_alone)
    try:
        ab.check_pytest_args(pytest_args)
        arms = [ab.resolve(args.baseline, "baseline", here), ab.resolve(args.candidate, "candidate", here)]
        if any(arm.kind == "revision" for arm in arms):
            ab.check_clean(here)
        ab.check_gpu_idle(pytest_args)
        with ab.sigterm_as_interrupt(), ab.checked_out(arms, here):
            judgements, runs = ab.run(arms[0], arms[1], pytest_args, settings, Path(args.storage).resolve(),
                                      Path(args.out).resolve(), say=lambda text: print(text, file=sys.stderr))
    except ab.ABError as error:
        raise CommandError(str(error), USAGE) from None
    title = (f"A/B: {args.candidate} (candidate) vs {args.baseline} (baseline), interleaved windows of "
             f"{settings.window_s:g} s in blocks of fresh processes")
    print(title)
    print(ab.table(judgements))
    for line in ab.in_words(judgements):
        print(line)
    if args.markdown:
        _write(args.markdown, f"### {title}\n\n{ab.table(judgements, 'github')}\n")
    if args.json:
        _write(args.json, json.dumps({"baseline": args.baseline, "candidate": args.candidate,
                                     "judgements": [j.to_dict() for j in judgements],
                                     "runs": [str(r.path) for r in runs]}, indent=2))
    return NEGATIVE if any(j.verdict == "regressed" for j in judgements) else OK


def cmd_report(args) -> int:
    from . import html_report

    runs = _read_runs(args.runs)
    loaded = _history(args.storage) if args.storage else None
    if not any(run.scenarios for run in runs) and loaded is None:
        raise CommandError("no pytest-gpucolloc scenarios in the given runs (name run files, or --storage)",
                           NOTHING_TO_READ)
    out = _out_folder(args.out)
    try:
        page = html_report.build([run for run in runs if run.scenarios], loaded, out)
    except OSError as error:
        raise CommandError(f"cannot write the report into {out}: {error}", UNWRITABLE) from None
    print(f"wrote {page} ({page.stat().st_size / 1e3:,.0f} KB) and its figures in {page.parent / 'figures'}")
    return OK


def cmd_advise(args) -> int:
    from . import advisor

    if args.p99_within is not None:
        return _advise_serving(args)
    try:
        jobs = advisor.parse_jobs(args.jobs)
    except advisor.AdviceError as error:
        raise CommandError(str(error), USAGE) from None
    runs = _read_runs(args.runs)
    try:
        advice = advisor.advise(jobs, runs)
    except advisor.AdviceError as error:
        raise CommandError(str(error), NOTHING_TO_READ) from None
    if args.format == "json":
        print(json.dumps({**advice, "options": [vars(o) for o in advice["options"]]}, indent=2))
        return OK
    rows = [[o.way, o.scenario, o.run_id, "-" if o.speedup is None else f"{o.speedup:.2f}x",
             "-" if o.worst_share is None else f"{o.worst_share:.0%}",
             "-" if o.samples_per_joule is None else f"{o.samples_per_joule:.1f}",
             "-" if o.memory_headroom_gb is None else f"{o.memory_headroom_gb:.0f}"] for o in advice["options"]]
    headers = ["way", "scenario", "run", "speedup", "slowest job", "samples/J", "memory free GB"]
    if args.format == "csv":
        print(_tabular(rows, headers, "csv"))
        return OK
    for line in advice.get("predicted_lines", []):  # a mix nobody measured: predicted, said as such
        print(line)
    print(advice["recommendation"] + ".")
    print(_tabular(rows, headers, args.format))
    if advice["not_measured"]:
        print(f"Not measured for this mix: {', '.join(advice['not_measured'])} ({advice['measure_with']}).")
    if not advice["graphed_measured"]:
        print("Not measured: the graphed variants (Workload(..., cuda_graph=True)).")
    return OK


def _advise_serving(args) -> int:
    """``advise --p99-within``: per service and number of training jobs, the way within the p99 budget where training
    keeps the most; exit 1 when a service has none."""
    from . import advisor

    try:
        budget = advisor.parse_budget(args.p99_within)
    except advisor.AdviceError as error:
        raise CommandError(str(error), USAGE) from None
    runs = _read_runs(args.runs)
    try:
        advice = advisor.serving_advice(runs, budget)
    except advisor.AdviceError as error:
        raise CommandError(str(error), NOTHING_TO_READ) from None
    code = OK if advice["met"] else NEGATIVE
    if args.format == "json":
        answers = [{**a, "option": vars(a["option"])} for a in advice["answers"]]
        print(json.dumps({**advice, "answers": answers}, indent=2))
        return code
    rows = []
    for answer in advice["answers"]:
        o = answer["option"]
        p99 = "saturated" if o.saturated else "-" if o.p99_ms is None else f"{o.p99_ms:,.1f}"
        rows.append([answer["service"], str(answer["training_jobs"]), "yes" if answer["within"] else "no", o.way,
                     o.scenario, str(o.runs), p99, "-" if o.p99_vs_alone is None or o.saturated
                     else f"{o.p99_vs_alone:.2f}x", "-" if o.training_kept is None else f"{o.training_kept:.0%}"])
    headers = ["service", "training jobs", f"p99 within {advice['budget']}", "way", "scenario", "runs", "p99 ms",
               "p99 vs alone", "training kept"]
    if args.format != "csv":
        print("\n".join(advice["advice"]))
    print(_tabular(rows, headers, args.format))
    return code


def cmd_plot(args) -> int:
    import itertools

    from . import plots

    loaded = _history(args.storage)
    run = loaded.find(args.run) if args.run else loaded.runs[-1]
    if run is None:
        raise CommandError(f"no saved run {args.run!r} under {args.storage}", USAGE)
    out = _out_folder(args.out)
    try:
        written = plots.write(itertools.chain(plots.for_runs([run]), plots.history(loaded)), out, args.format)
    except OSError as error:
        raise CommandError(f"cannot write the figures into {out}: {error}", UNWRITABLE) from None
    for _, path in written:
        print(path)
    return OK


def _checked(name: str, low: float, high: float, integer: bool = False):
    """An argparse type that checks the value as the plugin's own option of the same meaning does."""
    from .options import number_option

    parse = number_option(name, low, high, integer)

    def check(text: str):
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return check


def _storage_argument(parser) -> None:
    parser.add_argument("--storage", type=_storage, default=Path(".benchmarks"),
                        help="pytest-benchmark's storage as pytest's --benchmark-storage takes it: a folder or a "
                             "file:// URL (default .benchmarks)")


def _format_argument(parser, default: str = "table", extra: tuple[str, ...] = ()) -> None:
    parser.add_argument("--format", choices=FORMATS + list(extra), default=default,
                        help=f"output: {', '.join(FORMATS)} (default {default})")


def _judging_arguments(parser) -> None:
    from . import gate
    from .options import MAX_ALPHA, MAX_THRESHOLD, MIN_ALPHA

    _storage_argument(parser)
    parser.add_argument("--threshold", type=_checked("--threshold", 0, MAX_THRESHOLD),
                        default=100 * gate.DEFAULT_THRESHOLD,
                        help=f"smallest drop in percent that counts (default {100 * gate.DEFAULT_THRESHOLD:g})")
    parser.add_argument("--alpha", type=_checked("--alpha", MIN_ALPHA, MAX_ALPHA), default=gate.DEFAULT_ALPHA,
                        help=f"false-alarm rate per scenario (default {gate.DEFAULT_ALPHA:g})")


def _gate_arguments(parser) -> None:
    from . import gate
    from .options import MAX_RUNS

    _judging_arguments(parser)
    parser.add_argument("--runs", type=_checked("--runs", 2, MAX_RUNS, integer=True), default=gate.DEFAULT_RUNS,
                        help=f"baseline: most recent N comparable runs (default {gate.DEFAULT_RUNS})")
    parser.add_argument("--min-runs", type=_checked("--min-runs", 1, MAX_RUNS, integer=True),
                        default=gate.DEFAULT_MIN_RUNS,
                        help=f"fewest baseline runs to decide (default {gate.DEFAULT_MIN_RUNS})")
    _format_argument(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pytest-gpucolloc", description=__doc__, epilog=EXIT_CODES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("info", help="GPUs, driver and sharing modes as this machine reports them"
                        ).set_defaults(run_command=cmd_info)
    check = commands.add_parser("check", help="what on this machine would make numbers unsteady, before a benchmark: "
                                "GPU persistence, power limit, clocks, other processes, MIG; MPS daemons, CPU "
                                "governor and load (read-only; exit 1: something would)")
    _format_argument(check)
    check.set_defaults(run_command=cmd_check)
    mig = commands.add_parser("mig", help="MIG profiles and layout plans (read-only unless 'restore')")
    mig_commands = mig.add_subparsers(dest="mig_command", required=True)
    for name, run, text in (("profiles", cmd_mig_profiles, "the GPU's MIG profile table"),
                            ("plan", cmd_mig_plan, "placements for a layout, or why it does not fit")):
        sub = mig_commands.add_parser(name, help=text)
        if name == "plan":
            sub.add_argument("layout", help="e.g. '4g,2g,2g' or '3g.71gb,2g.35gb,1g.18gb*2'")
        sub.add_argument("--table", help="a named table instead of the live GPU: h200, h100-80gb, a100-40gb, a100-80gb")
        sub.add_argument("--gpu", default="0", help="GPU index or UUID (default 0)")
        if name == "profiles":
            _format_argument(sub)
            sub.add_argument("--json", action="store_true", help="the same as --format json")
        sub.set_defaults(run_command=run)
    restore = mig_commands.add_parser("restore", help="restore a MIG layout a killed run left saved")
    restore.add_argument("--gpu", default="0", help="GPU index or UUID (default 0)")
    restore.add_argument("--checkpoint-dir", help="where runs save the layout they changed (default: the plugin's, "
                         "as --mig-checkpoint-dir)")
    restore.set_defaults(run_command=cmd_mig_restore)

    gate_cmd = commands.add_parser("gate", help="judge a saved run against the history in the storage "
                                   "(exit 1: a regression; 3: the storage holds no saved runs)")
    gate_cmd.add_argument("run", help="a pytest-benchmark JSON file of this plugin's scenarios")
    gate_cmd.add_argument("--markdown", help="also write the verdicts as Markdown to this file (a CI job summary)")
    _gate_arguments(gate_cmd)
    gate_cmd.set_defaults(run_command=cmd_gate)

    compare_cmd = commands.add_parser("compare", help="compare two sets of saved runs, per scenario (exit 1: a "
                                      "regression; one run against one says the change, not a verdict)")
    compare_cmd.add_argument("--runs-ids", dest="runs_ids", nargs=2, metavar=("BEFORE", "AFTER"),
                             help="two run ids (file names or their NNNN prefix)")
    compare_cmd.add_argument("--commits", nargs=2, metavar=("BEFORE", "AFTER"),
                             help="two commits (or prefixes): the runs saved at each")
    compare_cmd.add_argument("--group-by", help="a machine_info key: driver_version, cuda_driver_version, torch, ...")
    compare_cmd.add_argument("--groups", nargs=2, metavar=("BEFORE", "AFTER"), help="the two values of --group-by")
    _gate_arguments(compare_cmd)
    compare_cmd.set_defaults(run_command=cmd_compare)

    history_cmd = commands.add_parser("history", help="level shifts (change points) in each scenario's saved history, "
                                      "per physical GPU")
    _storage_argument(history_cmd)
    history_cmd.add_argument("--scenario", help="only scenarios whose name contains this")
    history_cmd.add_argument("--gpu", help="only the GPU whose UUID starts with this")
    history_cmd.add_argument("--alpha", type=_checked("--alpha", 1e-9, 0.2), default=0.01,
                             help="a shift counts when its levels differ at p below this (default 0.01)")
    history_cmd.add_argument("--min-runs", type=_checked("--min-runs", 2, 1000, integer=True), default=3,
                             help="runs a level must hold on each side of a shift (default 3)")
    history_cmd.add_argument("--metric", choices=METRICS, default="throughput",
                             help="what each series follows: the scenario's throughput, or its serving job's p99 "
                                  "latency (scenarios with Workload(..., rate=...); saturated runs left out) "
                                  "(default throughput)")
    _format_argument(history_cmd)
    history_cmd.set_defaults(run_command=cmd_history)

    ab_cmd = commands.add_parser("ab", help="paired A/B in one job: two interpreters, environments or git revisions "
                                 "of the scenario code, both warm at once and measured in alternating short windows "
                                 "(exit 0 no regression, 1 regression, 2 usage error)")
    ab_cmd.add_argument("--baseline", required=True,
                        help="a Python interpreter, a virtual environment or a git revision")
    ab_cmd.add_argument("--candidate", required=True, help="the same kinds as --baseline")
    ab_cmd.add_argument("--ab-min-blocks", type=_checked("--ab-min-blocks", 2, 1000, integer=True), default=3,
                        help="blocks (fresh processes in each arm) per scenario at least (default 3)")
    ab_cmd.add_argument("--ab-max-blocks", type=_checked("--ab-max-blocks", 2, 1000, integer=True), default=12,
                        help="blocks per scenario at most while it is inconclusive (default 12)")
    ab_cmd.add_argument("--ab-pairs", type=_checked("--ab-pairs", 1, 1000, integer=True), default=5,
                        help="pairs of windows per block, each arm measured once a pair, in random order (default 5)")
    ab_cmd.add_argument("--ab-window-seconds", type=_checked("--ab-window-seconds", 0.05, 600), default=1.0,
                        help="length of one arm's measurement window (default 1)")
    ab_cmd.add_argument("--ab-scenario-minutes", type=_checked("--ab-scenario-minutes", 0.001, 10000), default=5,
                        help="no new block of a scenario once it would pass this much time (default 5)")
    ab_cmd.add_argument("--ab-budget-minutes", type=_checked("--ab-budget-minutes", 0.001, 10000), default=60,
                        help="no new block once the job would pass this much time (default 60)")
    ab_cmd.add_argument("--ab-alone", action="store_true",
                        help="also measure each job alone in both arms (speedups; the A/B does not need them)")
    ab_cmd.add_argument("--out", default="gpucolloc-ab", help="each arm's run JSON and log (default gpucolloc-ab)")
    ab_cmd.add_argument("--markdown", help="also write the verdicts as Markdown to this file")
    ab_cmd.add_argument("--json", help="also write the verdicts and log-ratios as JSON to this file")
    _judging_arguments(ab_cmd)
    ab_cmd.add_argument("pytest_args", nargs=argparse.REMAINDER,
                        help="what each arm's pytest runs, e.g. benchmarks/ -m gpucolloc_quick --gpu-mode=mps")
    ab_cmd.set_defaults(run_command=cmd_ab)

    report_cmd = commands.add_parser("report", help="an HTML page of runs (and the history of a storage) that answers "
                                     "first: the best way to share, a summary table, then figures linked in figures/")
    report_cmd.add_argument("runs", nargs="*", type=Path, help="pytest-benchmark JSON files of this plugin's scenarios")
    report_cmd.add_argument("--storage", type=_storage, help="also draw the history of this pytest-benchmark storage "
                            "(a folder or a file:// URL)")
    report_cmd.add_argument("--out", default="gpucolloc-report", help="folder for index.html and figures/ "
                            "(default gpucolloc-report)")
    report_cmd.set_defaults(run_command=cmd_report)

    advise_cmd = commands.add_parser("advise", help="rank the measured ways a job mix can share this GPU, and say "
                                     "which and why (exit 3: nothing measured runs these jobs); or, with "
                                     "--p99-within, which way keeps a service's p99 within a budget while training "
                                     "gets the most (exit 1: no measured way does)")
    advise_cmd.add_argument("runs", nargs="+", type=Path, help="pytest-benchmark JSON files of this plugin's scenarios")
    question = advise_cmd.add_mutually_exclusive_group(required=True)
    question.add_argument("--jobs", help="the mix: labels as the summary shows them or workload "
                          "names as Workload takes them, each with *COUNT, e.g. 'resnet26-cifar10/bs128*3,resnet50' "
                          "(a bare name is its default batch size, 32)")
    question.add_argument("--p99-within", metavar="BUDGET", help="a serving job's p99 budget: milliseconds (25) or a "
                          "multiple of its p99 alone at the same rate (2x); answers, per service and number of "
                          "training jobs, the mode and SM reservation within it where training keeps the most")
    _format_argument(advise_cmd, extra=("text",))
    advise_cmd.set_defaults(run_command=cmd_advise)

    plot = commands.add_parser("plot", help="the report's figures as files: scaling, mixes, each job's share, energy "
                               "(of one run), history with gate decisions")
    _storage_argument(plot)
    plot.add_argument("--out", default="gpucolloc-plots", help="folder for the figures (default gpucolloc-plots)")
    plot.add_argument("--run", help="run for the figures of one run (default: the newest)")
    plot.add_argument("--format", choices=["png", "svg"], default="png",
                      help="the figures' file format (default png); this command writes figures, not tables")
    plot.set_defaults(run_command=cmd_plot)

    table = commands.add_parser("table", help="table of the scenarios in pytest-benchmark JSON files")
    table.add_argument("files", nargs="+", type=Path, help="pytest-benchmark JSON files of this plugin's scenarios")
    _format_argument(table, default="markdown", extra=("text",))  # text: the name "table" had before
    table.set_defaults(run_command=cmd_table)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # --help, --version (0) or a usage error (2), already said: its code is returned
        return done.code if isinstance(done.code, int) else int(done.code is not None)
    if getattr(args, "format", None) == "text":
        args.format = "table"
    try:
        code = args.run_command(args)
        sys.stdout.flush()  # here, not at exit: a reader that went away is answered below, not by a traceback
        return code
    except CommandError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.code
    except BrokenPipeError:
        # stdout's reader stopped reading (| head): end quietly, with nothing left for Python to flush at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return PIPE_CLOSED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
