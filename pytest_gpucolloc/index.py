"""A storage's saved files: found without recursion and within limits (``walk``; a link to a folder is followed, each
folder walked once by its real path: a loop ends), and what reading each gave, kept in an index beside them so that
thousands of saved runs are read in a second, not parsed again at every command.

``Index``: an SQLite file in the storage, one row per saved file, keyed by its path, size and modification time. The
JSON files stay the source of truth and pytest-benchmark keeps reading them: a file whose size or time changed is read
again, a removed file's row is dropped, a file that cannot be read is never kept. Concurrent writers (CI jobs sharing
a storage) wait for each other on SQLite's lock; an index SQLite cannot read is deleted and built again.
"""
from __future__ import annotations

import fcntl
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

NAME = ".gpucolloc-index.sqlite3"
LOCK = ".gpucolloc-lock"  # not *.json: never read as a run
SCHEMA = 9  # raise when what is stored changes: an index of another schema is built again
MAX_DEPTH = 64  # folders below the storage; pytest-benchmark's own layout is one deep
MAX_FILES = 1_000_000
BUSY_S = 30.0  # another job writing the index: wait this long for it
Row = tuple[int, int, str, str, str]  # size, mtime_ns; the run's own fields, what it shares, its samples (JSON)


@dataclass(frozen=True)
class Found:
    path: Path
    key: str  # path relative to the storage
    size: int
    mtime_ns: int


def walk(root: Path) -> tuple[list[Found], list[str]]:
    """Every ``*.json`` file under ``root`` (sorted by path), and what was skipped, in words."""
    found: list[Found] = []
    skipped: list[str] = []
    too_deep: list[str] = []
    prefix = os.path.join(root, "")
    stack = [(Path(root), 0)]
    links: list[tuple[Path, int]] = []  # walked after every folder of the storage's own: its runs keep their paths
    seen: set[str] = set()  # folders walked, by real path: a link into one, or a loop, is not walked again
    while stack or links:
        folder, depth = stack.pop() if stack else links.pop(0)
        if (real := os.path.realpath(folder)) in seen:
            continue
        seen.add(real)
        try:
            with os.scandir(folder) as entries:
                listed = list(entries)
        except OSError as error:
            skipped.append(f"{folder}: skipped ({type(error).__name__}: {str(error)[:120]})")
            continue
        for entry in listed:
            try:
                # a link to a folder too: pytest-benchmark saves through one (a machine folder kept elsewhere)
                if entry.is_dir() and not entry.name.endswith(".json"):
                    if depth + 1 > MAX_DEPTH:
                        too_deep.append(entry.path)
                    else:
                        (links if entry.is_symlink() else stack).append((Path(entry.path), depth + 1))
                elif entry.name.endswith(".json"):
                    if len(found) >= MAX_FILES:
                        skipped.append(f"{root}: more than {MAX_FILES:,} saved files; the rest skipped")
                        stack.clear()
                        links.clear()
                        break
                    stat = entry.stat()  # a link to a file: the file's
                    found.append(Found(Path(entry.path), entry.path.removeprefix(prefix), stat.st_size,
                                       stat.st_mtime_ns))
            except OSError as error:  # a link to nothing, a file removed while walking
                skipped.append(f"{entry.path}: skipped ({type(error).__name__}: {str(error)[:120]})")
    if too_deep:
        shown = ", ".join(path[:200] for path in too_deep[:3])
        skipped.append(f"{len(too_deep)} folder(s) more than {MAX_DEPTH} levels below {root} skipped, with all "
                       f"below them ({shown}{', ...' if len(too_deep) > 3 else ''})")
    found.sort(key=lambda f: f.key)
    return found, skipped


@dataclass
class Index:
    """One storage's index: its rows as read when opened (``known``), and ``update`` to store what was read since.
    Without a usable index (no connection) it knows nothing and keeps nothing: the caller reads every file."""
    connection: sqlite3.Connection | None = None
    known: dict[str, Row] = field(default_factory=dict)  # path -> Row
    problem: str | None = None  # why the index could not be used, when it could not

    def update(self, fresh: dict[str, Row], keep: set[str]) -> None:
        """Store the rows read now and drop every row not in ``keep`` (files removed, changed or unreadable)."""
        if self.connection is None or (not fresh and keep >= set(self.known)):
            return
        try:
            with self.connection:  # one transaction: a reader sees the index before or after, never between
                self.connection.execute("BEGIN IMMEDIATE")
                stale = [(path,) for (path,) in self.connection.execute("SELECT path FROM files")
                         if path not in keep]
                self.connection.executemany("DELETE FROM files WHERE path = ?", stale)
                self.connection.executemany("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?)",
                                            [(path, *row) for path, row in fresh.items()])
        except sqlite3.Error as error:
            self.problem = f"index not updated ({type(error).__name__}: {error})"


def _open(path: Path) -> Index:
    connection = sqlite3.connect(path, timeout=BUSY_S, isolation_level=None)
    try:
        with connection:
            connection.execute("BEGIN IMMEDIATE")
            if connection.execute("PRAGMA user_version").fetchone()[0] != SCHEMA:
                connection.execute("DROP TABLE IF EXISTS files")
            connection.execute("CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, size INTEGER NOT NULL, "
                               "mtime_ns INTEGER NOT NULL, run TEXT NOT NULL, shared TEXT NOT NULL, "
                               "samples TEXT NOT NULL)")
            connection.execute(f"PRAGMA user_version = {SCHEMA}")
            rows = connection.execute("SELECT path, size, mtime_ns, run, shared, samples FROM files").fetchall()
        known: dict[str, Row] = {}
        for path, size, mtime_ns, *texts in rows:
            if not (isinstance(path, str) and isinstance(size, int) and isinstance(mtime_ns, int)
                    and all(isinstance(text, str) for text in texts)):
                raise sqlite3.DatabaseError(f"a row of another shape ({path!r:.100})")
            known[path] = (size, mtime_ns, *texts)
    except BaseException:
        connection.close()
        raise
    return Index(connection, known)


@contextmanager
def opened(root: Path, use: bool = True) -> Iterator[Index]:
    """The storage's index, built again when SQLite cannot read it; one that knows nothing when ``use`` is False
    or it cannot be used now (locked past ``BUSY_S``, read-only storage)."""
    index = Index()
    path = Path(root) / NAME
    if use:
        try:
            try:
                index = _open(path)
            except sqlite3.OperationalError:
                raise  # locked, read-only, no room: no reason to delete it
            except sqlite3.DatabaseError:  # not a database, malformed: deleted and built again, never trusted
                path.unlink(missing_ok=True)
                Path(f"{path}-journal").unlink(missing_ok=True)
                index = _open(path)
        except (sqlite3.Error, OSError) as error:
            index = Index(problem=f"index {path} not used ({type(error).__name__}: {str(error)[:120]})")
    try:
        yield index
    finally:
        if index.connection is not None:
            index.connection.close()


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """``folder`` changed by this process alone (jobs sharing a storage): a lock on a file in it, held until the block
    ends or the process dies."""
    with open(Path(folder) / LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
