"""pytest-gpucolloc: read, judge and draw the collocation scenarios that pytest saved (pytest-benchmark's
storage and JSON files), plan MIG layouts, and compare two revisions or environments in one job (A/B)."""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from . import advisor, changepoints, checkup, compare, forget, gate, history, history_shifts, nvml, report
from .benchmark_api import storage_path
from .gate import Policy
from .history import LATENCY, METRICS, experiment, short_name
from .machine import PLUGIN_VERSION
from .mig import planner
from .mig.nvml_backend import NvmlMigBackend
from .mig.profiles import UnknownTable, live_table, named_table
from .mig.provision import MigProvisioner
from .modes import MODES
from .modes.mig import DEFAULT_CHECKPOINT_DIR
from .options import MAX_ALPHA, MAX_RUNS, MAX_THRESHOLD, MIN_ALPHA, number_option
from .report import COLUMNS as TABLE_COLUMNS
from .report import GATE_COLUMNS, columns
from .scratch import can_write_in, clean_stale_scratch
from .table_fit import terminal_width
from .verdict import DEFAULT_ALPHA, DEFAULT_MIN_RUNS, DEFAULT_RUNS, DEFAULT_THRESHOLD, with_latency

# Exit codes, the same for every command (docs/cli.md): each means one thing.
OK, NEGATIVE, USAGE, NOTHING_TO_READ, UNWRITABLE = 0, 1, 2, 3, 4
NOTHING_JUDGED = 5  # gate: a run with nothing to judge; pytest's code for a gated run that judged none
PIPE_CLOSED = 141  # stdout closed by its reader (``| head``): what a shell reports for a process ended by SIGPIPE
INTERRUPTED = 130
RECENT_RUNS = 200  # history, plot and report show the newest this many runs unless told (--last, --since)
NEWEST = 3  # history's table of series: each one's newest runs, their values and verdicts
FORMATS = ["table", "markdown", "csv", "json"]
EXIT_CODES = """exit codes (every command):
  0  done; no regression
  1  the answer is no: a scenario regressed (gate, compare, ab), a MIG layout does not fit (mig plan),
     the machine would make numbers unsteady (check)
  2  usage error or bad input (an option, a file that cannot be read as a run)
  3  nothing to read: storage that does not exist or holds no saved runs, runs without scenarios, no GPU
  4  an output (--out, --markdown, --json) cannot be written
  5  gate: nothing judged (every scenario left to paired A/B), as pytest's gate exits 5: not a pass
  130 interrupted; 141 stdout closed by its reader (e.g. | head)
details: docs/cli.md"""


RUN_HELP = "saved runs: files, or run ids in --storage (a file name or its NNNN number)"


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
    findings = checkup.check()
    rows = [[f.severity, f.check, f.finding, f.fix or "-"] for f in findings]
    print(_tabular(rows, ["severity", "check", "finding", "what to do"], args.format))
    unsteady = sum(f.severity == checkup.UNSTEADY for f in findings)
    if args.format in ("table", "markdown"):
        print(f"\n{unsteady} finding(s) that make numbers unsteady" if unsteady
              else "\nnothing found that makes numbers unsteady")
    return NEGATIVE if unsteady else OK


def _read_runs(paths) -> list:
    runs = []
    for path in paths:
        try:
            runs.append(history.read_run(Path(path)))
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise CommandError(f"cannot read {path}: {str(error)[:200]}", USAGE) from None
        for problem in runs[-1].problems:  # scenarios skipped: named by every command that reads files
            print(f"warning: {problem}", file=sys.stderr)
    return runs


