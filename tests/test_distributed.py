"""pytest-xdist: results of every worker reach the controller's pytest-benchmark session; one GPU per worker."""
import json

import pytest

from pytest_gpucolloc.distributed import check_workers_per_gpu
from pytest_gpucolloc.nvml import GpuInfo
from test_plugin import FAST, SCENARIOS, TINY

GPUS = [GpuInfo(i, f"GPU-{i}", "NVIDIA H200", 141 * 2**30, 0) for i in range(2)]


def test_more_workers_than_gpus_is_refused():
    check_workers_per_gpu(2, GPUS)
    with pytest.raises(ValueError, match="-n 3 asks for 3 xdist workers but 2 GPU"):
        check_workers_per_gpu(3, GPUS)
    with pytest.raises(ValueError, match="or run without -n"):
        check_workers_per_gpu(2, GPUS[:1])


@pytest.mark.parametrize("text", ["0,0", "x", ",", "GPU-../../x"])
def test_gpu_lists_are_checked(pytester, text):
    result = pytester.runpytest(f"--colloc-gpus={text}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--colloc-gpus*"])


def test_xdist_workers_results_and_gate_verdicts_are_recorded_by_the_controller(pytester, tmp_path, monkeypatch):
    """Every worker's results reach the controller's pytest-benchmark session (its JSON and its one saved run); each
    worker saves its verdicts in its records, and the controller reads them back and judges the run on them."""
    monkeypatch.setenv("COLUMNS", "300")  # every column, the mode's too, even beside a flag a busy machine raises
    pytester.makepyfile(tiny_workload=TINY)
    pytester.makepyfile(test_scenarios=SCENARIOS.format(sleep=0.001))
    out = tmp_path / "run.json"
    result = pytester.runpytest_subprocess("-n", "2", "--gpu-mode=sequential,naive", "--colloc-device=cpu",
                                           f"--benchmark-json={out}", "--benchmark-autosave", "--colloc-gate",
                                           "--colloc-gate-report=gate.md", *FAST)
    result.assert_outcomes(passed=3, skipped=1)  # sequential-2 is the job alone: skipped
    result.stdout.fnmatch_lines(["*gpucolloc: collocation scenarios*", "*test_tiny?cpu-naive-2?*naive*",
                                 "*gpucolloc gate: 0 regressed of 3*", "*test_tiny?cpu-naive-1?*no baseline*"])
    assert (pytester.path / "gate.md").read_text().count("no baseline") == 3
    data = json.loads(out.read_text())
    names = sorted(b["name"] for b in data["benchmarks"])
    assert names == ["test_tiny[cpu-naive-1]", "test_tiny[cpu-naive-2]", "test_tiny[cpu-sequential-1]"]
    for bench in data["benchmarks"]:
        assert bench["stats"]["rounds"] == 2 and bench["extra_info"]["mode"] in ("sequential", "naive")
    saved = list((pytester.path / ".benchmarks").rglob("*.json"))
    assert len(saved) == 1 and len(json.loads(saved[0].read_text())["benchmarks"]) == 3


def test_an_xdist_controller_is_invited_by_its_workers_scenarios(pytester, tmp_path):
    """No gpucolloc option at all: the controller, which collects nothing, learns of the plugin from its workers'
    scenarios and still records them."""
    pytester.makepyfile(tiny_workload=TINY)
    pytester.makepyfile(test_scenarios=SCENARIOS.format(sleep=0.001))
    out = tmp_path / "run.json"
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", f"--benchmark-json={out}")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*gpucolloc: collocation scenarios*"])
    names = sorted(b["name"] for b in json.loads(out.read_text())["benchmarks"])
    assert names == ["test_tiny[cpu-naive-1]", "test_tiny[cpu-naive-2]"]


def test_xdist_workers_scenarios_left_to_ab_reach_the_controllers_gate_summary(pytester):
    """A scenario an xdist worker measured but left to paired A/B is named by the controller, as without xdist."""
    pytester.makepyfile(tiny_workload=TINY)
    pytester.makepyfile(test_scenarios=SCENARIOS.format(sleep=0.001).replace(
        "@pytest.mark.parametrize", '@pytest.mark.gpucolloc_gate(by="ab")\n@pytest.mark.parametrize'))
    result = pytester.runpytest_subprocess("-n", "2", "--gpu-mode=naive", "--colloc-device=cpu", "--colloc-gate",
                                           "--colloc-gate-report=gate.md", "--benchmark-autosave", *FAST)
    result.assert_outcomes(passed=2)
    assert result.ret == 5  # a gate that judged nothing has not passed
    result.stdout.fnmatch_lines(["*gpucolloc gate: no scenario judged, exit code 5: the gate did not pass*",
                                 "no scenario was judged against history: 2 left to paired A/B",
                                 "left to paired A/B*test_tiny?cpu-naive-?*test_tiny?cpu-naive-?*",
                                 "  judge a change *-- test_scenarios.py::test_tiny --gpu-mode=naive`"])
    assert "left to paired A/B" in (pytester.path / "gate.md").read_text()
