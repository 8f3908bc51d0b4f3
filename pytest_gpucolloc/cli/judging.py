"""The commands that judge saved history: gate, compare, history, forget, and ab (two arms in one job)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from .. import changepoints, compare, forget, gate, gate_table, history, history_shifts, report, table_fit
from ..history import LATENCY, experiment, numbered, run_number, short_name
from ..scratch import clean_stale_scratch
from ..signals import sigterm_as_interrupt
from ..table_fit import tabular, terminal_width, wrapped
from ..verdict import Verdict, with_latency
from ..words import count
from .common import (
    CPU_SMOKE,
    NEGATIVE,
    NOTHING_JUDGED,
    NOTHING_TO_READ,
    OK,
    USAGE,
    CommandError,
    changing,
    existing_storage,
    failing,
    is_path,
    load_history,
    named_runs,
    note,
    one_run,
    read_runs,
    write_out,
)

NEWEST = 3  # history's table of series: each one's newest runs, their values and verdicts


def prose_width(fmt: str) -> int | None:
    """The width a command's prose wraps to: a terminal's table's; none where the output is data or Markdown."""
    return terminal_width() if fmt == "table" else None


def policy_of(args):
    return gate.Policy(threshold=args.threshold / 100, alpha=args.alpha, runs=args.runs, min_runs=args.min_runs)


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
    if args.runs:  # `compare 0012 0015`, as `gate 0015`
        if len(args.runs) != 2 or args.runs_ids:
            raise CommandError("compare takes two runs, before then after (compare 0012 0015), or --runs-ids; "
                               f"given: {' '.join(args.runs + (args.runs_ids or []))}", USAGE)
        args.runs_ids = args.runs
    paths = bool(args.runs_ids) and all(map(is_path, args.runs_ids))  # files or folders: no --storage read
    loaded = None if paths else load_history(args.storage, named=bool(args.runs_ids))
    with failing(compare.SelectionError, USAGE):
        if args.runs_ids and any(map(is_path, args.runs_ids)):
            # files or storage folders (their latest run), named as `gate` names them
            before, after = ([run] for run in (named_runs([name], args.storage, loaded)[0] for name in args.runs_ids))
            a, b = numbered([before[0].run_id, after[0].run_id])  # named as the commands take them
            compare.alike([before, after], [a, b])
        else:
            assert loaded is not None
            commits = [_commit(loaded, c) for c in args.commits] if args.commits else None
            before, after, a, b = compare.select(loaded, runs=args.runs_ids, commits=commits,
                                                 group_by=args.group_by, groups=args.groups)
    shared = {run.path.resolve() for run in before} & {run.path.resolve() for run in after}  # files, not names
    if shared:  # a run on both sides is paired with its own neighbours: a change out of nothing
        raise CommandError(f"both sides hold the same run(s) ({', '.join(sorted(p.stem for p in shared))}): name "
                           "two different commits, groups or runs", USAGE)
    if not {n for run in before for n in run.scenarios} & {n for run in after for n in run.scenarios}:
        raise CommandError(f"{a} and {b} share no scenario: nothing to compare (`pytest-gpucolloc table RUN` lists "
                           "a run's)", USAGE)
    said = args.commits or [a, b]  # in the order given, as typed (HEAD~1) and the commit it names
    found = " -> ".join(typed if typed == label else f"{typed} ({label[:10]})" for typed, label in zip(said, (a, b)))
    for run, why in loaded.left_out if loaded else ():  # asked for: compared, said
        if any(run is chosen for chosen in before + after):
            note(f"note: {run.run_id} is compared as named, though {why}")
    rows = compare.compare(before, after, policy_of(args))
    if len(after) > 1 and not compare.alternating(before, after):  # said: the title counts every run
        note(f"note: the newest of the {len(after)} runs after is judged against the {count(len(before), 'run')} "
             "before (runs that alternate, A B A B, are paired instead)")
    title = (f"compare {found} ({count(len(before), 'run')} -> {count(len(after), 'run')}; a change is {said[1]} "
             f"against {said[0]})")
    print(gate_table.render(rows, args.format, title, width=terminal_width()),
          end="\n\n" if args.format == "csv" else "\n")  # its CSV has always ended with an empty line
    # regressed: its throughput or a latency of its serving job, as the gate's exit says it
    return NEGATIVE if any(Verdict.from_dict(verdict).failed for _, verdict in rows) else OK


