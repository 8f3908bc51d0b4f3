"""Live progress while scenarios run: real pytest runs (pytester) with real workers on the CPU, and the terminal
line on a pretend TTY."""
import io
import os
import pty
import re
import subprocess
import sys
import time

import pytest

from pytest_gpucolloc import phases, progress
from tiny_workload import SOURCE as TINY_SOURCE

SCENARIOS = '''
import pytest
from pytest_gpucolloc import Workload

pytestmark = pytest.mark.gpucolloc_quick

@pytest.mark.parametrize("n", [1, 2])
def test_tiny(collocate, n):
    collocate([Workload("tiny_workload:factory", batch_size=4)] * n)
'''

ARGS = ["--gpu-mode=naive", "--colloc-device=cpu", "--colloc-rounds=2", "--colloc-round-seconds=0.2",
        "--colloc-warmup-seconds=0.1"]


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(tiny_workload=TINY_SOURCE, test_scenarios=SCENARIOS)


def progress_lines(result) -> list[str]:
    return [line for line in result.stdout.lines if line.startswith("gpucolloc [")]


def test_a_log_gets_one_line_per_phase_and_fewer_with_q(pytester, suite):
    # a pytest of its own: its output capture (fd) is on while the scenarios run, as in a user's run
    result = pytester.runpytest_subprocess(*ARGS)
    result.assert_outcomes(passed=2)
    lines = progress_lines(result)
    assert "\r" not in result.stdout.str()  # a log: no carriage-return spinner
    result.stdout.fnmatch_lines([
        "gpucolloc [[]1/2] test_scenarios.py::test_tiny[[]*1]: starting [[]0 s, 2 scenarios never timed here]",
        "gpucolloc [[]1/2] test_scenarios.py::test_tiny[[]*1]: sequential: *; start-up and warm-up [[]* s, 2 *",
        "gpucolloc [[]1/2] test_scenarios.py::test_tiny[[]*1]: sequential: *; rounds 1-2 [[]*",
        "gpucolloc [[]2/2] test_scenarios.py::test_tiny[[]*2]: starting [[]0 s, 1 scenario never timed here]",
        "gpucolloc [[]2/2] test_scenarios.py::test_tiny[[]*2]: naive: tiny_workload:factory* + *; rounds 1-2 [[]*"])
    assert len(lines) == len(set(lines))  # one line per phase change, none repeated

    # -q: one line per scenario; the second run goes by the first one's times (pytest's cache)
    quiet = progress_lines(pytester.runpytest_subprocess(*ARGS, "-q"))
    assert [line.split("::")[0] for line in quiet] == ["gpucolloc [1/2] test_scenarios.py",
                                                       "gpucolloc [2/2] test_scenarios.py"]
    assert all(" s left]" in line and "never timed" not in line for line in quiet), quiet


def test_xdist_workers_write_no_progress(pytester, suite):
    result = pytester.runpytest(*ARGS, "-n", "2", "-p", "no:cacheprovider", "-k", "1]")
    result.assert_outcomes(passed=1)
    assert progress_lines(result) == []


def test_a_real_terminal_shows_the_line_while_a_scenario_runs_and_its_last_line_stays(pytester, suite):
    """pytest in a pseudo-terminal, its output capture on (as a user runs it): the line is rewritten in place while
    the scenario runs (found on an H200: it went into the test's captured output and was never seen)."""
    primary, secondary = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "pytest", *ARGS, "-p", "no:cacheprovider"], cwd=pytester.path,
                               env={**os.environ, "COLUMNS": "250"}, stdin=secondary, stdout=secondary, stderr=secondary, close_fds=True)
    os.close(secondary)
    seen = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the terminal closed: pytest exited
            break
        if not chunk:
            break
        seen += chunk
    os.close(primary)
    assert process.wait(timeout=60) == 0, seen.decode(errors="replace")[-3000:]
    text = seen.decode(errors="replace")
    assert re.search(r"\rgpucolloc \[1/2\] test_scenarios.py::test_tiny\[cpu-naive-1\]: .*round \d of 2", text), text[-3000:]
    assert re.search(r"gpucolloc test_scenarios.py::test_tiny\[cpu-naive-2\]: done in \d+ s", text), text[-3000:]


class FakeReporter:
    """pytest's terminal reporter as progress uses it, on a terminal."""

    def __init__(self, verbose=0, isatty=True):
        self.isatty, self.out, self.currentfspath = isatty, io.StringIO(), "test_x.py"
        self.config = type("Config", (), {"option": type("Option", (), {"verbose": verbose}),
                                          "pluginmanager": type("Plugins", (), {"getplugin": lambda self, name: None})()})()
        self._tw = type("Tw", (), {"fullwidth": 200})()

    def rewrite(self, line, erase=False):
        self.out.write("\r" + line)

    def write(self, text):
        self.out.write(text)

    def ensure_newline(self):
        self.out.write("\n")

    def write_line(self, line):
        self.out.write(line + "\n")


def test_a_terminal_line_counts_rounds_and_time_left_and_stays_when_done():
    reporter = FakeReporter()
    progress.start(reporter, ["t::a", "t::b"], {"t::a": 30.0, "t::b": 40.0})
    try:
        progress.begin("t::a")
        phases.stage("naive: resnet26 + resnet26")
        phases.phase("start-up and warm-up", workers=2)
        phases.tick(1)
        assert reporter.out.getvalue().endswith("(1 of 2 workers warm) [0 s, about 70 s left]")
        phases.rounds(time.monotonic() - 2.5, 1.0, 1, 5, 20)
        assert "naive: resnet26 + resnet26; round 3 of 5 (at most 20)" in reporter.out.getvalue().rsplit("\r", 1)[1]
        progress.end()
        assert reporter.out.getvalue().endswith("gpucolloc t::a: done in 0 s; about 40 s left of the run\n")
        assert reporter.currentfspath is None  # pytest writes its next result on a new line
    finally:
        progress.stop()
    progress.begin("t::b")  # stopped: nothing more is written
    phases.tick()
    assert reporter.out.getvalue().endswith("of the run\n")


@pytest.mark.parametrize("verbose, lines", [(0, 3), (-1, 1), (-2, 0)])
def test_a_log_line_per_phase_one_per_scenario_with_q_none_with_qq(verbose, lines):
    reporter = FakeReporter(verbose, isatty=False)
    progress.start(reporter, ["t::a", "t::c"], {"t::a": 30.0})
    try:
        progress.begin("t::a")
        phases.phase("start-up and warm-up", workers=2)
        phases.tick(1)  # a log gets no ticks
        phases.rounds(time.monotonic(), 1.0, 1, 5, 5)
        progress.end()
    finally:
        progress.stop()
    written = reporter.out.getvalue().splitlines()
    assert len(written) == lines and "\r" not in reporter.out.getvalue()
    if lines == 3:
        assert written[-1] == "gpucolloc [1/2] t::a: rounds 1-5 [0 s, about 30 s left + 1 scenario never timed here]"
