"""The user's word on saved runs, kept beside them: runs set aside (``pytest-gpucolloc forget``: kept in the
storage, left out of its history) and regressed runs accepted as the new level (``pytest-gpucolloc accept``: a run
the gate judged regressed is no baseline until then).

Each list is a text file in the storage folder, one run a line: its path under the storage, when it was listed,
and why, separated by tabs. The runs' JSON files are never edited or deleted: ``--undo`` takes a run off a list.
"""
from __future__ import annotations

import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from . import index

FILE = "gpucolloc-forgotten.tsv"  # not *.json: pytest-benchmark and the history read those as runs
ACCEPTED = "gpucolloc-accepted.tsv"
HEADERS = {FILE: "runs left out of the history by `pytest-gpucolloc forget` (--undo brings one back)",
           ACCEPTED: "regressed runs accepted as the new level by `pytest-gpucolloc accept` (--undo takes one back)"}


def _key(root: Path, path: Path) -> str:
    """A run's name in the list: its path under the storage, as the same run is named wherever the storage lies."""
    path, root = Path(path), Path(root)
    if ".." not in path.parts and path.is_absolute() == root.is_absolute():
        try:  # a path found under the storage by walking it: no file system call (10,000 runs at every gate)
            return path.relative_to(root).as_posix()
        except ValueError:
            pass
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.resolve().as_posix()


class ListError(ValueError):
    """A list that is not one this plugin wrote (a folder, a FIFO, binary): named, never read blindly."""


def read(root: Path, file: str = FILE) -> dict[str, tuple[str, str]]:
    """The runs on the list ``file`` under ``root``: path under the storage -> (when, why)."""
    path = Path(root) / file
    if not path.exists():
        return {}
    try:
        if not path.is_file():  # a FIFO would block every command that reads the storage
            raise ValueError("not a regular file")
        text = path.read_bytes().decode()
    except (OSError, ValueError) as error:
        raise ListError(f"{path} is not a list of runs that pytest-gpucolloc can read ({error}): move it aside, "
                        "or delete it to empty the list") from None
    rows = [(line.split("\t") + ["", ""])[:3] for line in text.splitlines()
            if line.strip() and not line.startswith("#")]
    return {key: (when, why) for key, when, why in rows}


def read_beside(root: Path, file: str = FILE) -> dict[str, tuple[str, str]]:
    """``read``, with the runs under ``root`` that the list of the folder above names, or a machine folder's list
    below names: the list is kept where the storage was named (``--storage .benchmarks``), and a machine folder
    named as the storage (``gate .benchmarks/Linux-...``) is still read with it, and the other way round."""
    root = Path(os.path.abspath(root))  # not resolved: a machine folder linked in lies under the storage named
    above = f"{root.name}/"
    entries = {key.removeprefix(above): value for key, value in read(root.parent, file).items()
               if key.startswith(above)}
    # os.path's tests: a folder this user may not enter (lost+found) holds no list; the history's walk names it
    for folder in (p for p in root.iterdir() if os.path.isfile(p / file)) if root.is_dir() else ():
        entries.update((f"{folder.name}/{key}", value) for key, value in read(folder, file).items())
    return entries | read(root, file)


def entry(entries: dict[str, tuple[str, str]], root: Path, path: Path) -> tuple[str, str] | None:
    """(when, why) of the run at ``path`` on the list, or None when it is not on it."""
    return entries.get(_key(root, path)) if entries else None


def why(forgotten: dict[str, tuple[str, str]], root: Path, path: Path) -> str | None:
    """Why the run at ``path`` is left out of the history, or None when it is not."""
    if (listed := entry(forgotten, root, path)) is None:
        return None
    return f"set aside with `pytest-gpucolloc forget` on {listed[0]}" + (f": {listed[1]}" if listed[1] else "")


def _write(root: Path, entries: dict[str, tuple[str, str]], file: str) -> None:
    """The whole list written aside and renamed into place: a reader never sees half of it."""
    lines = [f"# {HEADERS[file]}: path, when, why"]
    lines += [f"{key}\t{when}\t{reason}" for key, (when, reason) in sorted(entries.items())]
    handle, aside = tempfile.mkstemp(prefix=f".{file}.", dir=root)
    with os.fdopen(handle, "w") as out:
        out.write("\n".join(lines) + "\n")
    os.replace(aside, Path(root) / file)


def add(root: Path, paths: list[Path], reason: str = "", file: str = FILE) -> list[str]:
    """Put the runs at ``paths`` on the list ``file``; returns their names in it."""
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")  # as a run's own datetime: compared with it
    keys = [_key(root, path) for path in paths]
    if odd := [key for key in keys if set(key) & set("\t\r\n")]:  # the list's separators: it would misread them
        raise ListError(f"{odd[0]!r}: a tab or line break in its name cannot be kept in {file}: rename the file")
    with index.locked(root):  # another job's run, listed between our read and write, would be lost
        entries = read(root, file)
        # listed again without a reason: the one given before stays
        entries.update({key: (when, " ".join(reason.split()) or entries.get(key, ("", ""))[1]) for key in keys})
        _write(root, entries, file)
    return keys


def undo(root: Path, keys: list[str], file: str = FILE) -> None:
    with index.locked(root):
        _write(root, {key: listed for key, listed in read(root, file).items() if key not in keys}, file)