def _runs(names: list, storage: Path) -> list:
    """Saved runs as every command names them: a file, or a run id (its file name or NNNN number) in ``storage``;
    none named: the storage's latest run (of its history: not an experiment or a run set aside)."""
    def is_file(name) -> bool:
        return Path(name).exists() or "/" in str(name) or str(name).endswith(".json")

    if names and all(map(is_file, names)):
        return _read_runs(names)
    loaded = _history(storage)
    if not names:
        return [loaded.runs[-1]]
    runs: list = []
    for name in names:
        found = _read_runs([name]) if is_file(name) else loaded.named(str(name))
        if len(found) != 1:
            raise CommandError(f"{str(name)!r} names {len(found)} saved runs under {storage}"
                               + (f": {', '.join(str(run.path) for run in found)}" if found else
                                  " (a file name, its NNNN number, or a path to the file)"), USAGE)
        runs += found
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
    if not can_write_in(folder):
        raise CommandError(f"cannot write into {folder}: a file cannot be created there", UNWRITABLE)
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
    entries, sources = [], []
    runs = _runs(args.files, args.storage)
    for run in runs:
        path = run.path
        if not run.scenarios and not run.problems:
            raise CommandError(f"{path} holds no pytest-gpucolloc scenarios", NOTHING_TO_READ)
        entries += [(history.short_name(name), scenario) for name, scenario in run.scenarios.items()]
        # Speedups are against the sequential run of the same session and GPU: rows of several files say which.
        sources += [f"{path.parent.name}/{path.name} on {(scenario.gpu_uuid or 'cpu')[:12]}"
                    for scenario in run.scenarios.values()]
    shown = sources if len(runs) > 1 else None
    if args.format in ("csv", "json"):
        rows = report.rows(entries)
        headers = report.HEADERS if shown is None else ["run", *report.HEADERS]
        print(_tabular(rows if shown is None else [[s, *row] for s, row in zip(shown, rows)], headers, args.format))
    else:
        print(report.table(entries, fmt="github" if args.format == "markdown" else "simple", sources=shown,
                           shown=args.columns, width=terminal_width()))
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

    gpu = _gpu(args.gpu)
    provisioner = MigProvisioner(NvmlMigBackend(gpu.uuid), live_table(gpu.uuid, gpu.name), gpu.uuid, gpu.index,
                                 allow_reconfigure=True,
                                 checkpoint_dir=Path(args.checkpoint_dir or DEFAULT_CHECKPOINT_DIR))
    print("restored the saved MIG layout" if provisioner.recover() else "no saved MIG layout to restore")
    return 0


def _policy(args):
    return Policy(threshold=args.threshold / 100, alpha=args.alpha, runs=args.runs, min_runs=args.min_runs)


def _storage(text: str) -> Path:
    """--storage as pytest's --benchmark-storage takes it: a folder or a file:// URL."""
    path = storage_path(text)
    if path is None:
        raise argparse.ArgumentTypeError(f"{text!r}: only pytest-benchmark's file storage can be read "
                                         "(a folder, or a file:// URL)")
    return path


def _history(root: Path):
    """The saved runs under ``root``; storage that does not exist or holds no run of this plugin is exit code 3,
    never an empty history (a mis-set storage path must not pass as "no baseline")."""
    if not root.is_dir():
        raise CommandError(f"no storage folder {root}" + (" (a file)" if root.exists() else "") + ": check --storage "
                           "(pytest saves runs there with --benchmark-autosave)", NOTHING_TO_READ)
    loaded = history.load(root)
    for problem in loaded.problems:
        print(f"warning: {problem}", file=sys.stderr)
    if loaded.left_out:  # said, so that a run missing from an answer is not a mystery
        print(f"note: {len(loaded.left_out)} run(s) left out of the history: " + "; ".join(
            f"{run.run_id} ({why})" for run, why in loaded.left_out[:3]) + ("; ..." if len(loaded.left_out) > 3
                                                                          else ""), file=sys.stderr)
    if not loaded.runs:
        raise CommandError(f"no saved pytest-gpucolloc runs under {root}"
                           + (f" ({len(loaded.problems)} files could not be read, above)" if loaded.problems else "")
                           + (f" ({len(loaded.left_out)} left out, above)" if loaded.left_out else "")
                           + ": check --storage (pytest saves runs there with --benchmark-autosave)", NOTHING_TO_READ)
    return loaded


def _regressed(rows) -> int:
    return NEGATIVE if any(r.verdict["verdict"] == "regressed" for r in rows) else OK


