"""Fresh-process repeats and CUDA-graph workloads, through real pytest runs on the CPU."""
import json

import pytest

from pytest_gpucolloc import Workload
from pytest_gpucolloc.workloads import WorkloadError
from test_plugin import FAST, TINY

REPEATED = '''
import pytest
from pytest_gpucolloc import Workload

pytestmark = pytest.mark.gpucolloc_quick

def test_default(collocate):
    collocate([Workload("tiny_workload:factory", batch_size=4)] * 2)

@pytest.mark.gpucolloc_repeats(3)
def test_marked(collocate):
    collocate([Workload("parents:factory", batch_size=4)])
'''

PARENTS = '''
import os
import tiny_workload


def factory(*args, **kwargs):  # which fork server forked this worker
    with open(os.environ["PARENTS"], "a") as f:
        f.write(f"{os.getppid()}\\n")
    return tiny_workload.factory(*args, **kwargs)
'''


@pytest.mark.slow
def test_repeats_start_the_workers_afresh_and_every_repeat_is_saved(pytester, monkeypatch):
    pytester.makepyfile(tiny_workload=TINY, parents=PARENTS, test_repeated=REPEATED)
    monkeypatch.setenv("PARENTS", str(pytester.path / "parents.txt"))
    out = pytester.path / "run.json"
    result = pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", "--colloc-repeats=2",
                                f"--benchmark-json={out}", *FAST)
    result.assert_outcomes(passed=2)
    saved = {b["name"]: b["extra_info"] for b in json.loads(out.read_text())["benchmarks"]}
    default, marked = saved["test_default[cpu-naive]"], saved["test_marked[cpu-naive]"]
    assert [len(r) for r in default["repeats"]] == [2, 2]  # 2 repeats x 2 rounds
    assert default["aggregate_round_throughputs"] == default["repeats"][0] + default["repeats"][1]
    assert len(marked["repeats"]) == 3  # the marker wins over the option
    # each repeat forked from a new server: one server's workers share a level, and repeats are to sample it
    assert len(set((pytester.path / "parents.txt").read_text().split())) == 3
    assert all(len(w["round_throughputs"]) == 4 for w in default["workers"])


def test_a_bad_repeats_marker_fails_before_anything_starts(pytester):
    pytester.makepyfile(tiny_workload=TINY, test_bad='''
import pytest
@pytest.mark.gpucolloc_quick
@pytest.mark.gpucolloc_repeats(0)
def test_x(collocate):
    collocate(["tiny_workload:factory"])
''')
    result = pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", *FAST)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*gpucolloc_repeats(K) takes a whole number of repeats from 1 to 1000, got 0*"])


def test_bad_repeats_option_is_a_usage_error(pytester):
    result = pytester.runpytest("--colloc-repeats=0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--colloc-repeats must be between 1 and 1000*"])


def test_graphed_workloads_are_skipped_with_the_reason_in_cpu_smoke_mode(pytester):
    pytester.makepyfile(test_graphed='''
import pytest
from pytest_gpucolloc import Workload

@pytest.mark.gpucolloc_quick
def test_graphed(collocate):
    collocate([Workload("resnet26-cifar10", batch_size=128, cuda_graph=True)])
''')
    result = pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", "-rs", *FAST)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*CPU smoke mode (--colloc-device=cpu): cuda_graph=True needs a CUDA GPU*"])


def test_a_graphed_workload_is_its_own_scenario():
    eager, graphed = Workload("resnet26", batch_size=128), Workload("resnet26", batch_size=128, cuda_graph=True)
    assert graphed.label == "resnet26-cifar10/bs128/graph" and eager.label == "resnet26-cifar10/bs128"
    assert graphed.key() != eager.key()  # its own alone baseline and history
    assert Workload.from_dict(graphed.to_dict()) == graphed
    with pytest.raises(WorkloadError, match="cuda_graph must be True or False"):
        Workload("resnet26", cuda_graph="yes")
