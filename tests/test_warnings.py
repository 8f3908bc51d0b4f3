"""Warnings on a measured scenario (what makes its numbers doubtful): each rule on real results and a real gate
verdict, the record that keeps them, the summary's numbers, and a real CPU run that says them."""
import json
import math
import random

import pytest

from pytest_gpucolloc import gate, measure, protocol, record, report, run_warnings
from pytest_gpucolloc.noise import MAX_USEFUL_REPEATS
from pytest_gpucolloc.scenario import MeasuredWorker, ScenarioResult
from pytest_gpucolloc.workloads import Workload
from tiny_workload import SOURCE as TINY_SOURCE


def measured(n=2, rounds=(3200.0, 3168.0), speedup=1.6, mode="naive", device="cuda", throughput_scale=1.0):
    job = Workload("resnet26", batch_size=32)
    workers = []
    for i in range(n):
        ready = protocol.Ready(pid=11 + i, samples_per_step=32, warmup_steps=20, cpus=None, startup_phases_s={},
                               since_spawn_s=4.5)
        result = protocol.Result(rounds=[(1.0, r / n * throughput_scale) for r in rounds], peak_memory_bytes=10**9,
                                 reserved_memory_bytes=10**8)
        workers.append(MeasuredWorker(job, measure.WorkerStats(list(result.rounds), 32), ready, result, None, {}))
    return ScenarioResult(mode, [job] * n, workers=workers, aggregate_rounds=[r * throughput_scale for r in rounds],
                          device=device, cpu_note="", mode_facts={}, speedup=speedup)


def test_a_steady_scenario_on_enough_cores_has_no_warnings():
    assert run_warnings.of(measured(), cores=8, parallel=1) == []


def test_unstable_rounds_are_named_with_their_spread():
    unsteady = measured(rounds=(3200.0, 2000.0, 3300.0))
    (warning,) = run_warnings.of(unsteady, cores=8, parallel=1)
    assert warning.startswith(f"unstable rounds: aggregate throughput varied {unsteady.cv:.0%} (CV)")
    assert run_warnings.of(measured(rounds=(3200.0, 2900.0, 3300.0)), cores=8, parallel=1) == []  # CV 7%


def test_more_workers_than_cores_counts_xdist_workers_and_not_sequential_jobs():
    assert run_warnings.of(measured(n=3), cores=2, parallel=1)[0].startswith(
        "more workers than CPU cores: 3 workers on 2 cores")
    assert "2 workers in each of 2 xdist workers on 2 cores" in run_warnings.of(measured(), cores=2, parallel=2)[0]
    assert run_warnings.of(measured(n=3, mode="sequential", speedup=1.0), cores=2, parallel=1) == []


def test_a_speedup_above_the_number_of_jobs_is_called_impossible():
    (warning,) = run_warnings.of(measured(speedup=2.84), cores=8, parallel=1)
    assert warning.startswith("impossible speedup: 2.84x from 2 jobs (at most 2x)")
    assert run_warnings.of(measured(speedup=2.05), cores=8, parallel=1) == []  # within noise of 2
    # CPU smoke mode: the jobs alone and together shared the CPU with whatever else ran; no GPU speedup to check
    assert run_warnings.of(measured(speedup=2.84, device="cpu"), cores=8, parallel=1) == []


def test_xdist_on_the_cpu_is_warned_of():
    warnings = run_warnings.of(measured(device="cpu"), cores=64, parallel=2)
    assert any(w.startswith("2 xdist workers measure at once on this machine's CPU") for w in warnings)


def repeated_run(run_id, rng, process_cv, repeats=3, rounds=5):
    sets = []
    for _ in range(repeats):
        level = 1000.0 * math.exp(rng.gauss(0, process_cv))
        sets.append(tuple(level * math.exp(rng.gauss(0, 0.002)) for _ in range(rounds)))
    return gate.RunSample(run_id, tuple(x for s in sets for x in s), gpu_name="NVIDIA H200", gpu_uuid="GPU-a",
                          throttled=False, datetime=run_id, repeats=tuple(sets), eager=False)


def test_a_gate_lever_no_one_can_pull_is_capped_and_warned_of():
    rng = random.Random(1)
    history = [repeated_run(f"b{i}", rng, process_cv=0.05) for i in range(5)]
    verdict = gate.decide(repeated_run("now", rng, process_cv=0.05), history)
    lever = verdict.noise["lever"]
    assert "--colloc-repeats=" not in lever  # hundreds of fresh-process repeats are not advice
    assert f"not by repeats (it would take over {MAX_USEFUL_REPEATS} fresh-process repeats per run)" in lever
    (warning,) = run_warnings.of(measured(), verdict, cores=8, parallel=1)
    assert warning.startswith("the gate cannot resolve its threshold here: not by repeats (it would take over ")


def test_warnings_are_saved_and_read_back_and_checked_on_read():
    result = measured(rounds=(3200.0, 2000.0, 3300.0), speedup=2.84)
    result.warnings = run_warnings.of(result, cores=8, parallel=1)
    saved = json.loads(json.dumps(record.write(result)))
    assert record.read(saved).warnings == tuple(result.warnings) and len(result.warnings) == 2
    assert record.read({**saved, "warnings": None}).warnings == ()  # runs saved before the field
    for bad in ([1], "unstable", [{"a": 1}]):
        with pytest.raises(record.RecordError, match="warnings"):
            record.read({**saved, "warnings": bad})


def test_the_summary_prints_small_throughputs_with_significant_digits():
    result = measured(n=4, rounds=(1.7, 1.8), throughput_scale=1.0)
    row = report.rows([("slow", record.read(record.write(result)))])[0]
    per_worker, aggregate = row[3], row[4]
    assert per_worker == "0.44, 0.44, 0.44, 0.44" and aggregate == "1.8"
    assert report.rows([("fast", record.read(record.write(measured())))])[0][4] == "3,184"



SCENARIO = '''
import pytest
from pytest_gpucolloc import Workload

@pytest.mark.gpucolloc_quick
def test_pair(collocate):
    collocate([Workload("tiny_workload:factory", batch_size=4)] * 2)
'''


def test_a_run_says_its_warnings_as_it_runs_in_the_summary_and_in_the_record(pytester, monkeypatch):
    monkeypatch.setattr(run_warnings, "usable_cores", lambda: 1)  # this machine has 1 core, as far as the run knows
    pytester.makepyfile(tiny_workload=TINY_SOURCE, test_pair=SCENARIO)
    result = pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", "--colloc-rounds=2",
                                "--colloc-round-seconds=0.2", "--colloc-warmup-seconds=0.1", "-p", "no:cacheprovider",
                                "--benchmark-json=out.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "gpucolloc warning: test_pair.py::test_pair*: more workers than CPU cores: 2 workers on 1 cores*",
        "*collocation scenarios*",
        "warning: test_pair*: more workers than CPU cores: 2 workers on 1 cores*"])
    saved = json.loads((pytester.path / "out.json").read_text())["benchmarks"][0]["extra_info"]
    assert any(w.startswith("more workers than CPU cores") for w in record.read(saved).warnings)
