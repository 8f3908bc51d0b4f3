"""Live progress while scenarios run: the scenario, its phase (start-up and warm-up, round k of n, an ``ab`` block's
windows), time elapsed and an estimate of what is left (each scenario's time from its last run here, kept in
pytest's cache by ``timings.py``; scenarios never timed here are counted, not guessed).

On a terminal one line is rewritten about once a second, and a scenario's last line stays; a log (no TTY) gets a
line when the phase changes. ``-q`` shows one line per scenario, ``-qq`` nothing; xdist workers write nothing."""
from __future__ import annotations

import contextlib
import math
import time

from . import phases
from .report import duration
from .table_fit import terminal_width, wrapped
from .words import count

_current: Progress | None = None


class Progress:
    def __init__(self, reporter, tests: list[str], last: dict[str, float]):
        self.reporter = reporter
        self.tty = bool(getattr(reporter, "isatty", False))
        self.verbosity = reporter.config.option.verbose
        self.waiting = list(tests)  # scenarios not begun yet, in run order
        self.last = last
        self.total = len(tests)
        self.test: str | None = None
        self.began = 0.0
        self.stage_text = ""  # what is being measured: mode and jobs
        self.phase_text = ""
        self.round_plan: tuple[float, float, int, int, int] | None = None  # start, round s, first, last, most
        self.ready = (0, 0)  # workers warm, of
        self._shown = ""
        capture = reporter.config.pluginmanager.getplugin("capturemanager")
        # While a test runs, pytest captures its output (fd 1): the line goes to the terminal around it, as pytest's
        # own live logging does, or it would land in the test's captured output and never be seen.
        self.uncaptured = capture.global_and_fixture_disabled if capture is not None else contextlib.nullcontext

    def left(self) -> str:
        """What is left of the run going by each scenario's last run here; scenarios never timed here are
        counted, not guessed (their time depends on what the settings cannot say: start-up, jobs measured alone)."""
        known = sum(self.last[test] for test in self.waiting if test in self.last)
        unknown = sum(test not in self.last for test in self.waiting)
        if self.test is not None:
            if self.test in self.last:
                known += max(self.last[self.test] - (time.monotonic() - self.began), 0.0)
            else:
                unknown += 1
        text = f"about {duration(known)} left" if known or not unknown else ""
        if unknown:
            text += (" + " if text else "") + f"{count(unknown, 'scenario')} never timed here"
        return text

    def line(self) -> str:
        done = self.total - len(self.waiting)
        where = f"[{done}/{self.total}] " if self.total else ""
        phase = self.phase_text
        if self.round_plan is not None and self.tty:  # a log says which rounds, once
            start, round_s, first, last, most = self.round_plan
            k = min(max(math.floor((time.monotonic() - start) / round_s) + 1, first), last) if round_s > 0 else first
            phase = f"round {k} of {last}" + (f" (at most {most})" if most > last else "")
        elif self.ready[1] and self.tty:
            phase += f" ({self.ready[0]} of {self.ready[1]} workers warm)"
        said = "; ".join(p for p in [self.stage_text, phase] if p) if self.verbosity >= 0 else ""
        return (f"gpucolloc {where}{self.test}{': ' + said if said else ''} "
                f"[{time.monotonic() - self.began:.0f} s, {self.left()}]")

    def show(self, changed: bool) -> None:
        if self.test is None or self.verbosity < -1:
            return
        if self.tty:
            with self.uncaptured():
                self.reporter.rewrite(self.line()[: max(self.reporter._tw.fullwidth - 1, 20)], erase=True)
        elif changed and (self.verbosity >= 0 or not self._shown):
            self._shown = self.line()
            self.note(self._shown)  # a log's line per change, as wide as a table

    def note(self, text: str) -> None:
        """A line that stays (a warning), whatever the verbosity short of -qq."""
        if self.verbosity < -1:
            return
        text = wrapped(text, terminal_width())
        with self.uncaptured():
            if self.tty:  # the status line erased, then the note (maybe several lines) in its place
                self.reporter.rewrite("", erase=True)
                self.reporter.write(text + "\n")
                self.reporter.currentfspath = None
            else:
                if getattr(self.reporter._tw, "width_of_current_line", 0):  # -q: pytest's dots have no file name
                    self.reporter.write("\n")
                self.reporter.write_line(text)

    def begin(self, test: str) -> None:
        if test in self.waiting:  # tests before it that never began were skipped
            del self.waiting[: self.waiting.index(test) + 1]
        self.test, self.began, self.stage_text, self.phase_text = test, time.monotonic(), "", ""
        self.round_plan, self._shown = None, ""
        if self.tty and self.verbosity >= -1:
            with self.uncaptured():
                self.reporter.ensure_newline()
        self.set_phase("starting")

    def end(self) -> None:
        test, self.test = self.test, None
        if test is None or not self.tty or self.verbosity < -1:
            return
        with self.uncaptured():
            if self.verbosity >= 0:  # the scenario's last line stays
                self.reporter.rewrite(f"gpucolloc {test}: done in {time.monotonic() - self.began:.0f} s; "
                                      + self.left().replace(" left", " left of the run", 1), erase=True)
                self.reporter.write("\n")
            else:
                self.reporter.rewrite("", erase=True)
                self.reporter.write("\r")
            self.reporter.currentfspath = None  # pytest starts its next result on a fresh line

    def set_phase(self, phase: str, rounds=None, ready=(0, 0)) -> None:
        self.phase_text, self.round_plan, self.ready = phase, rounds, ready
        self.show(changed=True)

    # what measurement tells (``phases.Listener``)
    def stage(self, text: str) -> None:
        self.stage_text = text

    def phase(self, text: str, workers: int) -> None:
        self.set_phase(text, ready=(0, workers))

    def rounds(self, start: float, round_s: float, first: int, last: int, most: int) -> None:
        self.set_phase(f"rounds {first}-{last}" + (f" of at most {most}" if most > last else ""),
                       rounds=(start, round_s, first, last, most))

    def tick(self, ready: int | None) -> None:
        """The terminal's line again (a log gets nothing)."""
        if self.tty:
            if ready is not None and self.ready[1]:
                self.ready = (ready, self.ready[1])
            self.show(changed=False)


def start(reporter, tests: list[str], last: dict[str, float]) -> None:
    """Progress of the session's scenarios from now on (``last``: test id -> seconds it took when it last ran)."""
    global _current
    _current = Progress(reporter, tests, last) if reporter is not None and tests else None
    phases.listen(_current)


def stop() -> None:
    global _current
    _current = None
    phases.listen(None)


def begin(test: str) -> None:
    if _current is not None:
        _current.begin(test)


def end() -> None:
    if _current is not None:
        _current.end()


def warn(texts: list[str]) -> None:
    """The current scenario's warnings (``run_warnings.py``), each on a line of its own."""
    if _current is not None and _current.test is not None:
        for text in texts:
            _current.note(f"gpucolloc warning: {_current.test}: {text}")