def _commit(loaded, wanted: str) -> str:
    """A commit as saved runs name it (a prefix of their commit id), or a git revision of the repository here
    (HEAD, HEAD~1, a branch): its full id. Left as given when it is neither (the selection then says no run matches)."""
    if any(run.commit and run.commit.startswith(wanted) for run in loaded.runs):
        return wanted
    try:
        done = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{wanted}^{{commit}}"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return wanted
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else wanted


def cmd_compare(args) -> int:
    loaded = _history(args.storage)
    try:
        commits = [_commit(loaded, c) for c in args.commits] if args.commits else None
        before, after, a, b = compare.select(loaded, runs=args.runs_ids, commits=commits,
                                             group_by=args.group_by, groups=args.groups)
    except compare.SelectionError as error:
        raise CommandError(str(error), USAGE) from None
    said = args.commits or [a, b]  # in the order given, as typed (HEAD~1) and the commit it names
    found = " -> ".join(typed if typed == label else f"{typed} ({label[:10]})" for typed, label in zip(said, (a, b)))
    rows = compare.compare(before, after, _policy(args))
    title = f"compare {found} ({len(before)} -> {len(after)} runs; a change is {said[1]} against {said[0]})"
    print(compare.render(rows, args.format, title, terminal_width()))
    return _regressed(rows)


def cmd_gate(args) -> int:

    run = _runs([args.run] if args.run else [], args.storage)[0]
    if not run.scenarios:
        raise CommandError(f"{run.path} holds no pytest-gpucolloc scenarios", NOTHING_TO_READ)
    if experiment(run):  # its windows were measured another way: a history of ordinary runs cannot judge it
        raise CommandError(f"{run.path} is {experiment(run)}: the gate judges ordinary runs against their history "
                           "(an A/B is judged by `pytest-gpucolloc ab` itself)", USAGE)
    loaded = _history(args.storage)
    policy = _policy(args)
    # Judge the run as the gate would have when it was made: against the runs saved before it.
    excluded = {run.run_id} | {r.run_id for r in loaded.runs if r.datetime >= run.datetime}
    # a scenario whose marker leaves it to paired A/B is not judged here either, as the pytest gate does not
    left = [name for name, scenario in run.scenarios.items() if scenario.gate_by == "ab"]
    if len(left) == len(run.scenarios):
        raise CommandError(f"{run.path}: no scenario to judge: " + report.left_to_ab_line(left, _modes(run, left)),
                           NOTHING_JUDGED)
    verdicts = []
    last = history.GATE_WINDOW * policy.runs
    for name in (name for name in run.scenarios if name not in left):
        verdict = gate.decide(run.sample(name), loaded.samples(name, exclude=excluded, last=last), policy)
        for metric in LATENCY:  # a serving job: its latency judged too
            latency = run.sample(name, metric)
            if latency is not None:
                with_latency(verdict, gate.decide(
                    latency, loaded.samples(name, exclude=excluded, metric=metric, last=last), policy))
        verdicts.append((name, verdict))
    if args.markdown:  # written first: an output that cannot be written is said before the verdicts
        _write(args.markdown, _gate_render(verdicts, "markdown", f"Collocation regression gate: {run.run_id}") + "\n")
    print(_gate_render(verdicts, args.format, f"gate: {run.run_id}", args.columns))
    if left:  # below the table, or on stderr where stdout is data
        print(("\n" if args.format in ("table", "markdown") else "") + report.left_to_ab_line(left, _modes(run, left)),
              file=sys.stdout if args.format in ("table", "markdown") else sys.stderr)
    return NEGATIVE if any(verdict.failed for _, verdict in verdicts) else OK


def _modes(run, names: list[str]) -> list[str]:
    return list(dict.fromkeys(run.scenarios[name].mode for name in names))


