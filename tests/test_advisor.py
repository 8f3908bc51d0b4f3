"""``pytest-gpucolloc advise``: ranks the measured ways to run a job mix, from H200 runs as saved; never invents a
number."""
import json
from pathlib import Path

import pytest

from pytest_gpucolloc import advisor, cli

DATA = Path(__file__).resolve().parent / "data"  # cut from real runs: data/README.md
RUN = DATA / "advise-run.json"


def test_the_measured_ways_are_ranked_against_the_jobs_as_asked(capsys):
    assert cli.main(["advise", str(RUN), "--jobs", "resnet26-cifar10/bs128*7", "--format", "json"]) == 0
    advice = json.loads(capsys.readouterr().out)
    ways = [(o["mode"], o["graphed"]) for o in advice["options"]]
    # graphed jobs under MPS do the most: 99,408 samples/s against 7 x 12,201 for the eager jobs one after another
    assert ways[0] == ("mps", True) and advice["options"][0]["speedup"] == pytest.approx(99408 / 12201, rel=0.01)
    assert ("naive", False) in ways and advice["exact"] is True
    assert advice["recommendation"].startswith("Recommended: mps, CUDA graphs")
    assert advice["not_measured"] == ["sequential", "mps-partitioned", "mps-half", "mig"]


def test_a_mix_never_measured_is_answered_from_the_closest_saying_so(capsys):
    assert cli.main(["advise", str(RUN), "--jobs", "resnet26-cifar10/bs128*3"]) == 0
    out = capsys.readouterr().out
    assert "\nClosest measured, not this mix:" in out
    # two measured mixes of other jobs are too few to fit the model and know its error: nothing is predicted
    assert out.startswith("Not predicted (launch-bound mix on NVIDIA H200; model error on held-out mixes: unknown)")


def test_a_job_that_would_starve_is_ranked_after_the_fair_ways():
    fast_unfair = advisor.Option("a", "r", "mps", False, 3.0, 0.3, None, None)
    fair = advisor.Option("b", "r", "mps-partitioned", False, 2.0, 0.9, None, None)
    assert [o.scenario for o in advisor.rank([fast_unfair, fair])] == ["b", "a"]


@pytest.mark.parametrize("jobs, code, message", [
    ("resnet26/b128", 2, "is not LABEL[*COUNT]"),
    ("nosuch*2", 2, "unknown workload 'nosuch'"),
    ("bert-large/bs8*2", 3, "no measured GPU scenario runs any of these jobs"),
])
def test_bad_or_unmeasured_mixes(capsys, jobs, code, message):
    assert cli.main(["advise", str(RUN), "--jobs", jobs]) == code
    assert message in capsys.readouterr().err


def test_a_mix_whose_mig_layout_cannot_exist_says_so_instead_of_asking_to_measure_it(capsys, tmp_path):
    default_run = DATA / "default-run.json"
    data = json.loads(default_run.read_text())
    mixed = next(b for b in data["benchmarks"] if b["name"].startswith("test_mixed"))
    for worker in mixed["extra_info"]["workers"]:
        worker["params"]["mig"] = "4g"  # two 4g instances: 8 compute slices of the H200's 7
    run = tmp_path / "run.json"
    run.write_text(json.dumps(data))
    jobs = "resnet26-cifar10/bs128,resnet152-imagenet/bs32"
    assert cli.main(["advise", str(run), "--jobs", jobs, "--format", "json"]) == 0
    advice = json.loads(capsys.readouterr().out)
    assert "mig" not in advice["not_measured"]
    assert advice["mig_cannot_exist"].startswith("does not fit on NVIDIA H200: 4g+4g needs 8 compute slices of 7")
    assert "MIG is no way for this mix here" in advice["recommendation"]


def test_labels_with_loaders_and_options_are_read_and_their_graphed_variants_matched():
    jobs = advisor.parse_jobs("resnet50-imagenet64/bs128/loader4*3,resnet26-cifar10/bs128/graph/cudnn-heuristics")
    assert jobs == {"resnet50-imagenet64/bs128/loader4": 3, "resnet26-cifar10/bs128/graph/cudnn-heuristics": 1}
    assert advisor._graph_free("resnet50-imagenet64/bs128/graph/loader4") == "resnet50-imagenet64/bs128/loader4"
    # the suite's graphed jobs let cuDNN's heuristics choose: still a way to run the eager job
    assert advisor._graph_free("resnet26-cifar10/bs128/graph/cudnn-heuristics") == "resnet26-cifar10/bs128"
