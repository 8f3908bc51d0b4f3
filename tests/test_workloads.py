import json

import pytest

from pytest_gpucolloc.workloads import Workload, WorkloadError, as_workload, as_workloads, known_workloads


def test_aliases_resolve_to_the_papers_workloads():
    assert Workload("resnet26").model == "resnet26-cifar10"
    assert Workload("resnet50").shape.image_size == 64
    assert Workload("resnet152").shape.image_size == 224
    assert Workload("resnet26-cifar10").shape.num_classes == 10


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(WorkloadError) as error:
        Workload("resnet27")
    for name in known_workloads():
        assert name in str(error.value)


@pytest.mark.parametrize("bad", [0, -1, 10**9, 1.5, True, "32"])
def test_invalid_batch_sizes_are_rejected(bad):
    with pytest.raises(WorkloadError, match="batch_size"):
        Workload("resnet26", batch_size=bad)


@pytest.mark.parametrize("name", ["", "   ", "os.system('x')", "../../etc:passwd", "a;b:c", "mod:", ":fn", "é:x"])
def test_malformed_names_are_rejected(name):
    with pytest.raises(WorkloadError):
        Workload(name)


def test_user_factories_are_import_paths():
    workload = Workload("tests.user_workloads:tiny", batch_size=8, options={"step_sleep": 0.1})
    assert not workload.is_named
    assert workload.options == {"step_sleep": 0.1}


@pytest.mark.parametrize("field,value", [("precision", "fp8"), ("sm_percent", 0), ("sm_percent", 101),
                                         ("memory_limit_mb", 0), ("mig", "big"), ("options", {1: 2})])
def test_invalid_parameters_are_rejected(field, value):
    with pytest.raises(WorkloadError):
        Workload("resnet26", **{field: value})


def test_key_ignores_sharing_limits_but_not_the_job():
    assert Workload("resnet26", sm_percent=20).key() == Workload("resnet26").key()
    assert Workload("resnet26", batch_size=64).key() != Workload("resnet26").key()
    assert Workload("resnet26", precision="bf16").key() != Workload("resnet26").key()


def test_round_trip_through_dict():
    workload = Workload("resnet50", batch_size=64, precision="bf16", sm_percent=25.0, options={"extra_step_every": 5})
    assert Workload.from_dict(workload.to_dict()) == workload


def test_as_workload_accepts_names_and_rejects_other_types():
    assert as_workload("resnet26") == Workload("resnet26")
    with pytest.raises(WorkloadError):
        as_workload(42)


def test_named_workloads_accept_only_their_options():
    assert Workload("resnet50", options={"extra_step_every": 20}).options == {"extra_step_every": 20}
    with pytest.raises(WorkloadError, match="unknown option"):
        Workload("resnet50", options={"sleep": 1})
    with pytest.raises(WorkloadError, match="positive integer"):
        Workload("resnet50", options={"extra_step_every": 0})


def test_language_models_take_a_sequence_length_and_say_it():
    from pytest_gpucolloc.workloads import WorkloadError

    job = Workload("gpt2-small", batch_size=8, options={"seq_len": 512})
    assert job.label == "gpt2-small/bs8/seq512" and job.tokens_per_sample == 512
    assert Workload("gpt-mini", batch_size=4).tokens_per_sample == 512  # its default
    assert Workload("resnet26", batch_size=4).tokens_per_sample is None
    with pytest.raises(WorkloadError, match="seq_len must be an integer"):
        Workload("gpt2-small", options={"seq_len": 0})
    with pytest.raises(WorkloadError, match="unknown option"):
        Workload("resnet26", options={"seq_len": 64})


def test_a_data_loader_is_part_of_the_jobs_identity_and_label():
    job = Workload("resnet50", batch_size=32, data="loader", loader_workers=4)
    assert job.label == "resnet50-imagenet64/bs32/loader4" and job.cores_wanted == 5
    assert job.key() != Workload("resnet50", batch_size=32).key()
    assert job.key() != Workload("resnet50", batch_size=32, data="loader", loader_workers=2).key()
    assert Workload.from_dict(job.to_dict()) == job
    # a synthetic job is saved and identified exactly as before loaders existed
    assert "data" not in Workload("resnet50").to_dict() and len(Workload("resnet50").key()) == 5
    assert Workload("resnet50").cores_wanted == 1