def _gate_render(verdicts, fmt: str, title: str, columns: list[str] | None = None) -> str:
    """The gate's table: a row per scenario, and below a serving scenario's a row per latency judged
    (``report.gate_rows``). JSON: each verdict as saved, the latency ones inside it."""
    if fmt == "json":
        return json.dumps([{"scenario": name, **verdict.to_dict()} for name, verdict in verdicts], indent=2)
    entries = [(name if fmt != "table" else short_name(name), verdict.to_dict()) for name, verdict in verdicts]
    if fmt == "csv":
        return _tabular(report.gate_rows(entries), report.GATE_HEADERS, fmt)
    table = report.gate_table(entries, "github" if fmt == "markdown" else "simple", columns, terminal_width())
    return f"### {title}\n\n{table}" if fmt == "markdown" else f"{title}\n{table}"


def cmd_history(args) -> int:
    loaded = _history(args.storage)
    try:
        points, looked = history_shifts.find(loaded, args.scenario, args.gpu, args.alpha, args.min_runs, args.metric)
    except ImportError as missing:  # a dependency left out of the install, e.g. an offline machine's --no-deps
        raise CommandError(f"pytest-gpucolloc history needs the {missing.name} package, a dependency of "
                           f"pytest-gpucolloc that is not installed in this environment: pip install {missing.name}",
                           USAGE) from None
    shown = {run.run_id for run in loaded.recent(args.last, args.since)}
    older = [p for p in points if p.run_id not in shown]
    points = [p for p in points if p.run_id in shown]
    p99 = args.metric != "throughput"  # a latency
    if not looked:
        filters = " and ".join(
            f"{flag} {value}" for flag, value in (("--scenario", args.scenario), ("--gpu", args.gpu)) if value)
        what = f"no saved scenario with a serving job's {args.metric} (Workload(..., rate=...), not saturated)" if p99 \
            else "no saved scenario"
        raise CommandError(what + (f" matches {filters}" if filters else ""), USAGE)
    runs_of = _series_runs(loaded, args.metric, looked, shown)
    if args.format == "json":
        print(json.dumps({"metric": args.metric, "change_points": [p.to_dict() for p in points],
                          "older_change_points": [p.to_dict() for p in older], "runs_shown": len(shown),
                          "series": [{"scenario": s, "gpu": g, "runs": n, "shown": [
                              {"run_id": run_id, "value": value, "verdict": verdict}
                              for run_id, value, verdict in runs_of[(s, g)]]} for s, g, n in looked]}, indent=2))
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
    window = f" in the last {len(shown):,} of {len(loaded.runs):,} runs" if len(shown) < len(loaded.runs) else ""
    print(f"{len(points)} level shift(s){window} in {len(looked)} series (scenario x physical GPU)"
          + (f" of the serving job's {args.metric} latency (a + change is slower)" if p99 else "")
          + f"; a level must hold for {args.min_runs} runs and differ at p < {args.alpha:g} with any one run left out")
    if older:
        print(_older_shifts(older, len(shown), len(loaded.runs)))
    if points:
        print(_tabular(rows, headers, args.format))
    print(_tabular([[short_name(s), g[:16], f"{n:,}", "; ".join(
        level(value) + (f" {verdict}" if verdict else "") for _, value, verdict in runs_of[(s, g)][-NEWEST:])]
        for s, g, n in looked], ["scenario", "GPU", "runs", f"newest runs, {unit} (the gate's verdict where gated)"],
        args.format))
    short = [(s, g, n) for s, g, n in looked if not changepoints.can_hold_a_shift(n, args.min_runs)]
    if short:  # "0 level shifts" must not read as "steady" where no shift could have been found
        print(f"{len(short)} of the series have fewer than {2 * args.min_runs} runs (two levels of {args.min_runs}): "
              "no shift can be found in them yet: " + ", ".join(
                  f"{short_name(s)} on {g[:16]} ({n} run{'s' if n != 1 else ''})" for s, g, n in short))
    return 0


def _series_runs(loaded, metric: str, looked, shown: set[str]) -> dict[tuple[str, str], list]:
    """Each series' runs among those shown, oldest first: (run id, its value in the metric's unit, the gate's verdict
    on it or None where it was not gated)."""
    found = history_shifts.series(loaded, metric)
    return {(name, gpu): [(p.run.run_id, math.exp(p.log_level), _verdict(p.run.scenarios[name], metric))
                          for p in found[(name, gpu)] if p.run.run_id in shown] for name, gpu, _ in looked}