def cmd_gate(args) -> int:
    if args.runs < args.min_runs:  # said before anything is read
        raise CommandError(f"--runs ({args.runs}) must be at least --min-runs ({args.min_runs}): with fewer the gate "
                           "could never judge", USAGE)
    if args.run and Path(args.run).is_dir():  # `gate FOLDER`: its latest run, against that folder's history
        args.storage = Path(args.run)
    # a file named is read first (its problem said first); the history once, so its notes are said once
    loaded = None
    if args.run and is_path(args.run) and not Path(args.run).is_dir():
        run = read_runs([args.run])[0]
    else:
        loaded = load_history(args.storage, named=bool(args.run) and args.storage != Path(args.run))
        run = named_runs([args.run] if args.run else [], args.storage, loaded)[0]
    if not run.scenarios:
        raise CommandError(f"{run.path} holds no pytest-gpucolloc scenarios", NOTHING_TO_READ)
    if experiment(run):  # its windows were measured another way: a history of ordinary runs cannot judge it
        raise CommandError(f"{run.path} is {experiment(run)}: the gate judges ordinary runs against their history "
                           "(an A/B is judged by `pytest-gpucolloc ab` itself)", USAGE)
    loaded = loaded or load_history(args.storage)
    if not loaded.runs:  # only runs left out (named by id, the run was found among them): no history to judge by
        raise CommandError(f"every saved run under {args.storage} is left out of the history ({len(loaded.left_out)}, "
                           "above): the gate has nothing to judge against", NOTHING_TO_READ)
    policy = policy_of(args)
    # Judge the run as the gate would have when it was made: against the runs saved before it, in the history's
    # order (a file named from elsewhere placed in it as the history places runs), by file: folders share run ids
    itself = run.path.resolve()
    # a copy named: the run counted in its place is the run itself, never its own baseline
    kept = next((r for path, r in loaded.copies.items() if path.resolve() == itself), None)

    def is_it(saved) -> bool:
        return saved is kept or saved.path.resolve() == itself

    stored = [r for r in loaded.runs if is_it(r)]  # the run as the history holds it
    ordered = loaded.runs if stored else history.in_saved_order([*loaded.runs, run])
    at = next(i for i, r in enumerate(ordered) if is_it(r))
    excluded = {r.path for r in ordered[at:]}
    # a scenario whose marker leaves it to paired A/B is not judged here either, as the pytest gate does not
    left = [name for name, scenario in run.scenarios.items() if scenario.gate_by == "ab"]
    left_line = gate_table.left_to_ab_line(left, dict.fromkeys(run.scenarios[name].mode for name in left))
    if len(left) == len(run.scenarios):
        raise CommandError(f"{run.path}: no scenario to judge: {left_line}", NOTHING_JUDGED)
    verdicts = []
    last = history.GATE_WINDOW * policy.runs
    for name in (name for name in run.scenarios if name not in left):
        verdict = gate.decide(run.sample(name), loaded.samples(name, exclude=excluded, last=last), policy)
        for metric in LATENCY:  # a serving job: its latency judged too
            if (latency := run.sample(name, metric)) is not None:
                with_latency(verdict, gate.decide(
                    latency, loaded.samples(name, exclude=excluded, metric=metric, last=last), policy))
        verdicts.append((name, verdict))
    shown = [(name, verdict.to_dict()) for name, verdict in verdicts]
    # as the pytest summary says it: CPU runs check the suite
    smoke = f"; {CPU_SMOKE}" if run.machine.get("device") == "cpu" else ""
    judged = f"{run.run_id} ({run.path.parent.name})"  # its machine folder: folders share run ids
    if args.markdown:  # written first: an output that cannot be written is said before the verdicts
        markdown = gate_table.render(shown, "markdown", f"Collocation regression gate: {judged}{smoke}")
        write_out(args.markdown, markdown + "\n")
    print(gate_table.render(shown, args.format, f"gate: {judged}{smoke}", args.columns, terminal_width(),
                            about={"run": run.run_id, "file": str(run.path)}))
    if smoke and args.format in ("json", "csv"):  # data on stdout: said beside it
        print(CPU_SMOKE, file=sys.stderr)
    prose = sys.stdout if args.format in ("table", "markdown") else sys.stderr  # below the table, or where not data
    width = prose_width(args.format)
    if left:
        print(("\n" if prose is sys.stdout else "") + wrapped(left_line, width), file=prose)
    failed = any(verdict.failed for _, verdict in verdicts)
    accepted = loaded.accepted.get(stored[0].path) if stored else None  # this very file, not another of its name
    if failed and accepted:  # the user's word: the change was intended
        print(wrapped(f"{run.run_id} was accepted as the new level on {accepted[:19]} "
                      "(`pytest-gpucolloc accept`): its regression is intended, not a failure", width), file=prose)
        return OK
    # what accepting it does, as its saved verdicts have it; none where they passed it: accept refuses such a run
    hint = {"regressed": gate_table.ACCEPT_HINT, None: gate_table.UNGATED_HINT}.get(saved_verdict(run))
    if failed and hint and stored and not run.machine.get("slowed"):  # accept takes the storage's runs only
        # the run by its number where that names it alone (one machine's folder), else its id, else its file
        named = next((name for name in (run_number(run.run_id), run.run_id) if loaded.named(name) == stored),
                     run.path)
        print(wrapped(hint.format(run=named), width), file=prose)
    return NEGATIVE if failed else OK


