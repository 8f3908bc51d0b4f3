"""The zoo (zoo/): user-written training steps that research/zoo-bench gates and A/Bs. On the CPU: each one trains, the
zoo's scenarios run through `collocate` in a project laid out as a user's, and the injected slowdown adds work."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from zoo import models

ZOO = Path(__file__).parent.parent / "zoo"
FACTORIES = {"transformer_encoder": "bf16", "char_lstm": "fp32", "unet": "fp32", "mlp": "fp32"}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models on a shared CI machine: one thread each, as a worker of CPU smoke mode has (threads contend)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
        "zoo", "-m", "zoo", "--colloc-device=cpu", "--colloc-alone=off", "--colloc-rounds=2",
        "--colloc-max-rounds=2", "--colloc-round-seconds=0.2", "--colloc-warmup-seconds=0.1", "-p", "no:cacheprovider",
        f"--benchmark-json={out}")
    result.assert_outcomes(passed=4)
    runs = {b["name"]: b["extra_info"] for b in json.loads(out.read_text())["benchmarks"]}
    assert set(runs) == {f"test_{name}[cpu-naive]" for name in FACTORIES}
    for name, record in runs.items():
        assert record["n_workers"] == 2 and all(w["throughput"] > 0 for w in record["workers"]), name
        assert all(label.startswith("zoo.models:") for label in record["workloads"]), record["workloads"]


def zoo_bench(*args, **env):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, str(ZOO.parent / "research" / "zoo-bench"), *map(str, args)],
                          capture_output=True, text=True, env={**os.environ, **env})


def test_zoo_bench_merges_calls_into_one_confusion_table(tmp_path):
    """The benchmark's calls on several GPUs are read together: each judgement counted once, by truth and verdict."""
    def call(folder, uuid, verdicts):
        judged = [{"check": check, "workload": job, "bound": "launch-bound" if job == "mlp" else "GPU-bound",
                   "truth": truth, "truth_change": change, "verdict": verdict, "change": -0.03}
                  for check, job, truth, change, verdict in verdicts]
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "zoo-bench.json").write_text(json.dumps({
            "gpu": {"name": "NVIDIA H200", "uuid": uuid, "driver": "580"}, "date": folder, "parts": {},
            "judgements": judged}))
    call("one", "GPU-aaa", [("gate", "unet", "none", 0.0, "unchanged"), ("gate", "unet", "-3.8%", -1 / 26, "regressed"),
                            ("ab", "mlp", "-2.0%", -1 / 51, "inconclusive")])
    call("two", "GPU-bbb", [("ab-aa", "mlp", "none", 0.0, "inconclusive"),
                            ("gate", "unet", "none", 0.0, "no baseline")])
    result = zoo_bench("--summarize", tmp_path / "one", tmp_path / "two")
    assert result.returncode == 0, result.stderr
    rows = {line.split(" | ")[0]: line for line in result.stdout.splitlines() if line.startswith("| ")}
    assert rows["| none"] == "| none | 0 | 0 | 1 | 1 | 1 | 1 |"  # regressed improved unchanged inconclusive other
    assert rows["| -3.8%"] == "| -3.8% | 1 | 0 | 0 | 0 | 0 | 0 |"
    assert rows["| -2.0%"] == "| -2.0% | 0 | 0 | 0 | 1 | 0 | 1 |"
    assert "GPU-aaa" in result.stdout and "GPU-bbb" in result.stdout
    assert "A/A judgements: 3, regressed: 0." in result.stdout


def test_zoo_bench_refuses_an_unknown_part_before_running_anything(tmp_path):
    result = zoo_bench(tmp_path / "out", ZOO_BENCH_SKIP="gate,abb")
    assert result.returncode == 2 and "unknown parts ['abb']" in result.stderr
    assert not (tmp_path / "out").exists()


def test_zoo_bench_names_what_its_call_left_and_not_what_others_run(tmp_path, monkeypatch):
    import importlib.machinery
    import importlib.util
    import subprocess

    loader = importlib.machinery.SourceFileLoader("zoo_bench", str(ZOO.parent / "research" / "zoo-bench"))
    bench_module = importlib.util.module_from_spec(importlib.util.spec_from_loader("zoo_bench", loader))
    loader.exec_module(bench_module)
    monkeypatch.setenv("ZOO_BENCH_CPU", "1")
    bench = bench_module.Bench(tmp_path)
    dirs_before = set(Path("/tmp").glob("gc-*"))
    theirs = subprocess.Popen(["sleep", "30"])  # started without the call's tag: another run's
    monkeypatch.setenv("ZOO_BENCH_CALL", bench_module.TAG.split("=", 1)[1])
    ours = subprocess.Popen(["sleep", "31"], start_new_session=True)  # escaped its process group
    try:
        bench.leftovers(set(), dirs_before)
        assert bench.status == 1 and bench.result["leftovers"]["processes"] == ["sleep 31"]
    finally:
        for process in (theirs, ours):
            process.kill()
            process.wait()
    bench.status = 0
    bench.leftovers(set(), dirs_before)
    assert bench.status == 0 and bench.result["leftovers"] == {"processes": [], "directories": []}