def _verdict(scenario, metric: str) -> str | None:
    """The gate's verdict on a saved scenario's throughput, or on a latency of its serving job."""
    judged = scenario.gate or {}
    if metric != "throughput":
        judged = (judged.get("latency") or {}).get(metric) or (judged.get("p99") if metric == "p99" else None) or {}
    return judged.get("verdict")


def cmd_forget(args) -> int:
    """Set saved runs aside (left out of every history, their files kept), list them, or bring them back."""
    root = args.storage
    if args.list or not args.runs:
        listed = forget.read(root)
        rows = [[key, when, why or "-"] for key, (when, why) in sorted(listed.items())]
        print(_tabular(rows, ["run", "set aside", "why"], args.format) if rows or args.format == "json"
              else f"no run set aside under {root}")
        return OK
    if args.undo:
        listed = forget.read(root)
        keys = []
        for wanted in args.runs:
            found = [key for key in listed if wanted in (key, Path(key).stem, Path(key).name.split("_")[0])]
            if len(found) != 1:
                raise CommandError(f"{wanted!r} names {len(found)} of the runs set aside under {root}"
                                   + (f" ({', '.join(found)}): name it by its path" if found else
                                      ": `pytest-gpucolloc forget --list` shows them"), USAGE)
            keys += found
        forget.undo(root, keys)
        print("back in the history: " + ", ".join(keys))
        return OK
    if not root.is_dir():
        raise CommandError(f"no storage folder {root}: check --storage", NOTHING_TO_READ)
    loaded = history.load(root)
    paths: list[Path] = []
    for wanted in args.runs:
        files = [run.path for run in loaded.named(wanted)] or [Path(wanted)] * Path(wanted).is_file()
        if len(files) != 1:
            raise CommandError(f"{wanted!r} names {len(files)} saved runs under {root}"
                               + (f" ({', '.join(map(str, files))}): name it by its file" if files else ""), USAGE)
        paths += files
    keys = forget.add(root, paths, args.why or "")
    print("left out of the history (the files are kept; `pytest-gpucolloc forget --undo RUN` brings one back): "
          + ", ".join(keys))
    return OK


def _older_shifts(older, shown: int, runs: int) -> str:
    """The level shifts before the runs shown, a line per series: where each started and by how much."""
    by_series: dict[tuple[str, str], list] = {}
    for point in older:
        by_series.setdefault((point.scenario, point.gpu), []).append(point)
    lines = [f"{len(older)} older level shift(s), before the {shown:,} runs shown of {runs:,} (--last, --since):"]
    lines += [f"  {short_name(scenario)} on {gpu[:16]}: " + ", ".join(
        f"{p.change:+.1%} at {p.run_id.split('_')[0]} ({p.datetime[:10]})" for p in shifts)
        for (scenario, gpu), shifts in by_series.items()]
    return "\n".join(lines)


