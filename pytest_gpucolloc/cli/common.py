"""What every command shares: exit codes, reading saved runs and storage, writing outputs."""
from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

from .. import history
from ..table_fit import terminal_width, wrapped
from ..words import CPU_SMOKE  # noqa: F401 (the commands say it from here)

# Exit codes, the same for every command (docs/cli.md): each means one thing.
OK, NEGATIVE, USAGE, NOTHING_TO_READ, UNWRITABLE = 0, 1, 2, 3, 4
NOTHING_JUDGED = 5  # gate: a run with nothing to judge; pytest's code for a gated run that judged none
PIPE_CLOSED = 141  # stdout closed by its reader (``| head``): what a shell reports for a process ended by SIGPIPE
INTERRUPTED = 130


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


def changing(path: Path, command: str):
    """A list of the storage that cannot be written: named, with what to do, not taken for stdout (exit 4 all the
    same)."""
    return failing(OSError, UNWRITABLE, f"cannot change {path} (run `pytest-gpucolloc {command}` as a user who may "
                   "write the storage, not on a read-only mount): ")


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


def is_path(name) -> bool:
    """Whether a run's name is a path (a file or a storage folder) rather than a run id."""
    return Path(name).exists() or "/" in str(name) or str(name).endswith(".json")


def named_runs(names: list, storage: Path, loaded=None) -> list:
    """Saved runs as every command names them: a file, a storage folder (its latest run), or a run id (its file name
    or NNNN number) in ``storage``; none named: the storage's latest run (``newest``). ``loaded``: the storage's
    history, where the caller has read it."""
    def latest(folder: Path):
        return newest(loaded if loaded is not None and folder == storage and loaded.runs else load_history(folder),
                      folder)

    if any(Path(name).is_dir() for name in names):  # `gate .benchmarks`: a folder's latest run
        return [run for name in names for run in (
            [latest(Path(name))] if Path(name).is_dir() else named_runs([name], storage, loaded))]
    if names and all(map(is_path, names)):
        return read_runs(names)
    loaded = loaded if loaded is not None else load_history(storage, named=bool(names))
    if not names:
        return [newest(loaded, storage)]
    return [one_run(name, read_runs([name]) if is_path(name) else loaded.named(str(name)), storage,
                    " (a file name, its NNNN number, a path to the file, or a storage folder)") for name in names]


def one_run(name, found: list, storage: Path, none: str = ""):
    """The one run ``name`` names among ``found``; none or several: a usage error saying so (``none``: how to name
    one), the several by their files (machine folders share run ids)."""
    if len(found) != 1:
        raise CommandError(f"{str(name)!r} names {len(found)} saved runs under {storage}"
                           + (f" ({', '.join(str(run.path) for run in found)}): name it by its file" if found else
                              none), USAGE)
    return found[0]


def _number(run) -> int:
    """A saved run's NNNN number; -1 for a file pytest-benchmark did not name (it saves ``NNNN_name.json``)."""
    number = history.run_number(run.run_id)
    return int(number) if number.isdigit() else -1


def _written(path: Path) -> int:
    return path.stat().st_mtime_ns if path.exists() else 0


def newest(loaded, storage: Path):
    """The storage's latest run: the file saved last, the history's or one holding no scenario, never a run left out
    of the history. In each machine folder the last in the history's order (``history.in_saved_order``: by number);
    among folders the one recording the latest datetime (a copied storage's files all carry the copy's time), the
    file written last on a tie. One holding no scenario, or that cannot be read, fails: an older run judged instead
    would pass a gate that measured nothing."""
    # a file without scenarios counts where pytest-benchmark saved it numbered in a session that invited the plugin
    # (its machine info says so): another project's benchmarks sharing the storage are not this plugin's runs
    empty = [run for run in loaded.empty if _number(run) >= 0 and run.machine]
    last = {run.path.parent: run for run in history.in_saved_order([*loaded.runs, *empty])}  # each folder's last
    run = max(last.values(), key=lambda run: (run.datetime, _written(run.path)))
    for path in loaded.unreadable:  # one saved after it in its folder that could not be read: never passed over
        number = history.run_number(path.stem)
        if path.parent == run.path.parent and number.isdigit() and int(number) > _number(run):
            raise CommandError(f"{path}, the latest run saved under {storage}, could not be read (above): an older run "
                               "judged in its place would pass a gate that never judged this one: move it aside, or "
                               "name an earlier run by its number", NOTHING_TO_READ)
    if not run.scenarios:
        raise CommandError(f"{run.path}, the latest run saved under {storage}, holds no pytest-gpucolloc scenarios "
                           "(none of its collocation tests ran: deselected, skipped or failed): run them again with "
                           "--benchmark-autosave (or --colloc-gate), or name an earlier run by its number",
                           NOTHING_TO_READ)
    return run


def write_out(path, text: str) -> None:
    """Write an output file (its folder made if need be), or fail with exit code 4."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    except OSError as error:
        raise CommandError(f"cannot write {path}: {error.strerror or error}", UNWRITABLE) from None


def existing_storage(root: Path) -> Path:
    """``root``, a folder; storage that does not exist is exit code 3 (a mis-set path, not an empty storage)."""
    if not root.is_dir():
        raise CommandError(f"no storage folder {root}" + (" (a file)" if root.exists() else "") + ": check --storage "
                           "(pytest saves runs there with --benchmark-autosave)", NOTHING_TO_READ)
    return root


def load_history(root: Path, named: bool = False):
    """The saved runs under ``root``; storage that does not exist or holds no run of this plugin is exit code 3,
    never an empty history (a mis-set storage path must not pass as "no baseline"). ``named``: runs will be named by
    id, so runs left out of the history (an A/B's own storage holds only those) are enough."""
    loaded = history.load(existing_storage(root))
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