def cmd_history(args) -> int:
    loaded = load_history(args.storage)
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
    terminal = args.format == "table"  # a run by its number, as the commands take it
    rows = [[short_name(p.scenario), p.gpu[:16], run_number(p.run_id) if terminal else p.run_id,
             (p.commit or "-")[:10], p.driver or "-", p.datetime[:19], level(p.before), level(p.after),
             f"{p.change:+.1%}", f"{p.p_value:.2g}", f"{p.runs_before}/{p.runs_after}"] for p in points]
    unit = f"{args.metric} ms" if p99 else "samples/s"
    headers = ["scenario", "GPU", "starts at run", "commit", "driver", "date", f"before {unit}", f"after {unit}",
               "change", "p", "runs before/after"]
    if args.format == "csv":
        print(tabular(rows, headers, "csv"))
        return OK
    window = f" in the last {len(shown):,} of {len(loaded.runs):,} runs" if len(shown) < len(loaded.runs) else ""
    print(wrapped(f"{len(points)} level shift(s){window} in {len(looked)} series (scenario x physical GPU)"
                  + (f" of the serving job's {args.metric} latency (a + change is slower)" if p99 else "")
                  + f"; a level must hold for {args.min_runs} runs and differ at p < {args.alpha:g} with any one "
                  "run left out", prose_width(args.format)))
    if older:
        print(_older_shifts(older, len(shown), len(loaded.runs)))
    if points and terminal:  # as wide as the terminal: short headers, the least needed columns left out first
        brief = {"starts at run": "starts at", f"before {unit}": f"before, {unit}", f"after {unit}": "after",
                 "runs before/after": "runs"}
        print(table_fit.fitted_table(rows, headers, [brief.get(n, n) for n in headers],
                                     ["driver", "p", "commit", "date", "GPU"], "simple", terminal_width(),
                                     "the Markdown or JSON: --format markdown"))
    elif points:
        print(tabular(rows, headers, args.format))
    print(tabular([[short_name(s), g[:16], f"{n:,}", "; ".join(
        level(value) + (f" {verdict}" if verdict else "") for _, value, verdict in runs_of[(s, g)][-NEWEST:])]
        for s, g, n in looked], ["scenario", "GPU", "runs", f"newest runs, {unit} (the gate's verdict where gated)"],
        args.format))
    short = [(s, g, n) for s, g, n in looked if not changepoints.can_hold_a_shift(n, args.min_runs)]
    if short:  # "0 level shifts" must not read as "steady" where no shift could have been found
        print(wrapped(f"{len(short)} of the series have fewer than {2 * args.min_runs} runs (two levels of "
                      f"{args.min_runs}): no shift can be found in them yet: " + ", ".join(
                          f"{short_name(s)} on {g[:16]} ({n} run{'s' if n != 1 else ''})" for s, g, n in short),
                      prose_width(args.format)))
    return 0