def cmd_ab(args) -> int:
    from . import ab, ab_arms, ab_judge  # hdrhistogram and the worker's code load only for ab

    here = Path.cwd()
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    settings = ab.Settings(threshold=args.threshold / 100, alpha=args.alpha, min_blocks=args.ab_min_blocks,
                           max_blocks=max(args.ab_max_blocks, args.ab_min_blocks), pairs_per_block=args.ab_pairs,
                           window_s=args.ab_window_seconds, scenario_budget_s=60 * args.ab_scenario_minutes,
                           budget_s=60 * args.ab_budget_minutes, alone=args.ab_alone)
    removed = clean_stale_scratch()  # a killed ab's arms, worktrees and socket folder (and a killed run's scratch)
    if removed:
        print(f"removed what killed runs left: {', '.join(removed)}", file=sys.stderr)
    try:
        ab_arms.check_pytest_args(pytest_args)
        arms = [ab_arms.resolve(args.baseline, "baseline", here), ab_arms.resolve(args.candidate, "candidate", here)]
        if any(arm.kind == "revision" for arm in arms):
            ab_arms.check_clean(here)
        ab_arms.check_gpu_idle(pytest_args)
        with ab_arms.sigterm_as_interrupt(), ab_arms.checked_out(arms, here):
            judgements, runs = ab.run(arms[0], arms[1], pytest_args, settings, Path(args.out).resolve(),
                                      say=lambda text: print(text, file=sys.stderr, flush=True))
    except ab_arms.ABError as error:
        raise CommandError(str(error), USAGE) from None
    title = (f"A/B: {args.candidate} (candidate) vs {args.baseline} (baseline), interleaved windows of "
             f"{settings.window_s:g} s in blocks of fresh processes")
    print(title)
    print(ab_judge.table(judgements))
    for line in ab_judge.in_words(judgements):
        print(line)
    if args.markdown:
        _write(args.markdown, f"### {title}\n\n{ab_judge.table(judgements, 'github')}\n")
    if args.json:
        _write(args.json, json.dumps({"baseline": args.baseline, "candidate": args.candidate,
                                     "judgements": [j.to_dict() for j in judgements],
                                     "runs": [str(r.path) for r in runs]}, indent=2))
    return NEGATIVE if any(j.verdict == "regressed" for j in judgements) else OK


def cmd_report(args) -> int:
    from . import html_report  # matplotlib loads only for a report

    runs = _runs(args.runs, args.storage or Path(".benchmarks")) if args.runs or not args.storage else []
    loaded = _history(args.storage) if args.storage else None
    if not any(run.scenarios for run in runs) and loaded is None:
        raise CommandError("no pytest-gpucolloc scenarios in the given runs (name run files, or --storage)",
                           NOTHING_TO_READ)
    out = _out_folder(args.out)
    try:
        page = html_report.build([run for run in runs if run.scenarios], loaded, out,
                                 loaded.recent(args.last, args.since) if loaded is not None else [])
    except OSError as error:
        raise CommandError(f"cannot write the report into {out}: {error}", UNWRITABLE) from None
    print(f"wrote {page} ({page.stat().st_size / 1e3:,.0f} KB) and its figures in {page.parent / 'figures'}")
    return OK


def cmd_advise(args) -> int:
    if args.p99_within is not None:
        return _advise_serving(args)
    try:
        jobs = advisor.parse_jobs(args.jobs)
    except advisor.AdviceError as error:
        raise CommandError(str(error), USAGE) from None
    runs = _runs(args.runs, args.storage)
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
    try:
        budget = advisor.parse_budget(args.p99_within)
    except advisor.AdviceError as error:
        raise CommandError(str(error), USAGE) from None
    runs = _runs(args.runs, args.storage)
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

    from . import history_plot, plots  # matplotlib loads only for a figure

    loaded = _history(args.storage)
    run = loaded.find(args.run) if args.run else loaded.runs[-1]
    if run is None:
        raise CommandError(f"no saved run {args.run!r} under {args.storage}", USAGE)
    out = _out_folder(args.out)
    try:
        written = plots.write(itertools.chain(plots.for_runs([run]),
                                              history_plot.figures(loaded, loaded.recent(args.last, args.since))),
                              out, args.format)
    except OSError as error:
        raise CommandError(f"cannot write the figures into {out}: {error}", UNWRITABLE) from None
    for figure, path in written:
        print(path)
        for note in figure.notes:  # e.g. the older runs not drawn, and their level shifts
            print(f"  {note}")
    return OK


def _checked(name: str, low: float, high: float, integer: bool = False):
    """An argparse type that checks the value as the plugin's own option of the same meaning does."""
    parse = number_option(name, low, high, integer)

    def check(text: str):
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return check


def _columns(names: list[str]):
    def check(text: str) -> list[str]:
        try:
            return columns(text, names)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return check


def _storage_argument(parser) -> None:
    parser.add_argument("--storage", type=_storage, default=Path(".benchmarks"),
                        help="pytest-benchmark's storage as pytest's --benchmark-storage takes it: a folder or a "
                             "file:// URL (default .benchmarks)")


