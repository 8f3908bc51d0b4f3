"""Runs the user set aside (``pytest-gpucolloc forget``): kept in the storage, left out of its history.

The list is a text file in the storage folder, one run a line: its path under the storage, when it was set aside,
and why, separated by tabs. The runs' JSON files are never edited or deleted: ``forget --undo`` brings a run back.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

FILE = "gpucolloc-forgotten.tsv"  # not *.json: pytest-benchmark and the history read those as runs


def _key(root: Path, path: Path) -> str:
    """A run's name in the list: its path under the storage, as the same run is named wherever the storage lies."""
    try:
        return Path(path).resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return Path(path).resolve().as_posix()


def read(root: Path) -> dict[str, tuple[str, str]]:
    """The runs set aside under ``root``: path under the storage -> (when, why)."""
    try:
        text = (Path(root) / FILE).read_text()
    except FileNotFoundError:
        return {}
    forgotten = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            key, when, why = (line.split("\t") + ["", ""])[:3]
            forgotten[key] = (when, why)
    return forgotten


def why(forgotten: dict[str, tuple[str, str]], root: Path, path: Path) -> str | None:
    """Why the run at ``path`` is left out of the history, or None when it is not."""
    entry = forgotten.get(_key(root, path))
    if entry is None:
        return None
    when, reason = entry
    return f"set aside with `pytest-gpucolloc forget` on {when}" + (f": {reason}" if reason else "")


def _write(root: Path, forgotten: dict[str, tuple[str, str]]) -> None:
    """The whole list written aside and renamed into place: a reader never sees half of it."""
    lines = ["# runs left out of the history by `pytest-gpucolloc forget` (--undo brings one back): path, when, why"]
    lines += [f"{key}\t{when}\t{reason}" for key, (when, reason) in sorted(forgotten.items())]
    handle, aside = tempfile.mkstemp(prefix=f".{FILE}.", dir=root)
    with os.fdopen(handle, "w") as out:
        out.write("\n".join(lines) + "\n")
    os.replace(aside, Path(root) / FILE)


def add(root: Path, paths: list[Path], reason: str = "") -> list[str]:
    """Set the runs at ``paths`` aside; returns their names in the list."""
    forgotten = read(root)
    when = time.strftime("%Y-%m-%d %H:%M")
    keys = [_key(root, path) for path in paths]
    forgotten.update({key: (when, " ".join(reason.split())) for key in keys})
    _write(root, forgotten)
    return keys


def undo(root: Path, keys: list[str]) -> None:
    forgotten = read(root)
    for key in keys:
        forgotten.pop(key, None)
    _write(root, forgotten)
