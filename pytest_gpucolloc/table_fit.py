"""A terminal table that fits: its width (the terminal's, else a CI log's), and the least important columns left
out until the table is within it, said in one line with the option that shows them (pure: text in, text out)."""
from __future__ import annotations

import csv
import io
import json
import shutil
import textwrap
from collections.abc import Callable

from tabulate import tabulate

LOG_WIDTH = 120  # no terminal (a CI log) and no COLUMNS: what a log viewer shows without wrapping
MIN_WIDTH = 40  # narrower is a bogus size (as pytest's terminal writer takes it): the log's width instead
WIDE = 40  # a terminal's cell longer than this is numbered, and said in full below the table
COMMAND = "pytest-gpucolloc "  # a line that starts with it is a command to copy: never wrapped


def terminal_width() -> int:
    """The COLUMNS environment variable, else the terminal's width, else (output to a file or a CI log) LOG_WIDTH."""
    columns = shutil.get_terminal_size((0, 0)).columns
    return columns if columns >= MIN_WIDTH else LOG_WIDTH


def wrapped(text: str, width: int | None) -> str:
    """Prose (a footnote, a note below a table) wrapped to ``width`` line by line, each line's later lines indented;
    a path or an option is never broken inside, nor a command line (one that starts ``pytest-gpucolloc``), so that it
    can be copied whole."""
    if width is None:
        return text

    def fill(line: str) -> str:
        lead = line[:len(line) - len(line.lstrip())]
        return textwrap.fill(line.lstrip(), width, initial_indent=lead, subsequent_indent=lead + "  ",
                             break_long_words=False, break_on_hyphens=False)

    return "\n".join(line if len(line) <= width or line.lstrip().startswith(COMMAND) else fill(line)
                     for line in text.split("\n"))


def fitted_table(body: list[list[str]], names: list[str], headers: list[str], drop_order: list[str], fmt: str,
                 width: int | None, ask: str, asked: list[str] | None = None, long: tuple[str, ...] = (),
                 label: Callable[[list[str], list[str], str], str] = lambda full, shown, column: column,
                 lead: tuple[str, list[str]] | None = None) -> str:
    """``body``'s rows, a cell per one of ``names`` (headed by ``headers``): the columns ``asked`` for, else (a
    terminal's, ``simple``) every column less those of ``drop_order`` (least important first) that do not fit
    ``width``, in a line saying how to show them: ``ask`` is the option (``--columns``) or the command (on a line of
    its own), else where every column is shown. In a terminal a cell of a ``long`` column longer than WIDE is numbered
    and said below, after ``label(row, row as shown, column)``; ``lead``: a first column (header, cells) kept."""
    def render(shown: list[str]) -> tuple[str, list[str]]:
        keep = [names.index(name) for name in shown]
        cells = [[row[i] for i in keep] for row in body]
        notes: list[str] = []
        for full, row in zip(body, cells):
            for column in (name for name in long if name in shown and fmt == "simple"):
                if len(row[shown.index(column)]) > WIDE:
                    notes.append(f"[{len(notes) + 1}] {label(full, row, column)}: {row[shown.index(column)]}")
                    row[shown.index(column)] = f"[{len(notes)}]"
        heads = [headers[i] for i in keep]
        if lead is not None:
            cells, heads = [[cell, *row] for cell, row in zip(lead[1], cells)], [lead[0], *heads]
        return tabulate(cells, headers=heads, tablefmt=fmt, disable_numparse=True), notes

    shown = list(asked or names)
    text, notes = render(shown)
    if not asked and width is not None and fmt == "simple":
        for name in drop_order:
            if max(map(len, text.splitlines()), default=0) <= width:
                break
            if name in shown:
                shown.remove(name)
                text, notes = render(shown)
        if len(shown) < len(names):
            how = ask if not ask.startswith(("-", COMMAND)) else f"{ask}={','.join(names)}"
            notes.insert(0, f"left out to fit {width} characters: {', '.join(n for n in names if n not in shown)}\n"
                            "show them with" + (f":\n  {how}" if how.startswith(COMMAND) else f" {how}"))
    return "\n".join([text, *(wrapped(note, width if fmt == "simple" else None) for note in notes)])


def tabular(rows: list[list], headers: list[str], fmt: str) -> str:
    """Rows in one of the commands' formats: table, markdown, csv, json (one object per row, keyed by the headers)."""
    if fmt == "json":
        return json.dumps([dict(zip(headers, row)) for row in rows], indent=2)
    if fmt == "csv":
        out = io.StringIO()
        csv.writer(out).writerows([headers, *rows])
        return out.getvalue().rstrip("\n")
    return tabulate(rows, headers=headers, tablefmt="github" if fmt == "markdown" else "simple", disable_numparse=True)