def _since(text: str) -> str:
    """--since: an ISO date or date and time (UTC unless it says its offset), as the saved runs' times (UTC)
    compare with it."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date (2026-12-01) or date and time "
                                         "(2026-12-01T08:00)") from None
    return (when.astimezone(timezone.utc).replace(tzinfo=None) if when.tzinfo else when).isoformat()


def _window_arguments(parser, what: str) -> None:
    parser.add_argument("--last", type=_checked("--last", 0, 10**9, integer=True), default=RECENT_RUNS,
                        help=f"{what} the newest this many saved runs; older level shifts are summed up in a line "
                             f"(default {RECENT_RUNS}; 0: every run)")
    parser.add_argument("--since", type=_since, help=f"{what} runs saved at or after this date (UTC), e.g. 2026-12-01")


def _format_argument(parser, default: str = "table", extra: tuple[str, ...] = ()) -> None:
    parser.add_argument("--format", choices=FORMATS + list(extra), default=default,
                        help=f"output: {', '.join(FORMATS)} (default {default})")


def _judging_arguments(parser, storage: bool = True) -> None:

    if storage:
        _storage_argument(parser)
    parser.add_argument("--threshold", type=_checked("--threshold", 0, MAX_THRESHOLD),
                        default=100 * DEFAULT_THRESHOLD,
                        help=f"smallest drop in percent that counts (default {100 * DEFAULT_THRESHOLD:g})")
    parser.add_argument("--alpha", type=_checked("--alpha", MIN_ALPHA, MAX_ALPHA), default=DEFAULT_ALPHA,
                        help="false-alarm rate per judgement: a scenario's throughput, and each latency of its "
                             f"service (default {DEFAULT_ALPHA:g})")


def _gate_arguments(parser) -> None:

    _judging_arguments(parser)
    parser.add_argument("--runs", type=_checked("--runs", 2, MAX_RUNS, integer=True), default=DEFAULT_RUNS,
                        help=f"baseline: most recent N comparable runs (default {DEFAULT_RUNS})")
    parser.add_argument("--min-runs", type=_checked("--min-runs", 1, MAX_RUNS, integer=True),
                        default=DEFAULT_MIN_RUNS,
                        help=f"fewest baseline runs to decide (default {DEFAULT_MIN_RUNS})")
    _format_argument(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pytest-gpucolloc", description=__doc__, epilog=EXIT_CODES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {PLUGIN_VERSION}")
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
                                   "(exit 1: a regression; 3: the storage holds no saved runs; 5: nothing judged, "
                                   "as pytest's gate)")
    gate_cmd.add_argument("run", nargs="?", help=RUN_HELP + " (default: the storage's latest run)")
    gate_cmd.add_argument("--markdown", help="also write the verdicts as Markdown to this file (a CI job summary)")
    gate_cmd.add_argument("--columns", type=_columns(GATE_COLUMNS), help="the table's columns, comma-separated, "
                          f"among {','.join(GATE_COLUMNS)} (default all; in a terminal a long reason is numbered and "
                          "said below the table)")
    _gate_arguments(gate_cmd)
    gate_cmd.set_defaults(run_command=cmd_gate)

    compare_cmd = commands.add_parser("compare", help="compare two sets of saved runs, per scenario (exit 1: a "
                                      "regression; one run against one says the change, not a verdict)")
    compare_cmd.add_argument("--runs-ids", dest="runs_ids", nargs=2, metavar=("BEFORE", "AFTER"),
                             help="two run ids (file names or their NNNN prefix)")
    compare_cmd.add_argument("--commits", nargs=2, metavar=("BEFORE", "AFTER"),
                             help="two commits (ids, prefixes or git revisions such as HEAD~1): the runs saved "
                                  "at each")
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
    _window_arguments(history_cmd, "list the level shifts of")
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
    ab_cmd.add_argument("--out", default="gpucolloc-ab", help="each arm's run JSON, log and saved runs (storage/); "
                        "never the history's storage: an arm is measured in turns (default gpucolloc-ab)")
    ab_cmd.add_argument("--markdown", help="also write the verdicts as Markdown to this file")
    ab_cmd.add_argument("--json", help="also write the verdicts and log-ratios as JSON to this file")
    _judging_arguments(ab_cmd, storage=False)
    ab_cmd.add_argument("pytest_args", nargs=argparse.REMAINDER,
                        help="what each arm's pytest runs, e.g. benchmarks/ -m gpucolloc_quick --gpu-mode=mps")
    ab_cmd.set_defaults(run_command=cmd_ab)

    forget_cmd = commands.add_parser("forget", help="leave saved runs out of the history (gate, compare, history, "
                                     "plot, --benchmark-compare) without deleting them: a disturbed run, an "
                                     "experiment; --list shows them, --undo brings one back")
    forget_cmd.add_argument("runs", nargs="*", metavar="RUN", help="run ids (file names or their NNNN prefix) or "
                            "files in the storage")
    forget_cmd.add_argument("--why", help="the reason, kept in the list")
    forget_cmd.add_argument("--undo", action="store_true", help="bring the named runs back into the history")
    forget_cmd.add_argument("--list", action="store_true", help="the runs set aside (the default without RUN)")
    _storage_argument(forget_cmd)
    _format_argument(forget_cmd)
    forget_cmd.set_defaults(run_command=cmd_forget)

    report_cmd = commands.add_parser("report", help="an HTML page of runs (and the history of a storage) that answers "
                                     "first: the best way to share, a summary table, then figures linked in figures/")
    report_cmd.add_argument("runs", nargs="*", help=RUN_HELP + " (default: the latest run of --storage or .benchmarks)")
    report_cmd.add_argument("--storage", type=_storage, help="also draw the history of this pytest-benchmark storage "
                            "(a folder or a file:// URL)")
    report_cmd.add_argument("--out", default="gpucolloc-report", help="folder for index.html and figures/ "
                            "(default gpucolloc-report)")
    _window_arguments(report_cmd, "with --storage: show the history of")
    report_cmd.set_defaults(run_command=cmd_report)

    advise_cmd = commands.add_parser("advise", help="rank the measured ways a job mix can share this GPU, and say "
                                     "which and why (exit 3: nothing measured runs these jobs); or, with "
                                     "--p99-within, which way keeps a service's p99 within a budget while training "
                                     "gets the most (exit 1: no measured way does)")
    advise_cmd.add_argument("runs", nargs="*", help=RUN_HELP + " (default: the storage's latest run)")
    _storage_argument(advise_cmd)
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
    _window_arguments(plot, "draw the history of")
    plot.add_argument("--format", choices=["png", "svg"], default="png",
                      help="the figures' file format (default png); this command writes figures, not tables")
    plot.set_defaults(run_command=cmd_plot)

    table = commands.add_parser("table", help="table of the scenarios in pytest-benchmark JSON files")
    table.add_argument("files", nargs="*", metavar="run", help=RUN_HELP + " (default: the storage's latest run)")
    _storage_argument(table)
    table.add_argument("--columns", type=_columns(TABLE_COLUMNS), help="the table's columns, comma-separated, among "
                       f"{','.join(TABLE_COLUMNS)} (default all)")
    _format_argument(table, extra=("text",))  # text: the name "table" had before
    table.set_defaults(run_command=cmd_table)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # --help, --version (0) or a usage error (2), already said: its code is returned
        return done.code if isinstance(done.code, int) else int(done.code is not None)
    if getattr(args, "format", None) == "text":
        args.format = "table"
    if sys.stdout is None:  # started with stdout closed (>&-): print() would drop the answer without a word
        print("error: cannot write the output: stdout is closed", file=sys.stderr)
        return UNWRITABLE
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
    except OSError as error:  # the commands name what they cannot read: this is stdout that cannot be written
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (/dev/full): nothing left to fail at exit
        print(f"error: cannot write the output: {error.strerror or error}", file=sys.stderr)
        return UNWRITABLE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