def _series_runs(loaded, metric: str, looked, shown: set[str]) -> dict[tuple[str, str], list]:
    """Each series' runs among those shown, oldest first: (run id, its value in the metric's unit, the gate's verdict
    on it or None where it was not gated)."""
    found = history_shifts.series(loaded, metric)

    def verdict(run, name: str) -> str | None:  # the gate's, on its throughput or on a latency of its serving job
        judged = run.scenarios[name].gate or {}
        if metric != "throughput":
            judged = (judged.get("latency") or {}).get(metric) or (judged.get("p99") if metric == "p99" else None) or {}
        said = judged.get("verdict")
        return f"{said} (accepted)" if said and run.path in loaded.accepted else said

    return {(name, gpu): [(p.run.run_id, math.exp(p.log_level), verdict(p.run, name))
                          for p in found[(name, gpu)] if p.run.run_id in shown] for name, gpu, _ in looked}


def saved_verdict(run) -> str | None:
    """What the pytest gate said of ``run`` when it was saved: "regressed" (a scenario regressed; no baseline of later
    runs until accepted), "not regressed", or None where it saved no verdict (no --colloc-gate)."""
    said = [scenario.verdict for scenario in run.scenarios.values() if scenario.verdict]
    return "regressed" if "regressed" in said else "not regressed" if said else None


LISTS = {  # command -> (its list, what putting a run on it means, taking one off, the heading of --list)
    "forget": (forget.FILE, "left out of the history (the files are kept; `pytest-gpucolloc forget --undo RUN` brings "
               "one back)", "back in the history", "set aside"),
    "accept": (forget.ACCEPTED, "accepted as the new level: later runs are judged against it, though the gate "
               "judged it regressed (`pytest-gpucolloc accept --undo RUN` takes one back)", "no longer accepted",
               "accepted"),
}


