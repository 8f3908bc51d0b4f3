"""What every command shares: exit codes, reading saved runs and storage, writing outputs, argument types."""
from __future__ import annotations

import argparse
import difflib
import re
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import NoReturn

from .. import history
from ..benchmark_api import storage_path
from ..gate import Policy
from ..options import MAX_ALPHA, MAX_RUNS, MAX_THRESHOLD, MIN_ALPHA, number_option
from ..report import columns
from ..scratch import can_write_in
from ..table_fit import terminal_width, wrapped
from ..verdict import DEFAULT_ALPHA, DEFAULT_MIN_RUNS, DEFAULT_RUNS, DEFAULT_THRESHOLD
from ..words import CPU_SMOKE  # noqa: F401 (the commands say it from here)

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


RUN_HELP = ("saved runs: files, run ids in --storage (a file name or its NNNN number), or a storage folder (its latest "
            "run)")


class CommandError(Exception):
    """What a command could not do, in one line, and its exit code."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


@contextmanager
def failing(errors, code: int, prefix: str = ""):
    """An error of the kinds ``errors`` raised inside fails the command with its message and exit ``code``."""
    try:
        yield
    except errors as error:
        raise CommandError(f"{prefix}{error}", code) from None


def read_runs(paths) -> list:
    runs = []
    for path in paths:
        try:
            runs.append(history.read_run(Path(path)))
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise CommandError(f"cannot read {path}: {str(error)[:200]}", USAGE) from None
        for problem in runs[-1].problems:  # scenarios skipped: named by every command that reads files
            note(f"warning: {problem}")
    return runs


def note(text: str) -> None:
    """A line on stderr (a warning, a note beside the answer), wrapped to the tables' width."""
    print(wrapped(text, terminal_width()), file=sys.stderr)


def prose_width(fmt: str) -> int | None:
    """The width a command's prose wraps to: a terminal's table's; none where the output is data or Markdown."""
    return terminal_width() if fmt == "table" else None


def is_path(name) -> bool:
    """Whether a run's name is a path (a file or a storage folder) rather than a run id."""
    return Path(name).exists() or "/" in str(name) or str(name).endswith(".json")


def named_runs(names: list, storage: Path, loaded=None) -> list:
    """Saved runs as every command names them: a file, a storage folder (its latest run), or a run id (its file name
    or NNNN number) in ``storage``; none named: the storage's latest run (of its history: not an experiment or a run
    set aside). ``loaded``: the storage's history, where the caller has read it."""
    def latest(folder: Path):
        history_of = loaded if loaded is not None and folder == storage and loaded.runs else load_history(folder)
        return history_of.runs[-1]

    if any(Path(name).is_dir() for name in names):  # `gate .benchmarks`: a folder's latest run
        return [run for name in names for run in (
            [latest(Path(name))] if Path(name).is_dir() else named_runs([name], storage, loaded))]
    if names and all(map(is_path, names)):
        return read_runs(names)
    loaded = loaded if loaded is not None else load_history(storage, named=bool(names))
    if not names:
        return [loaded.runs[-1]]
    runs: list = []
    for name in names:
        found = read_runs([name]) if is_path(name) else loaded.named(str(name))
        if len(found) != 1:
            raise CommandError(f"{str(name)!r} names {len(found)} saved runs under {storage}"
                               + (f": {', '.join(str(run.path) for run in found)}" if found else
                                  " (a file name, its NNNN number, a path to the file, or a storage folder)"), USAGE)
        runs += found
    return runs


def write_out(path, text: str) -> None:
    """Write an output file (its folder made if need be), or fail with exit code 4."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    except OSError as error:
        raise CommandError(f"cannot write {path}: {error.strerror or error}", UNWRITABLE) from None


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


def storage_folder(text: str) -> Path:
    """--storage as pytest's --benchmark-storage takes it: a folder or a file:// URL."""
    path = storage_path(text)
    if path is None:
        raise argparse.ArgumentTypeError(f"{text!r}: only pytest-benchmark's file storage can be read "
                                         "(a folder, or a file:// URL)")
    return path


def load_history(root: Path, named: bool = False):
    """The saved runs under ``root``; storage that does not exist or holds no run of this plugin is exit code 3,
    never an empty history (a mis-set storage path must not pass as "no baseline"). ``named``: runs will be named by
    id, so runs left out of the history (an A/B's own storage holds only those) are enough."""
    if not root.is_dir():
        raise CommandError(f"no storage folder {root}" + (" (a file)" if root.exists() else "") + ": check --storage "
                           "(pytest saves runs there with --benchmark-autosave)", NOTHING_TO_READ)
    loaded = history.load(root)
    for problem in loaded.problems:
        note(f"warning: {problem}")
    if loaded.left_out:  # said, so that a run missing from an answer is not a mystery
        note(f"note: {len(loaded.left_out)} run(s) left out of the history: " + "; ".join(
            f"{run.run_id} ({why})" for run, why in loaded.left_out[:3]) + ("; ..." if len(loaded.left_out) > 3
                                                                          else ""))
    if not loaded.runs and loaded.left_out and not named:
        raise CommandError(f"every saved run under {root} is left out of the history ({len(loaded.left_out)}, above): "
                           "name one by its id to read it (e.g. `compare --runs-ids A B`)", NOTHING_TO_READ)
    if not loaded.runs and not loaded.left_out:
        raise CommandError(f"no saved pytest-gpucolloc runs under {root}"
                           + (f" ({len(loaded.problems)} files could not be read, above)" if loaded.problems else "")
                           + ": check --storage (pytest saves runs there with --benchmark-autosave)", NOTHING_TO_READ)
    return loaded


def policy_of(args):
    return Policy(threshold=args.threshold / 100, alpha=args.alpha, runs=args.runs, min_runs=args.min_runs)


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
        typed = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if typed:
            choices = [choice.strip(" '") for choice in typed[2].split(",")]
            near = difflib.get_close_matches(typed[1], choices, n=1)
            if near:
                message = message.replace(f"'{typed[1]}' (", f"'{typed[1]}', did you mean '{near[0]}'? (", 1)
        super().error(message)


def columns_argument(names: list[str]):
    return argument_type(lambda text: columns(text, names))


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


def judging_arguments(parser, storage: bool = True) -> None:
    if storage:
        storage_argument(parser)
    parser.add_argument("--threshold", type=checked("--threshold", 0, MAX_THRESHOLD), default=100 * DEFAULT_THRESHOLD,
                        help=f"smallest drop in percent that counts (default {100 * DEFAULT_THRESHOLD:g})")
    parser.add_argument("--alpha", type=checked("--alpha", MIN_ALPHA, MAX_ALPHA), default=DEFAULT_ALPHA,
                        help="false-alarm rate per judgement: a scenario's throughput, and each latency of its "
                             f"service (default {DEFAULT_ALPHA:g})")


def gate_arguments(parser) -> None:
    judging_arguments(parser)
    parser.add_argument("--runs", type=checked("--runs", 2, MAX_RUNS, integer=True), default=DEFAULT_RUNS,
                        help=f"baseline: most recent N comparable runs (default {DEFAULT_RUNS})")
    parser.add_argument("--min-runs", type=checked("--min-runs", 1, MAX_RUNS, integer=True), default=DEFAULT_MIN_RUNS,
                        help=f"fewest baseline runs to decide (default {DEFAULT_MIN_RUNS})")
    format_argument(parser)
