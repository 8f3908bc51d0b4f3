"""pytest-gpucolloc: read, judge and draw the collocation scenarios that pytest saved (pytest-benchmark's
storage and JSON files), plan MIG layouts, and compare two revisions or environments in one job (A/B)."""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import NoReturn

from ..ab_table import COLUMNS as AB_COLUMNS
from ..benchmark_api import storage_path
from ..forget import ListError
from ..gate_table import GATE_COLUMNS
from ..history import METRICS
from ..machine import PLUGIN_VERSION
from ..options import MAX_ALPHA, MAX_RUNS, MAX_THRESHOLD, MIN_ALPHA, number_option
from ..report import COLUMNS as TABLE_COLUMNS
from ..report import columns
from ..table_fit import terminal_width, wrapped
from ..verdict import DEFAULT_ALPHA, DEFAULT_MIN_RUNS, DEFAULT_RUNS, DEFAULT_THRESHOLD
from .common import (
    INTERRUPTED,
    NEGATIVE,
    NOTHING_JUDGED,
    NOTHING_TO_READ,
    OK,
    PIPE_CLOSED,
    UNWRITABLE,
    USAGE,
    CommandError,
)
from .judging import cmd_ab, cmd_compare, cmd_forget, cmd_gate, cmd_history
from .mig import cmd_mig_plan, cmd_mig_profiles, cmd_mig_restore
from .reading import cmd_advise, cmd_check, cmd_info, cmd_plot, cmd_report, cmd_table

# what scripts and tests use: the entry point, its parser, the formats and the exit codes (docs/cli.md)
__all__ = ["main", "build_parser", "FORMATS", "OK", "NEGATIVE", "USAGE", "NOTHING_TO_READ", "UNWRITABLE",
           "NOTHING_JUDGED", "PIPE_CLOSED", "INTERRUPTED"]


RECENT_RUNS = 200  # history, plot and report show the newest this many runs unless told (--last, --since)
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


RUN_HELP = ("saved runs: files, run ids in --storage (a file name or its NNNN number), or a storage folder (its latest "
            "run)")


def run_name(text: str) -> str:
    """A run as the commands name one; an empty name (``gate "$RUN"`` with RUN unset) names none, never the latest."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the run named is empty (an unset variable?): name a run, or leave the "
                                         "argument out")
    return text


def storage_folder(text: str) -> Path:
    """--storage as pytest's --benchmark-storage takes it: a folder or a file:// URL."""
    path = storage_path(text)
    if path is None:
        raise argparse.ArgumentTypeError(f"{text!r}: only pytest-benchmark's file storage can be read "
                                         "(a folder, or a file:// URL)")
    return path


def argument_type(parse):
    """An argparse type of a parser that raises ValueError: its message is the usage error's."""
    def check(text: str):
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return check


def checked(name: str, low: float, high: float, integer: bool = False):
    """An argparse type that checks the value as the plugin's own option of the same meaning does."""
    return argument_type(number_option(name, low, high, integer))


class Parser(argparse.ArgumentParser):
    """argparse's parser, naming the nearest choice of a mistyped one (``gaet``: did you mean 'gate'?), as
    Python 3.14's ``suggest_on_error`` does; exit 2 as any usage error."""

    def error(self, message: str) -> NoReturn:
        if typed := re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message):
            choices = [choice.strip(" '") for choice in typed[2].split(",")]
            if near := difflib.get_close_matches(typed[1], choices, n=1):
                message = message.replace(f"'{typed[1]}' (", f"'{typed[1]}', did you mean '{near[0]}'? (", 1)
        super().error(message)


def columns_argument(parser, names: list[str], default: str) -> None:
    parser.add_argument("--columns", type=argument_type(lambda text: columns(text, names)),
                        help=f"the table's columns, comma-separated, among {', '.join(names)} ({default})")


def storage_argument(parser) -> None:
    parser.add_argument("--storage", type=storage_folder, default=Path(".benchmarks"),
                        help="pytest-benchmark's storage as pytest's --benchmark-storage takes it: a folder or a "
                             "file:// URL (default .benchmarks)")


