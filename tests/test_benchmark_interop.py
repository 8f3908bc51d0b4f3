"""pytest-benchmark's own options on the plugin's scenarios, as a pytest-benchmark user runs them (real pytest runs
through pytester, real worker processes on the CPU)."""
import json

import pytest

from pytest_gpucolloc import benchmark_api
from test_plugin import FAST, TINY

ONE = '''
import pytest
from pytest_gpucolloc import Workload

pytestmark = pytest.mark.gpucolloc_quick


def test_tiny(collocate):
    collocate([Workload("tiny_workload:factory", batch_size=4, options={"sleep": %s})])
'''
ARGS = ["--gpu-mode=naive", "--colloc-device=cpu", "--colloc-alone=off", *FAST]


@pytest.fixture
def scenario(pytester):
    pytester.makepyfile(tiny_workload=TINY)

    def write(sleep: float) -> None:
        pytester.makepyfile(test_scenario=ONE % sleep)

    return write


def saved_runs(storage) -> list:
    return sorted(storage.rglob("*.json"))


def test_compare_with_storage_outside_the_working_directory(pytester, scenario, tmp_path_factory):
    storage = tmp_path_factory.mktemp("elsewhere") / "history"  # not under the test's working directory
    scenario(sleep=0.002)
    first = pytester.runpytest_subprocess(*ARGS, "--benchmark-autosave", f"--benchmark-storage=file://{storage}")
    first.assert_outcomes(passed=1)
    [path] = saved_runs(storage)
    scenario(sleep=0.008)  # each step takes longer: throughput drops by far more than 5%
    second = pytester.runpytest_subprocess(*ARGS, "--benchmark-compare", "--benchmark-compare-fail=mean:5%",
                                           f"--benchmark-storage=file://{storage}")
    output = second.stdout.str() + second.stderr.str()
    assert "INTERNALERROR" not in output
    assert second.ret == pytest.ExitCode.TESTS_FAILED and "Performance has regressed" in output
    # the same machine and stack: no comparison of machines at all, neither pytest-benchmark's dump nor ours
    assert "machine_info is different" not in output and "compared run differs" not in output

    # a compared run from another stack is said in a few words, on what matters
    saved = json.loads(path.read_text())
    saved["machine_info"]["gpucolloc"]["torch"] = "2.0.0"
    saved["machine_info"]["python_version"] = "3.9.0"
    saved["machine_info"]["cpu"]["hz_actual"] = [1, 0]  # volatile: never a difference
    path.write_text(json.dumps(saved))
    third = pytester.runpytest_subprocess(*ARGS, "--benchmark-compare", f"--benchmark-storage=file://{storage}")
    output = third.stdout.str() + third.stderr.str()
    assert third.ret == 0 and "machine_info is different" not in output and "INTERNALERROR" not in output
    lines = [line for line in output.splitlines() if "compared run differs" in line]
    assert len(lines) == 1 and len(lines[0].split("gpucolloc: compared run differs")[1]) < 300  # a few words
    assert "python_version 3.9.0 -> " in lines[0] and "torch 2.0.0 -> " in lines[0] and "hz_actual" not in lines[0]


def test_benchmark_skip_skips_the_scenarios_before_any_worker_starts(pytester, scenario):
    scenario(sleep=0.001)
    result = pytester.runpytest(*ARGS, "--benchmark-skip", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*--benchmark-skip*"])
    assert "aggregate samples/s" not in result.stdout.str()  # nothing was measured


def test_benchmark_disable_runs_the_scenarios_as_tests_records_nothing_and_says_so(pytester, scenario):
    scenario(sleep=0.001)
    # in a subprocess: in-process, pytest warns that this plugin was imported before it could rewrite its asserts
    result = pytester.runpytest_subprocess(*ARGS, "--benchmark-disable", "--benchmark-autosave",
                                           "-W", "error::pytest_benchmark.logger.PytestBenchmarkWarning")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    # no warning of pytest-benchmark's or pytest's (a busy machine may still raise the plugin's unstable-rounds one)
    assert "fixture was not used" not in out and "PytestBenchmarkWarning" not in out and "warnings summary" not in out
    result.stdout.fnmatch_lines(["gpucolloc: --benchmark-disable: 1 scenario(s) ran as tests and were measured, but "
                                 "nothing was recorded into pytest-benchmark*"])
    assert not saved_runs(pytester.path / ".benchmarks")


def test_machine_differences_leave_out_volatile_fields_and_our_identity():
    saved = {"node": "a", "cpu": {"hz_actual": [1, 0], "count": 2}, "python_build": ["main", "x"], "gpucolloc": {}}
    current = {"node": "a", "cpu": {"hz_actual": [2, 0], "count": 4}, "python_build": ("main", "x"),
               "gpucolloc": {"torch": "2"}, "new_key": 1}
    assert benchmark_api.machine_differences(saved, current) == ["cpu.count 2 -> 4"]


ELASTICSEARCH = "--benchmark-storage=elasticsearch+http://127.0.0.1:9/benchmarks/run"  # no server: never reached


def test_another_storage_backend_is_refused_before_pytest_benchmark_sets_it_up(pytester, scenario, capsys):
    """The gate reads file storage only; pytest-benchmark's elasticsearch backend used to end its set-up in an
    INTERNALERROR (its client library missing) before the plugin could say so."""
    import importlib.util

    from pytest_gpucolloc import cli

    scenario(sleep=0.002)
    gated = pytester.runpytest(*ARGS, "--colloc-gate", ELASTICSEARCH)
    assert gated.ret == pytest.ExitCode.USAGE_ERROR
    gated.stderr.fnmatch_lines(["ERROR: --colloc-gate judges against saved runs, and --benchmark-storage=elasticsearch+"
                                "* pytest-gpucolloc reads pytest-benchmark's file storage only (its default *"])
    assert "INTERNALERROR" not in gated.stdout.str() + gated.stderr.str()
    if importlib.util.find_spec("elasticsearch") is None:  # ungated, where its client is missing: the fix, said
        ungated = pytester.runpytest(*ARGS, ELASTICSEARCH)
        assert ungated.ret == pytest.ExitCode.USAGE_ERROR
        assert "elasticsearch backend needs the elasticsearch package, which is not installed: pip install " \
               "'pytest-benchmark[elasticsearch]'" in ungated.stderr.str()
    # the commands that read saved runs refuse it in one line too
    assert cli.main(["gate", "--storage", ELASTICSEARCH.split("=", 1)[1]]) == 2
    assert "only pytest-benchmark's file storage can be read" in capsys.readouterr().err
