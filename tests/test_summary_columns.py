"""The session summary's columns (``--colloc-columns``, also an ini key): a table that fits a CI log."""
from tiny_workload import SOURCE as TINY_SOURCE

SCENARIO = """
import pytest
from pytest_gpucolloc import Workload

@pytest.mark.gpucolloc_quick
def test_pair(collocate):
    collocate([Workload("tiny_workload:factory")] * 2)
"""
ARGS = ["--gpu-mode=naive", "--colloc-device=cpu", "--colloc-rounds=2", "--colloc-round-seconds=0.2",
        "--colloc-warmup-seconds=0.1", "--colloc-alone=off", "-p", "no:cacheprovider"]


def test_the_summary_shows_the_columns_asked_for(pytester):
    pytester.makepyfile(tiny_workload=TINY_SOURCE, test_pair=SCENARIO)
    result = pytester.runpytest(*ARGS, "--colloc-columns=scenario,mode,aggregate")
    result.assert_outcomes(passed=1)
    at = next(i for i, line in enumerate(result.outlines) if line.startswith("scenario ") and "mode" in line)
    header, row = result.outlines[at], result.outlines[at + 2]
    assert header.split() == ["scenario", "mode", "aggregate", "samples/s"], header
    assert row.split()[:2] == ["test_pair[cpu-naive]", "naive"] and len(row) < 60, row
    result.stdout.fnmatch_lines(["gpucolloc: this run was not saved, so no later run can be compared or gated*"])
    # pytest-benchmark's own table follows: what its times are is said where it is printed
    result.stdout.fnmatch_lines(["pytest-benchmark's table times each round as the time per sample (1 / the "
                                 "aggregate samples/s*"])


def test_a_column_that_does_not_exist_is_refused_before_anything_runs(pytester):
    pytester.makepyfile(tiny_workload=TINY_SOURCE, test_pair=SCENARIO)
    result = pytester.runpytest(*ARGS, "--colloc-columns=scenario,throughput")
    assert result.ret == 4  # usage error
    result.stderr.fnmatch_lines(["*--colloc-columns takes names among scenario,mode,workers,*got 'scenario,throughput'*"])



def test_the_summary_and_the_gate_fit_a_narrow_terminal(pytester, monkeypatch):
    """No columns asked for: the least important are left out until the tables fit (COLUMNS here), and a line says
    which and how to show them."""
    pytester.makepyfile(tiny_workload=TINY_SOURCE, test_pair=SCENARIO)
    monkeypatch.setenv("COLUMNS", "100")
    result = pytester.runpytest(*ARGS, "--colloc-gate")
    result.assert_outcomes(passed=1)
    ours = result.outlines[next(i for i, line in enumerate(result.outlines) if "gpucolloc: collocation" in line):
                           next(i for i, line in enumerate(result.outlines) if "benchmark: 1 tests" in line)]
    prose = [line for line in ours if " " in line.strip() and not line.startswith("  pytest-gpucolloc ")]
    assert max(map(len, prose)) <= 100, "\n".join(ours)  # an option, a command to copy: whole
    lines = "\n".join(result.outlines).replace("\n  ", " ").splitlines()  # the notes wrap; one line each
    summary = next(i for i, line in enumerate(lines) if line.startswith("scenario ") and "aggregate" in line)
    gate = next(i for i, line in enumerate(lines) if line.startswith("scenario ") and "verdict" in line)
    assert lines[summary + 3].startswith("left out to fit 100 characters: ")
    assert lines[summary + 4].startswith("show them with --colloc-columns=scenario,"), lines[summary + 4]
    assert lines[gate + 3].startswith("left out to fit 100 characters: ")
    # the run saved now, named as the console command names it, on a line of its own to copy
    assert lines[gate + 4].startswith("show them with: pytest-gpucolloc gate 0001 --columns=scenario,verdict,")
    assert any(line.startswith("  pytest-gpucolloc gate 0001 --columns=scenario,verdict,baseline,") and line.endswith(
        ",why") for line in ours)  # whole, to be copied