@pytest.mark.parametrize("kwargs,why", [
    ({"model": "resnet50", "data": "disk"}, "data must be one of synthetic, loader"),
    ({"model": "resnet50", "data": "loader", "loader_workers": -1}, "loader_workers must be an integer"),
    ({"model": "resnet50", "data": "loader", "loader_workers": 1.5}, "loader_workers must be an integer"),
    ({"model": "gpt2-small", "data": "loader"}, "gpt2-small brings its own data"),
    ({"model": "tests.user_workloads:tiny", "data": "loader"}, "brings its own data"),
])
def test_bad_data_settings_are_rejected(kwargs, why):
    with pytest.raises(WorkloadError, match=why):
        Workload(**kwargs)


def test_cudnn_autotuning_is_an_option_of_the_named_workloads_and_part_of_the_job():
    heuristics = Workload("resnet26", cuda_graph=True, options={"cudnn_autotune": False})
    assert heuristics.key() != Workload("resnet26", cuda_graph=True).key()
    assert heuristics.label == "resnet26-cifar10/bs32/graph/cudnn-heuristics"
    with pytest.raises(WorkloadError, match="cudnn_autotune must be True or False"):
        Workload("resnet26", options={"cudnn_autotune": "off"})


@pytest.mark.parametrize("value", [[1, 2], (3, "x"), {"nested": [1, {"a": None}]}, "text", 2.5, None, True])
def test_json_values_are_options_and_part_of_the_job(value):
    job = Workload("tests.user_workloads:tiny", options={"x": value})
    assert job.key() != Workload("tests.user_workloads:tiny").key()
    assert Workload.from_dict(json.loads(json.dumps(job.to_dict()))).key() == job.key()  # as the worker gets it


@pytest.mark.parametrize("value,found", [(object(), "found object"), ([1, {2}], "found set"), (float("nan"), "found float nan"),
                                         ({1: "a"}, "found dict"), (b"bytes", "found bytes"), (lambda: 1, "found function")])
def test_an_option_that_is_not_a_json_value_is_a_workload_error(value, found):
    with pytest.raises(WorkloadError, match=f"option 'x' must be a JSON value.*{found}"):
        Workload("tests.user_workloads:tiny", options={"x": value})


def test_an_option_too_deep_or_too_large_is_a_workload_error():
    deep = []
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(WorkloadError, match="nested more than 32"):
        Workload("tests.user_workloads:tiny", options={"x": deep})
    with pytest.raises(WorkloadError, match="bytes as JSON, more than"):
        Workload("tests.user_workloads:tiny", options={"x": "a" * 100_000})


@pytest.mark.parametrize("value,message", [
    ("resnet26-cifar10", "collocate() takes a list of workloads; got the string 'resnet26-cifar10' "
                         "(one job alone: collocate(['resnet26-cifar10']))"),
    (Workload("resnet26"), "got one Workload (resnet26-cifar10/bs32): collocate([workload])"),
    (42, "collocate() takes a list of workloads; got int"),
    ({"resnet26": 2}, "got dict"),
])
def test_collocate_takes_a_list_and_says_so(value, message):
    with pytest.raises(WorkloadError) as error:
        as_workloads(value)
    assert message in str(error.value)
    assert as_workloads(["resnet26", Workload("resnet50")])[1].model == "resnet50-imagenet64"
    assert as_workloads(name for name in ["resnet26"])[0].model == "resnet26-cifar10"


def test_a_mistyped_factory_is_named_with_the_one_meant():
    import torch

    from pytest_gpucolloc import models

    with pytest.raises(ImportError, match="has no attribute 'tinyy': did you mean 'tiny'?"):
        models._user_object(Workload("tests.user_workloads:tinyy", batch_size=2), torch.device("cpu"), "train_step")
    with pytest.raises(ImportError, match=r"has no attribute 'zzz'$"):  # nothing near: no guess
        models._user_object(Workload("tests.user_workloads:zzz", batch_size=2), torch.device("cpu"), "train_step")


def test_the_injected_slowdown_reaches_a_users_factory_without_its_option(tmp_path, monkeypatch):
    # --colloc-extra-step-every K: one extra, uncounted call after every K, as the built-in steps take
    (tmp_path / "counted_steps.py").write_text(
        "class Step:\n"
        "    calls = 0\n"
        "    samples_per_step = 3\n"
        "    def train_step(self):\n"
        "        Step.calls += 1\n"
        "def factory(batch_size, device, precision='fp32'):\n"  # no **options: the plugin's option is not passed
        "    return Step()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import torch

    from pytest_gpucolloc import models
    from pytest_gpucolloc.scenario import Settings

    workload = Settings(2, 0.2, 0.1, 2, 60, extra_step_every=2).adapt(Workload("counted_steps:factory", batch_size=4))
    step = models.build(workload, torch.device("cpu"))
    for _ in range(4):
        step.train_step()
    counted = __import__("counted_steps").Step
    assert counted.calls == 6 and step.samples_per_step == 3
