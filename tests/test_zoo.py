"""The zoo (zoo/): user-written training steps that ci/zoo-bench gates and A/Bs. On the CPU: each one trains, the
zoo's scenarios run through `collocate` in a project laid out as a user's, and the injected slowdown adds work."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from zoo import models

ZOO = Path(__file__).parent.parent / "zoo"
FACTORIES = {"transformer_encoder": "bf16", "char_lstm": "fp32", "unet": "fp32", "mlp": "fp32"}


def build(name, batch_size=4):
    torch.manual_seed(0)
    return getattr(models, name)(batch_size=batch_size, device=torch.device("cpu"), precision=FACTORIES[name])


@pytest.mark.parametrize("name", FACTORIES)
def test_each_job_learns_its_batch_on_the_cpu(name):
    step = build(name)
    first = step.step().item()
    for _ in range(12):
        last = step.step().item()
    assert last < first, f"{name}: loss {first:.3f} -> {last:.3f}"
    assert step.samples_per_step == 4


def optimiser_steps(step) -> int:
    return int(next(iter(step.optimizer.state.values()))["step"])


@pytest.mark.parametrize("name", ["mlp", "char_lstm"])
def test_the_injected_slowdown_adds_one_step_every_n(name, monkeypatch):
    for fraction, expected in [("0", 8), ("0.25", 10), ("0.5", 12)]:  # every 4th, every 2nd counted step
        monkeypatch.setenv("ZOO_EXTRA_WORK", fraction)
        step = build(name)
        for _ in range(8):
            step.train_step()
        assert optimiser_steps(step) == expected, fraction
        assert step.steps == 8  # the extra steps are not counted as trained samples


@pytest.mark.parametrize("value", ["fast", "-0.1", "0.9", "nan"])
def test_a_bad_slowdown_is_refused_with_what_is_expected(value, monkeypatch):
    monkeypatch.setenv("ZOO_EXTRA_WORK", value)
    with pytest.raises(ValueError, match="ZOO_EXTRA_WORK must be a fraction of extra work from 0 to 0.5"):
        build("mlp")


@pytest.mark.slow
def test_the_zoo_scenarios_train_two_copies_each_through_collocate(pytester):
    """As a user runs them: the zoo copied into a project of its own, `pytest zoo/ -m zoo` in a fresh process."""
    shutil.copytree(ZOO, pytester.path / "zoo", ignore=shutil.ignore_patterns("__pycache__"))
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(
        "zoo", "-m", "zoo", "--colloc-device=cpu", "--colloc-alone=off", "--colloc-rounds=2", "--colloc-max-rounds=2",
        "--colloc-round-seconds=0.2", "--colloc-warmup-seconds=0.1", "-p", "no:cacheprovider", f"--benchmark-json={out}")
    result.assert_outcomes(passed=4)
    runs = {b["name"]: b["extra_info"] for b in json.loads(out.read_text())["benchmarks"]}
    assert set(runs) == {f"test_{name}[cpu-naive]" for name in FACTORIES}
    for name, record in runs.items():
        assert record["n_workers"] == 2 and all(w["throughput"] > 0 for w in record["workers"]), name
        assert all(label.startswith("zoo.models:") for label in record["workloads"]), record["workloads"]