def cmd_forget(args) -> int:
    """Put saved runs on the command's list (forget: left out of every history; accept: regressed runs that are a
    baseline again), list them, or take them off. The runs' files are never touched."""
    file, done, undone, heading = LISTS[args.command]
    if not args.runs and (args.why or args.undo):
        raise CommandError(f"{'--why' if args.why else '--undo'} needs the runs it is for: `pytest-gpucolloc "
                           f"{args.command} {'--undo ' if args.undo else ''}RUN ...`", USAGE)
    root = existing_storage(args.storage)  # a mis-set --storage: its lists are not empty, they are not there
    if args.list or not args.runs:
        listed = forget.read_beside(root, file)  # as the history reads it
        keys = sorted(listed)  # in a terminal a run by its number; data keeps its path; data's missing reason: null
        terminal = args.format in ("table", "markdown")
        names = numbered([Path(key).stem for key in keys], keys) if terminal else keys
        rows = [[name, listed[key][0], listed[key][1] or ("-" if terminal else None)] for name, key in zip(names, keys)]
        print(tabular(rows, ["run", heading, "why"], args.format) if rows or args.format == "json"
              else f"no run {heading} under {root}")
        return OK
    if args.undo:
        listed = forget.read(root, file)
        keys = []
        for wanted in args.runs:
            found = [key for key in listed if wanted in (key, Path(key).stem, run_number(Path(key).stem))]
            if len(found) != 1:
                raise CommandError(f"{wanted!r} names {len(found)} of the runs {heading} under {root}"
                                   + (f" ({', '.join(found)}): name it by its path" if found else
                                      f": `pytest-gpucolloc {args.command} --list` shows them"), USAGE)
            keys += found
        with changing(root / file, args.command):
            forget.undo(root, keys, file)
        print(wrapped(f"{undone}: " + ", ".join(keys), terminal_width()))
        return OK
    loaded = history.load(root)
    runs: list[history.SavedRun] = []
    for wanted in dict.fromkeys(args.runs):  # each once
        # by id, or by its file: a saved run under this storage only (a list names runs of its storage)
        runs.append(one_run(wanted, loaded.named(wanted) or [
            run for run in [*loaded.runs, *(r for r, _ in loaded.left_out)]
            if is_path(wanted) and run.path.resolve() == Path(wanted).resolve()], root))
    if args.command == "accept" and (slowed := [r.run_id for r in runs if r.machine.get("slowed")]):
        raise CommandError(f"{', '.join(slowed)} was slowed on purpose (--colloc-extra-step-every): it is never a "
                           "baseline, so there is no level to accept", USAGE)
    if args.command == "accept" and (judged := [r.run_id for r in runs if saved_verdict(r) == "not regressed"]):
        raise CommandError(f"accept takes a run the gate judged regressed, and {', '.join(judged)} was not (its "
                           "runs before would leave the baseline for nothing): `pytest-gpucolloc gate RUN` says "
                           "its verdicts", USAGE)
    with changing(root / file, args.command):
        keys = forget.add(root, [run.path for run in runs], args.why or "", file)
    print(wrapped(f"{done}: " + ", ".join(keys), terminal_width()))
    for run in runs if args.command == "accept" else ():
        if saved_verdict(run) is None:  # the pytest gate did not judge it: `pytest-gpucolloc gate` did
            note(f"note: {run.run_id} carries no verdict of the gate (saved without --colloc-gate): accepted all the "
                 "same, the level starts at it and the runs before it are no baseline of later runs")
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
    from .. import ab, ab_arms, ab_judge, ab_table  # hdrhistogram and the worker's code load only for ab

    here = Path.cwd()
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    if args.ab_max_blocks is not None and args.ab_max_blocks < args.ab_min_blocks:  # said before any arm starts
        raise CommandError(f"--ab-max-blocks ({args.ab_max_blocks}) must be at least --ab-min-blocks "
                           f"({args.ab_min_blocks})", USAGE)
    settings = ab.Settings(threshold=args.threshold / 100, alpha=args.alpha, min_blocks=args.ab_min_blocks,
                           max_blocks=args.ab_max_blocks or max(12, args.ab_min_blocks), pairs_per_block=args.ab_pairs,
                           window_s=args.ab_window_seconds, scenario_budget_s=60 * args.ab_scenario_minutes,
                           budget_s=60 * args.ab_budget_minutes, alone=args.ab_alone)
    removed = clean_stale_scratch()  # a killed ab's arms, worktrees and socket folder (and a killed run's scratch)
    if removed:
        print(f"removed what killed runs left: {', '.join(removed)}", file=sys.stderr)
    with failing(ab_arms.ABError, USAGE):
        ab_arms.check_pytest_args(pytest_args)
        arms = [ab_arms.resolve(args.baseline, "baseline", here), ab_arms.resolve(args.candidate, "candidate", here)]
        if any(arm.kind == "revision" for arm in arms):
            ab_arms.check_clean(here)
        ab_arms.check_gpu_idle(pytest_args)
        ab_arms.check_out(Path(args.out).resolve(), here)
        out = ab_arms.fresh_out(Path(args.out).resolve())
        if out != Path(args.out).resolve():
            note(f"{args.out} holds an earlier A/B's arms (kept): this one writes into {out}")
        with sigterm_as_interrupt(), ab_arms.checked_out(arms, here):
            judgements, runs = ab.run(arms[0], arms[1], pytest_args, settings, out, say=note)
    title = (f"A/B: {args.candidate} (candidate) vs {args.baseline} (baseline), interleaved windows of "
             f"{settings.window_s:g} s in blocks of fresh processes")
    scenarios = [s for run in runs for s in history.read_run(run.path).scenarios.values()]
    if scenarios and all(s.device == "cpu" for s in scenarios):  # as the pytest summary says it
        title += f"; {CPU_SMOKE}"
    width = terminal_width()
    print(wrapped(title, width))
    print(ab_table.table(judgements, columns=args.columns, width=width))
    for line in ab_judge.in_words(judgements):
        print(wrapped(line, width))
    saved = [found.stem for run in runs for found in sorted((out / "storage").glob(f"*/*-{run.arm}.json"))]
    if saved:  # where the arms' runs are (a fresh folder: only this A/B's), and how to read them: no history holds them
        print(wrapped(f"each arm's run is saved in {out / 'storage'} ({', '.join(saved)}), kept out of every history "
                      "(an arm is measured in turns); the verdicts above judge them; their numbers side by side "
                      "(one run each: no verdict there):", width))
        # the arms save side by side: both may take one number, then their full ids
        print(f"  pytest-gpucolloc compare {' '.join(numbered(saved))} --storage {out / 'storage'}")
    if args.markdown:
        write_out(args.markdown, f"### {title}\n\n{ab_table.table(judgements, 'github', args.columns)}\n")
    if args.json:
        write_out(args.json, json.dumps({"baseline": args.baseline, "candidate": args.candidate,
                                     "judgements": [j.to_dict() for j in judgements],
                                     "runs": [str(r.path) for r in runs]}, indent=2))
    return NEGATIVE if any(j.verdict == "regressed" for j in judgements) else OK
