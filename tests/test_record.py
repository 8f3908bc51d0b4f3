"""The saved-run record (record.py): what is written, what is read back, older versions, and files whose
values are not a record."""
import json
import math
from pathlib import Path

import pytest

from pytest_gpucolloc import measure, protocol, record
from pytest_gpucolloc.history import load, read_run
from pytest_gpucolloc.scenario import MeasuredWorker, ScenarioResult
from pytest_gpucolloc.workloads import Workload

DATA = Path(__file__).resolve().parent / "data"  # cut from real runs: data/README.md
EARLY_V1 = DATA / "aa-history"  # the first saved runs (no gpu, foreign_pids or start-up fields)
LATE_V1 = DATA / "v1-partitioned-run.json"  # MPS partitions: the mode's facts beside the fields


def measured(mode_facts=None) -> ScenarioResult:
    job = Workload("resnet26", batch_size=32)
    ready = protocol.Ready(pid=11, samples_per_step=32, warmup_steps=20, cpus=[1, 2], startup_phases_s={"import": 1.0},
                           cuda_visible_devices="GPU-a", device_uuid="GPU-a", since_spawn_s=4.5)
    result = protocol.Result(rounds=[(1.0, 3200), (1.0, 3168)], peak_memory_bytes=5 * 10**9,
                             reserved_memory_bytes=3 * 10**8)
    worker = MeasuredWorker(job, measure.WorkerStats(list(result.rounds), 32), ready, result, (1, 2),
                            {"sm_percent": 50.0, "throughput": "a fact must not shadow a field"},
                            {"memory_bytes_by_pid": {"11": 10**9}, "avg_power_w": 300.0, "throttled": False})
    return ScenarioResult("mps-partitioned", [job], workers=[worker], aggregate_rounds=[3200.0, 3168.0], device="cuda",
                          cpu_note="auto: 2 core(s) per worker", mode_facts=mode_facts or {"mps_daemon": "/tmp/gc-x/mps"},
                          gpu={"index": 0, "uuid": "GPU-a", "name": "H200"}, speedup=0.98)


def test_what_is_written_reads_back_as_measured():
    info = json.loads(json.dumps(record.write(measured(), {"verdict": "unchanged"})))  # as saved: through JSON
    assert info["gpucolloc"] == record.VERSION == 2
    scenario = record.read(info)
    assert scenario.rounds == (3200.0, 3168.0) and scenario.throughput == 3184.0
    assert scenario.mode == "mps-partitioned" and scenario.workloads == ("resnet26-cifar10/bs32",)
    assert scenario.gpu_uuid == "GPU-a" and scenario.speedup == 0.98 and scenario.gate == {"verdict": "unchanged"}
    assert scenario.mode_facts == {"mps_daemon": "/tmp/gc-x/mps"}
    worker = scenario.workers[0]
    assert worker.throughput == 3184.0 and worker.device_memory_bytes == 10**9 and worker.startup_s == 4.5
    assert worker.mode_facts["sm_percent"] == 50.0  # kept apart from the record's own fields
    assert info["workers"][0]["throughput"] == 3184.0
    assert scenario.samples_per_joule == pytest.approx(3184.0 / 300.0)



def test_a_gate_verdict_is_saved_as_its_fields_and_reads_back_as_the_same_verdict():
    import random

    from doubles.gatesim import synthetic_run
    from pytest_gpucolloc import gate

    rng = random.Random(2)
    history = [synthetic_run(rng, f"b{i}", 3200.0, 0.004, 0.002, 10) for i in range(5)]
    verdict = gate.decide(synthetic_run(rng, "now", 3200.0 * 0.9, 0.004, 0.0, 10), history)
    assert verdict.failed and verdict.ci and verdict.baseline_runs and verdict.noise
    info = json.loads(json.dumps(record.write(measured(), verdict)))  # as saved: through JSON
    assert info["gate"] == json.loads(json.dumps(verdict.to_dict()))
    assert info["gate"]["verdict"] == "regressed" and info["gate"]["baseline_runs"] == [f"b{i}" for i in range(5)]
    again = gate.Verdict.from_dict(record.read(info).gate)  # an xdist worker's verdict, on its controller
    assert again == verdict and isinstance(again.ci, tuple)

def test_early_version_1_runs_still_read():
    history = load(EARLY_V1)
    assert history.problems == [] and len(history.runs) == 2
    scenario = next(iter(history.runs[0].scenarios.values()))
    assert scenario.version == 1 and scenario.gpu is None and scenario.foreign_pids == ()
    assert scenario.throughput == pytest.approx(sum(scenario.rounds) / len(scenario.rounds))


def test_version_1_mode_facts_are_pulled_out_of_the_fields():
    run = read_run(LATE_V1)
    assert run.problems == [] and run.scenarios
    partitioned = [s for s in run.scenarios.values() if s.mode == "mps-partitioned"]
    assert partitioned and all("mps_daemon" in s.mode_facts for s in partitioned)
    assert all("sm_percent" in w.mode_facts and "throughput" not in w.mode_facts
               for s in partitioned for w in s.workers)
    assert all(s.cpu_affinity for s in run.scenarios.values())  # was "cpu_placement"


@pytest.mark.parametrize("change,why", [
    ({"aggregate_round_throughputs": [0, 0, 0]}, "finite positive number"),
    ({"aggregate_round_throughputs": ["fast"]}, "finite positive number"),
    ({"aggregate_round_throughputs": [math.inf]}, "finite positive number"),
    ({"aggregate_round_throughputs": []}, "non-empty list"),
    ({"workers": "x"}, "workers must be a non-empty list"),
    ({"workloads": None}, "workloads must be"),
    ({"gpucolloc": 99}, "newer than this pytest-gpucolloc reads"),
])
def test_a_record_with_impossible_values_is_refused_with_the_reason(change, why):
    info = dict(record.write(measured()), **change)
    with pytest.raises(record.RecordError, match=why):
        record.read(info)


def test_a_bad_scenario_is_named_and_skipped_and_the_rest_of_its_file_kept(tmp_path):
    good = record.write(measured())
    bad = dict(good, aggregate_round_throughputs=[0, 0, 0])
    data = {"datetime": "2026-12-01T00:00:00", "commit_info": "x", "machine_info": [],
            "benchmarks": [{"name": "t[a]", "fullname": "f.py::t[a]", "extra_info": good},
                           {"name": "t[b]", "fullname": "f.py::t[b]", "extra_info": bad},
                           {"name": "other", "fullname": "f.py::other", "extra_info": {}}]}
    (tmp_path / "0001_x.json").write_text(json.dumps(data))
    history = load(tmp_path)
    assert list(history.runs[0].scenarios) == ["f.py::t[a]"]
    assert len(history.problems) == 1 and "0001_x.json: scenario f.py::t[b] skipped" in history.problems[0]
    assert history.runs[0].commit is None


def test_cuda_graphs_are_suggested_only_for_eager_jobs_that_leave_the_gpu_idle():
    info = record.write(measured())
    assert record.read(info).eager_on_gpu  # no SM activity measured: it may be launch-bound
    info["telemetry"] = [{"sm_activity_pct": 95.0}]
    assert not record.read(info).eager_on_gpu  # GPU-bound: its noise is not the CPU's launches
    info["telemetry"] = [{"sm_activity_pct": 11.0}]
    assert record.read(info).eager_on_gpu
    info["workers"][0]["params"]["cuda_graph"] = True
    assert not record.read(info).eager_on_gpu