def since(text: str) -> str:
    """--since: an ISO date or date and time (UTC unless it says its offset), as the saved runs' times (UTC)
    compare with it."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date (2026-12-01) or date and time "
                                         "(2026-12-01T08:00)") from None
    return (when.astimezone(timezone.utc).replace(tzinfo=None) if when.tzinfo else when).isoformat()


def window_arguments(parser, what: str) -> None:
    parser.add_argument("--last", type=checked("--last", 0, 10**9, integer=True), default=RECENT_RUNS,
                        help=f"{what} the newest this many saved runs; older level shifts are summed up in a line "
                             f"(default {RECENT_RUNS}; 0: every run)")
    parser.add_argument("--since", type=since, help=f"{what} runs saved at or after this date (UTC), e.g. 2026-12-01")


def format_argument(parser, extra: tuple[str, ...] = ()) -> None:
    parser.add_argument("--format", choices=FORMATS + list(extra), default="table",
                        help=f"output: {', '.join(FORMATS)} (default table)")


def judging_arguments(parser) -> None:
    parser.add_argument("--threshold", type=checked("--threshold", 0, MAX_THRESHOLD), default=100 * DEFAULT_THRESHOLD,
                        help=f"smallest drop in percent that counts (default {100 * DEFAULT_THRESHOLD:g})")
    parser.add_argument("--alpha", type=checked("--alpha", MIN_ALPHA, MAX_ALPHA), default=DEFAULT_ALPHA,
                        help="false-alarm rate per judgement: a scenario's throughput, and each latency of its "
                             f"service (default {DEFAULT_ALPHA:g})")


def gate_arguments(parser) -> None:
    storage_argument(parser)
    judging_arguments(parser)
    parser.add_argument("--runs", type=checked("--runs", 2, MAX_RUNS, integer=True), default=DEFAULT_RUNS,
                        help=f"baseline: most recent N comparable runs (default {DEFAULT_RUNS})")
    parser.add_argument("--min-runs", type=checked("--min-runs", 1, MAX_RUNS, integer=True), default=DEFAULT_MIN_RUNS,
                        help=f"fewest baseline runs to decide (default {DEFAULT_MIN_RUNS})")
    format_argument(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="pytest-gpucolloc", description=__doc__, epilog=EXIT_CODES,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {PLUGIN_VERSION}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run, text: str, under=commands) -> argparse.ArgumentParser:
        """A command (``under``: its parent's subparsers) and the function that runs it."""
        sub = under.add_parser(name, help=text)
        sub.set_defaults(run_command=run)
        return sub

    command("info", cmd_info, "GPUs, driver and sharing modes as this machine reports them")
    format_argument(command("check", cmd_check, "what on this machine would make numbers unsteady, before a benchmark: "
                            "GPU persistence, power limit, clocks, other processes, MIG; MPS daemons, CPU governor "
                            "and load (read-only; exit 1: something would)"))
    mig = commands.add_parser("mig", help="MIG profiles and layout plans (read-only unless 'restore')")
    mig_commands = mig.add_subparsers(dest="mig_command", required=True)
    profiles = command("profiles", cmd_mig_profiles, "the GPU's MIG profile table", mig_commands)
    plan = command("plan", cmd_mig_plan, "placements for a layout, or why it does not fit", mig_commands)
    plan.add_argument("layout", help="e.g. '4g,2g,2g' or '3g.71gb,2g.35gb,1g.18gb*2'")
    restore = command("restore", cmd_mig_restore, "restore a MIG layout a killed run left saved", mig_commands)
    for sub in (profiles, plan):
        sub.add_argument("--table", help="a named table instead of the live GPU: h200, h100-80gb, a100-40gb, a100-80gb")
    for sub in (profiles, plan, restore):
        sub.add_argument("--gpu", default="0", help="GPU index or UUID (default 0)")
    format_argument(profiles)
    profiles.add_argument("--json", action="store_true", help="the same as --format json")
    restore.add_argument("--checkpoint-dir", help="where runs save the layout they changed (default: the plugin's, "
                         "as --mig-checkpoint-dir)")

    gate_cmd = command("gate", cmd_gate, "judge a saved run against the history in the storage (exit 1: a regression; "
                       "3: the storage holds no saved runs; 5: nothing judged, as pytest's gate)")
    gate_cmd.add_argument("run", nargs="?", type=run_name, help=RUN_HELP + " (default: the storage's latest run)")
    gate_cmd.add_argument("--markdown", help="also write the verdicts as Markdown to this file (a CI job summary)")
    columns_argument(gate_cmd, GATE_COLUMNS, "default all; in a terminal a long reason is numbered and said below "
                     "the table")
    gate_arguments(gate_cmd)

    compare_cmd = command("compare", cmd_compare, "compare two sets of saved runs, per scenario (exit 1: a regression; "
                          "one run against one says the change, not a verdict)")
    compare_cmd.add_argument("runs", nargs="*", metavar="RUN", type=run_name,
                             help="two run ids, before then after (file names or their NNNN prefix), as gate names "
                                  "one; the same as --runs-ids")
    compare_cmd.add_argument("--runs-ids", dest="runs_ids", nargs=2, metavar=("BEFORE", "AFTER"), type=run_name,
                             help="two run ids (file names or their NNNN prefix), pytest-benchmark's spelling")
    compare_cmd.add_argument("--commits", nargs=2, metavar=("BEFORE", "AFTER"),
                             help="two commits (ids, prefixes or git revisions such as HEAD~1): the runs saved "
                                  "at each")
    compare_cmd.add_argument("--group-by", help="a machine_info key: driver_version, cuda_driver_version, torch, ...")
    compare_cmd.add_argument("--groups", nargs=2, metavar=("BEFORE", "AFTER"), help="the two values of --group-by")
    gate_arguments(compare_cmd)

    history_cmd = command("history", cmd_history, "level shifts (change points) in each scenario's saved history, per "
                          "physical GPU")
    storage_argument(history_cmd)
    history_cmd.add_argument("--scenario", help="only scenarios whose name contains this")
    history_cmd.add_argument("--gpu", help="only the GPU whose UUID starts with this")
    history_cmd.add_argument("--alpha", type=checked("--alpha", 1e-9, 0.2), default=0.01,
                             help="a shift counts when its levels differ at p below this (default 0.01)")
    history_cmd.add_argument("--min-runs", type=checked("--min-runs", 2, 1000, integer=True), default=3,
                             help="runs a level must hold on each side of a shift (default 3)")
    history_cmd.add_argument("--metric", choices=METRICS, default="throughput",
                             help="what each series follows: the scenario's throughput, or its serving job's p99 "
                                  "latency (scenarios with Workload(..., rate=...); saturated runs left out) "
                                  "(default throughput)")
    window_arguments(history_cmd, "list the level shifts of")
    format_argument(history_cmd)

    ab_cmd = command("ab", cmd_ab, "paired A/B in one job: two interpreters, environments or git revisions of the "
                     "scenario code, both warm at once and measured in alternating short windows (exit 0 no "
                     "regression, 1 regression, 2 usage error)")
    ab_cmd.add_argument("--baseline", required=True,
                        help="a Python interpreter, a virtual environment or a git revision")
    ab_cmd.add_argument("--candidate", required=True, help="the same kinds as --baseline")
    ab_cmd.add_argument("--ab-min-blocks", type=checked("--ab-min-blocks", 2, 1000, integer=True), default=3,
                        help="blocks (fresh processes in each arm) per scenario at least, 2 or more (default 3)")
    ab_cmd.add_argument("--ab-max-blocks", type=checked("--ab-max-blocks", 2, 1000, integer=True),
                        help="blocks per scenario at most while it is inconclusive (default 12, or --ab-min-blocks "
                             "where that is more)")
    ab_cmd.add_argument("--ab-pairs", type=checked("--ab-pairs", 1, 1000, integer=True), default=5,
                        help="pairs of windows per block, each arm measured once a pair, in random order (default 5)")
    ab_cmd.add_argument("--ab-window-seconds", type=checked("--ab-window-seconds", 0.05, 600), default=1.0,
                        help="length of one arm's measurement window (default 1)")
    ab_cmd.add_argument("--ab-scenario-minutes", type=checked("--ab-scenario-minutes", 0.001, 10000), default=5,
                        help="no new block of a scenario once it would pass this much time (default 5)")
    ab_cmd.add_argument("--ab-budget-minutes", type=checked("--ab-budget-minutes", 0.001, 10000), default=60,
                        help="no new block once the job would pass this much time (default 60)")
    ab_cmd.add_argument("--ab-alone", action="store_true",
                        help="also measure each job alone in both arms (speedups; the A/B does not need them)")
    ab_cmd.add_argument("--out", default="gpucolloc-ab", help="each arm's run JSON, log and saved runs (storage/); "
                        "never the history's storage: an arm is measured in turns (default gpucolloc-ab; one that "
                        "holds an earlier A/B's arms is kept: OUT-2, OUT-3, ... instead)")
    ab_cmd.add_argument("--markdown", help="also write the verdicts as Markdown to this file")
    columns_argument(ab_cmd, AB_COLUMNS, "default all that fit; in a terminal a long reason is numbered and said "
                     "below the table")
    ab_cmd.add_argument("--json", help="also write the verdicts and log-ratios as JSON to this file")
    judging_arguments(ab_cmd)  # its arms save in --out, never the history's storage
    ab_cmd.add_argument("pytest_args", nargs=argparse.REMAINDER,
                        help="what each arm's pytest runs, e.g. benchmarks/ -m gpucolloc_quick --gpu-mode=mps")

    for name, text in (("forget", "leave saved runs out of the history (gate, compare, history, plot, "
                                  "--benchmark-compare) without deleting them: a disturbed run, an experiment"),
                       ("accept", "accept runs the gate judged regressed as the new level (a regression is no "
                                  "baseline until then: a retry would pass on it)")):
        listing = command(name, cmd_forget, f"{text}; --list shows them, --undo takes one back")
        listing.add_argument("runs", nargs="*", metavar="RUN", type=run_name,
                             help="run ids (file names or their NNNN prefix) or files in the storage")
        listing.add_argument("--why", help="the reason, kept in the list")
        listing.add_argument("--undo", action="store_true", help="take the named runs off the list")
        listing.add_argument("--list", action="store_true", help="the runs on the list (the default without RUN)")
        storage_argument(listing)
        format_argument(listing)

    report_cmd = command("report", cmd_report, "an HTML page of runs (and the history of a storage) that answers "
                         "first: the best way to share, a summary table, then figures linked in figures/")
    report_cmd.add_argument("runs", nargs="*", type=run_name,
                            help=RUN_HELP + " (default: the latest run of --storage or .benchmarks)")
    report_cmd.add_argument("--storage", type=storage_folder,
                            help="also draw the history of this pytest-benchmark storage (a folder or a file:// URL)")
    report_cmd.add_argument("--out", default="gpucolloc-report", help="folder for index.html and figures/ "
                            "(default gpucolloc-report)")
    window_arguments(report_cmd, "with --storage: show the history of")

    advise_cmd = command("advise", cmd_advise, "rank the measured ways a job mix can share this GPU, and say which and "
                         "why (exit 3: nothing measured runs these jobs); or, with --p99-within, which way keeps a "
                         "service's p99 within a budget while training gets the most (exit 1: no measured way does)")
    advise_cmd.add_argument("runs", nargs="*", type=run_name, help=RUN_HELP + " (default: the storage's latest run)")
    storage_argument(advise_cmd)
    question = advise_cmd.add_mutually_exclusive_group(required=True)
    question.add_argument("--jobs", help="the mix: labels as the summary shows them or workload "
                          "names as Workload takes them, each with *COUNT, e.g. 'resnet26-cifar10/bs128*3,resnet50' "
                          "(a bare name is its default batch size, 32)")
    question.add_argument("--p99-within", metavar="BUDGET", help="a serving job's p99 budget: milliseconds (25) or a "
                          "multiple of its p99 alone at the same rate (2x); answers, per service and number of "
                          "training jobs, the mode and SM reservation within it where training keeps the most")
    format_argument(advise_cmd, extra=("text",))

    plot = command("plot", cmd_plot, "the report's figures as files: scaling, mixes, each job's share, energy (of one "
                   "run), history with gate decisions")
    storage_argument(plot)
    plot.add_argument("--out", default="gpucolloc-plots", help="folder for the figures (default gpucolloc-plots)")
    plot.add_argument("--run", type=run_name, help="run for the figures of one run (default: the newest)")
    window_arguments(plot, "draw the history of")
    plot.add_argument("--format", choices=["png", "svg"], default="png",
                      help="the figures' file format (default png); this command writes figures, not tables")

    table = command("table", cmd_table, "table of the scenarios in pytest-benchmark JSON files")
    table.add_argument("files", nargs="*", metavar="run", type=run_name,
                       help=RUN_HELP + " (default: the storage's latest run)")
    storage_argument(table)
    columns_argument(table, TABLE_COLUMNS, "default all")
    format_argument(table, extra=("text",))  # text: the name "table" had before
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
    except ListError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except CommandError as error:
        # wrapped on a terminal; one line in a log, where it is searched for
        print(wrapped(f"error: {error}", terminal_width() if sys.stderr.isatty() else None), file=sys.stderr)
        return error.code
    except OSError as error:  # the commands name what they cannot read: this is stdout that cannot be written
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush, or fail, at exit
        if isinstance(error, BrokenPipeError):  # stdout's reader stopped reading (| head): end quietly
            return PIPE_CLOSED
        print(f"error: cannot write the output: {error.strerror or error}", file=sys.stderr)  # e.g. /dev/full
        return UNWRITABLE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED

