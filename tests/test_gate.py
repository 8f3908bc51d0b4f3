"""The regression gate: statistics on synthetic histories, history loading, the CLI, plots."""
import json
import math
import random
from pathlib import Path

import pytest

from doubles.gatesim import detection_rate, synthetic_run
from pytest_gpucolloc import benchmark_api, cli, gate, gate_table, record_checks
from pytest_gpucolloc.baseline import level_outliers
from pytest_gpucolloc.benchmark_api import storage_path
from pytest_gpucolloc.history import load, read_run
from tiny_workload import SOURCE as TINY_SOURCE

DATA = Path(__file__).resolve().parent / "data"  # cut from real runs: data/README.md
H200_HISTORY = DATA / "aa-history"


def run(rounds, run_id="r", gpu="NVIDIA H200", uuid="GPU-sim", throttled=False):
    return gate.RunSample(run_id, tuple(rounds), gpu_name=gpu, gpu_uuid=uuid, throttled=throttled, datetime=run_id)


def steady_history(level=1000.0, spread=0.01, runs=5):
    rng = random.Random(7)
    return [synthetic_run(rng, f"b{i}", level, spread, 0.0, 10) for i in range(runs)]


@pytest.mark.parametrize("within,between", [(0.01, 0.0), (0.05, 0.0), (0.10, 0.0), (0.15, 0.0), (0.06, 0.09)])
def test_a_a_false_alarms_stay_at_or_below_one_percent(within, between):
    assert detection_rate(0.0, within, between, trials=600, seed=11)["rate"] <= 0.01


def test_a_five_percent_drop_is_caught_in_a_gpu_bound_scenario():
    assert detection_rate(0.05, 0.01, 0.0, trials=300, seed=12)["rate"] >= 0.95


def test_reported_mde_matches_what_the_simulation_shows():
    for within in (0.05, 0.10):
        reported = detection_rate(0.0, within, 0.0, trials=200, seed=13)["median_mde"]
        caught = detection_rate(reported, within, 0.0, trials=300, seed=14)["rate"]
        assert 0.85 <= caught <= 1.0, (within, reported, caught)


def test_improvement_never_fails():
    verdict = gate.decide(run([1200.0] * 10, "now"), steady_history())
    assert verdict.verdict == "improved" and not verdict.failed


def test_regression_verdict_carries_numbers():
    verdict = gate.decide(run([900.0 + i for i in range(10)], "now"), steady_history())
    assert verdict.verdict == "regressed" and verdict.failed
    assert verdict.change == pytest.approx(-0.095, abs=0.01)
    low, high = verdict.ci
    assert low < verdict.change < high < 0
    assert verdict.mde < 0.05 and len(verdict.baseline_runs) == 5


def test_a_drop_below_the_threshold_does_not_fail():
    verdict = gate.decide(run([990.0] * 10, "now"), steady_history(spread=0.001), gate.Policy(threshold=0.02))
    assert verdict.verdict == "unchanged"


def test_too_noisy_says_how_many_rounds_would_help():
    verdict = gate.decide(run([1000.0] * 10, "now"), steady_history(spread=0.05))
    assert verdict.verdict == "inconclusive"
    assert "too noisy for the 2% threshold" in verdict.reason and "rounds per run (now 10: --colloc-rounds=" in verdict.reason
    noisier = gate.decide(run([1000.0] * 10, "now"), steady_history(spread=0.10))
    assert "more rounds alone would need over 1000 per run" in noisier.reason
    # runs no further apart than their rounds make them: the rounds are named, not a "run-to-run spread 0.0%"
    assert "the runs differ by their rounds' noise (8.9% a round)" in noisier.reason, noisier.reason


def test_run_to_run_noise_that_rounds_cannot_fix_is_named():
    rng = random.Random(3)
    history = [synthetic_run(rng, f"b{i}", 1000.0, 0.005, 0.08, 10) for i in range(5)]
    verdict = gate.decide(run([1000.0] * 10, "now"), history)
    assert verdict.verdict == "inconclusive" and "run-to-run spread" in verdict.reason
    assert "rounds per run" not in verdict.reason
    assert "baseline runs would" in verdict.reason


def test_runs_at_the_ends_of_what_a_record_may_hold_are_judged_without_an_overflow():
    # the extreme throughputs a saved record may hold (record_checks.THROUGHPUT): the gate's logs stay finite
    low, high = record_checks.THROUGHPUT
    history = [run([low] * 3, "a"), run([high] * 3, "b"), run([low] * 3, "c")]
    verdict = gate.decide(run([high] * 3, "now"), history, gate.Policy(min_runs=3))
    table = gate_table.table([("s", verdict.to_dict())])
    assert verdict.verdict == "inconclusive" and ">+1000%" in table and "e+" not in table


def test_advice_never_asks_for_an_absurd_number_of_rounds():
    # Two baseline runs on the H200 (xdist check): noisy rounds, an almost equal pair of run means.
    history = [run([14000.0, 12000.0, 16000.0, 13000.0, 15000.0], "a"),
               run([15000.0, 13000.0, 14000.0, 16000.0, 12500.0], "b")]
    policy = gate.Policy(min_runs=2)
    verdict = gate.decide(run([13800.0] * 5, "now"), history, policy)
    assert verdict.verdict == "inconclusive"
    assert "more rounds alone would need over 1000" in verdict.reason and "baseline runs" in verdict.reason
    assert verdict.reason.startswith("not resolvable with 2 baseline runs: they spread so much that even a halving "
                                     "could go uncaught")
    assert verdict.mde is None and verdict.ci is None  # no number the runs cannot stand behind


def test_throttled_runs_are_not_comparable_and_left_out_of_baselines():
    assert gate.decide(run([1000.0] * 10, throttled=True), steady_history()).verdict == "not comparable"
    history = steady_history() + [run([500.0] * 10, "zz-hot", throttled=True)]
    verdict = gate.decide(run([1000.0] * 10, "now"), history)
    assert "zz-hot" not in verdict.baseline_runs and any("throttled" in n for n in verdict.notes)


def test_other_gpu_models_are_never_a_baseline():
    history = [run([1000.0 + i] * 10, f"h100-{i}", gpu="NVIDIA H100") for i in range(5)]
    verdict = gate.decide(run([800.0] * 10, "now"), history)
    assert verdict.verdict == "no baseline" and "other GPUs left out (NVIDIA H100)" in verdict.notes[0]


def test_the_same_physical_gpu_is_preferred_when_it_has_history():
    same = [run([1000.0 + i] * 10, f"a{i}", uuid="GPU-a") for i in range(3)]
    other = [run([1100.0 + i] * 10, f"b{i}", uuid="GPU-b") for i in range(3)]
    verdict = gate.decide(run([1000.0] * 10, "now", uuid="GPU-a"), same + other)
    assert set(verdict.baseline_runs) == {"a0", "a1", "a2"}


def test_h200_a_a_pair_is_not_failed():
    """Two identical runs on the H200 (call 4) differed by 18%: with one baseline run the gate refuses to
    judge instead of failing."""
    history = load(H200_HISTORY)
    assert len(history.runs) == 2
    name = next(iter(history.runs[1].scenarios))
    verdict = gate.decide(history.runs[1].sample(name), history.samples(name, exclude={history.runs[1].path}))
    assert verdict.verdict == "no baseline" and not verdict.failed
    assert verdict.change == pytest.approx(0.186, abs=0.01)


# --- history and the console command ---------------------------------------------------------------

@pytest.fixture
def storage(tmp_path):
    root = tmp_path / ".benchmarks" / "Linux-CPython-3.12-64bit"
    root.mkdir(parents=True)
    template = json.loads(next(H200_HISTORY.rglob("0001_*.json")).read_text())
    rng = random.Random(5)
    for i, (level, driver) in enumerate([(600, "570.86")] * 3 + [(600, "580.159")] * 2 + [(540, "580.159")]):
        data = json.loads(json.dumps(template))
        data["datetime"] = f"2026-11-{i + 10:02d}T00:00:00"
        data["commit_info"]["id"] = f"{i:02d}abcdef"
        data["machine_info"]["gpucolloc"]["driver_version"] = driver
        for bench in data["benchmarks"]:
            bench["extra_info"]["aggregate_round_throughputs"] = [level * math.exp(rng.gauss(0, 0.01)) for _ in range(10)]
            bench["extra_info"]["aggregate_throughput"] = level
        (root / f"{i + 1:04d}_run.json").write_text(json.dumps(data))
    # junk beside them, not named as pytest-benchmark names a run: a run saved last that cannot be read stops the
    # commands that read the latest run (tests/test_reliability_four.py)
    (root / "truncated.json").write_text('{"benchmarks": [')
    (root / "other.json").write_text('{"hello": 1}')
    return tmp_path / ".benchmarks"


def test_corrupt_files_are_reported_by_name_skipped_and_untouched(storage):
    before = {p: p.read_bytes() for p in storage.rglob("*.json")}
    history = load(storage)
    assert len(history.runs) == 6
    assert any("truncated.json" in p for p in history.problems)
    assert any("other.json" in p and "not a pytest-benchmark file" in p for p in history.problems)
    assert before == {p: p.read_bytes() for p in storage.rglob("*.json")}


def test_storage_path_understands_pytest_benchmark_urls():
    assert storage_path("file://./x") == Path("./x")
    assert storage_path(None) == Path("./.benchmarks")
    assert storage_path("elasticsearch+http://host/index") is None


def test_cli_gate_exit_codes(storage, capsys, tmp_path):
    newest = sorted((storage / "Linux-CPython-3.12-64bit").glob("0006_*.json"))[0]
    summary = tmp_path / "summary.md"
    assert cli.main(["gate", str(newest), "--storage", str(storage), "--markdown", str(summary)]) == 1
    assert "regressed" in capsys.readouterr().out
    assert "test_resnet152_imagenet[naive-1-32] | regressed" in summary.read_text()
    seventh = sorted((storage / "Linux-CPython-3.12-64bit").glob("0004_*.json"))[0]
    assert cli.main(["gate", str(seventh), "--storage", str(storage)]) == 0
    assert cli.main(["gate", str(storage / "Linux-CPython-3.12-64bit" / "truncated.json")]) == 2
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"benchmarks": []}))
    assert cli.main(["gate", str(empty)]) == 3


def test_cli_gate_judges_an_old_run_against_the_runs_before_it(storage, capsys):
    fifth = sorted((storage / "Linux-CPython-3.12-64bit").glob("0005_*.json"))[0]
    capsys.readouterr()
    assert cli.main(["gate", str(fifth), "--storage", str(storage), "--format", "json"]) == 0
    verdicts = json.loads(capsys.readouterr().out)
    for row in verdicts:
        assert row["baseline_runs"] == ["0001_run", "0002_run", "0003_run", "0004_run"]
        assert row["verdict"] != "regressed"  # the slowed 6th run, saved later, is not its baseline


def test_cli_compare_by_driver_in_every_format(storage, capsys):
    code = cli.main(["compare", "--group-by", "driver_version", "--storage", str(storage), "--format", "markdown"])
    out = capsys.readouterr().out
    assert code == 1 and "compare driver_version=570.86 -> driver_version=580.159 (3 runs -> 3 runs" in out
    assert "| regressed |" in out.replace("  ", " ") or "regressed" in out
    for fmt, marker in (("csv", "scenario,verdict"), ("json", '"verdict"'), ("table", "verdict")):
        cli.main(["compare", "--commits", "00", "05", "--storage", str(storage), "--format", fmt, "--min-runs", "1"])
        assert marker in capsys.readouterr().out
    assert cli.main(["compare", "--group-by", "nonsense", "--storage", str(storage)]) == 2


def test_compare_pairs_runner_sessions_that_alternated(tmp_path, capsys):
    """Drivers cannot be paired in one boot: whole sessions alternate A B A B; the machine's level drifts by 10%
    over the day, the new driver costs 3%, and only the pairing sees it."""
    root = tmp_path / ".benchmarks" / "Linux"
    root.mkdir(parents=True)
    template = json.loads(next(H200_HISTORY.rglob("0001_*.json")).read_text())
    rng = random.Random(2)
    for i in range(8):
        driver = "570.86" if i % 2 == 0 else "580.159"
        level = 600 * (1 + 0.1 * i / 7) * (0.97 if driver == "580.159" else 1.0)
        data = json.loads(json.dumps(template))
        data["datetime"] = f"2026-11-20T{i:02d}:00:00"
        data["machine_info"]["gpucolloc"]["driver_version"] = driver
        for bench in data["benchmarks"]:
            bench["extra_info"]["aggregate_round_throughputs"] = [level * math.exp(rng.gauss(0, 0.002)) for _ in range(10)]
            bench["extra_info"].pop("repeats", None)
        (root / f"{i + 1:04d}_run.json").write_text(json.dumps(data))
    code = cli.main(["compare", "--group-by", "driver_version", "--groups", "570.86", "580.159", "--storage",
                     str(tmp_path / ".benchmarks"), "--format", "json", "--alpha", "0.05"])
    rows = json.loads(capsys.readouterr().out)
    assert code == 1 and rows, rows
    for row in rows:
        assert row["verdict"] == "regressed" and row["reason"].startswith("paired: 4 runs, each against the runs on either side")
        assert row["change"] == pytest.approx(-0.03, abs=0.01)


def test_cli_compare_never_mixes_cpu_smoke_and_gpu_runs(storage, capsys):
    run = sorted(storage.rglob("0006_run.json"))[0]
    data = json.loads(run.read_text())
    data["machine_info"]["gpucolloc"]["device"] = "cpu"
    run.write_text(json.dumps(data))
    code = cli.main(["compare", "--commits", "00", "05", "--storage", str(storage)])
    assert code == 2
    assert "CPU smoke runs (small batches on the CPU) are never compared with GPU runs" in capsys.readouterr().err


def test_cli_gate_of_a_cpu_smoke_run_says_so_in_every_format(storage, capsys, tmp_path):
    for run in storage.rglob("0*_run.json"):  # a history of CPU smoke runs
        data = json.loads(run.read_text())
        data["machine_info"]["gpucolloc"]["device"] = "cpu"
        run.write_text(json.dumps(data))
    said = "CPU smoke mode: its numbers check the suite, not a GPU"
    for fmt in ("table", "markdown", "json", "csv"):
        cli.main(["gate", "--storage", str(storage), "--format", fmt, "--markdown", str(tmp_path / "gate.md")])
        out, err = capsys.readouterr()
        assert said in (out if fmt in ("table", "markdown") else err), fmt
        assert said in (tmp_path / "gate.md").read_text()
        if fmt == "json":
            assert json.loads(out), out  # stdout stays data


def test_cli_plot_writes_figures(storage, tmp_path, capsys):
    out = tmp_path / "plots"
    assert cli.main(["plot", "--storage", str(storage), "--out", str(out)]) == 0
    pngs = list(out.glob("*.png"))
    assert pngs and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000 for p in pngs)
    assert cli.main(["plot", "--storage", str(storage), "--out", str(out), "--format", "svg"]) == 0
    assert all(b"<svg" in p.read_bytes()[:400] for p in out.glob("*.svg"))


# --- saving into the history ------------------------------------------------------------------------

class _Logger:
    def info(self, text):
        self.last = text


def file_storage(path):
    from pytest_benchmark.storage.file import FileStorage

    return FileStorage(path, _Logger(), default_machine_id="Linux-test")


def test_saving_never_overwrites_a_run_that_took_the_number_first(tmp_path, monkeypatch):
    from pytest_gpucolloc.benchmark_api import guard_saving

    storage = file_storage(tmp_path)
    problems, kept = [], []
    guard_saving(storage, problems, kept)
    storage.save({"run": "A"}, "x")
    numbers = iter(["0001", "0001", "0002"])  # a second run looked before A was saved: it also chose 0001
    monkeypatch.setattr(benchmark_api, "next_number", lambda folder: next(numbers))
    storage.save({"run": "B"}, "x")
    saved = {p.name: json.loads(p.read_text())["run"] for p in (tmp_path / "Linux-test").glob("*.json")}
    assert saved == {"0001_x.json": "A", "0002_x.json": "B"} and problems == []
    assert [p.name for p in kept] == ["0001_x.json", "0002_x.json"]  # what the summary names
    assert not list((tmp_path / "Linux-test").glob(".*.tmp"))


def test_run_numbers_go_on_past_9999(tmp_path):
    storage = file_storage(tmp_path)
    benchmark_api.guard_saving(storage, problems := [], saved := [])
    (tmp_path / "Linux-test").mkdir()
    (tmp_path / "Linux-test" / "9999_x.json").write_text("{}")
    storage.save({"run": "A"}, "ci")
    storage.save({"run": "B"}, "ci")  # pytest-benchmark's own numbering gave both 10000: the second never saved
    assert [p.name for p in saved] == ["10000_ci.json", "10001_ci.json"] and problems == []


def test_a_run_that_cannot_be_saved_is_kept_elsewhere_and_reported(tmp_path, monkeypatch):
    from pytest_gpucolloc.benchmark_api import guard_saving

    storage = file_storage(tmp_path)
    problems, saved = [], []
    guard_saving(storage, problems, saved)
    real_write = Path.write_bytes

    def disk_full(self, data):
        if "Linux-test" in str(self):
            raise OSError(28, "No space left on device")
        return real_write(self, data)

    monkeypatch.setattr(Path, "write_bytes", disk_full)
    storage.save({"run": "C"}, "x")
    assert len(problems) == 1 and "No space left on device" in problems[0] and saved == []
    kept = Path(problems[0].rsplit("kept at ", 1)[1])
    assert json.loads(kept.read_text()) == {"run": "C"}
    kept.unlink()
    assert list((tmp_path / "Linux-test").glob("*.json")) == []  # no truncated file in the history


def test_contaminated_runs_are_not_comparable_flagged_and_left_out_of_baselines(tmp_path):
    from pytest_gpucolloc import record, report

    dirty = gate.RunSample("now", (1000.0,) * 10, gpu_name="NVIDIA H200", gpu_uuid="GPU-a", throttled=False,
                           datetime="now", contaminated=True)
    verdict = gate.decide(dirty, steady_history())
    assert verdict.verdict == "not comparable" and "other processes used the GPU" in verdict.reason
    history = steady_history() + [gate.RunSample("zz-dirty", (500.0,) * 10, gpu_name="NVIDIA H200", gpu_uuid="GPU-a",
                                                 throttled=False, datetime="zz-dirty", contaminated=True)]
    assert "zz-dirty" not in gate.decide(run([1000.0] * 10, "zzz"), history).baseline_runs
    # In a saved run the flag comes from the foreign pids the sampler saw, and the summary shows them.
    saved = json.loads(next(H200_HISTORY.rglob("0001_*.json")).read_text())
    info = dict(saved["benchmarks"][0]["extra_info"], foreign_pids=[4242])
    assert report.rows([("test_x", record.read(info))])[0][-1] == "FOREIGN PIDS 4242"
    saved["benchmarks"][0]["extra_info"] = info
    path = tmp_path / "0009_dirty.json"
    path.write_text(json.dumps(saved))
    assert read_run(path).sample(saved["benchmarks"][0]["fullname"]).contaminated


def test_an_unbounded_interval_reads_as_such():

    row = gate_table.rows([("s", {"verdict": "inconclusive", "change": -0.015, "ci": (-0.999, 36616815.967)})])[0]
    assert row[5] == "[-99.9%, >+1000%]"




def test_cli_table_of_several_runs_says_which_run_and_gpu_each_row_is_from(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # a terminal wide enough for every column
    one, other = DATA / "gpu-tests-h200-a" / "paper.json", DATA / "xdist-tests-h200-b" / "paper.json"
    assert cli.main(["table", str(one)]) == 0
    single = capsys.readouterr().out
    assert single.splitlines()[0].startswith("scenario") and "resnet26_cifar10[mps-7-32]" in single  # a plain table
    assert cli.main(["table", str(one), str(other), "--format", "text"]) == 0
    merged = capsys.readouterr().out.splitlines()
    assert merged[0].split()[:2] == ["run", "scenario"]
    gpus = {json.loads(path.read_text())["benchmarks"][0]["extra_info"]["gpu"]["uuid"][:12] for path in (one, other)}
    assert len(gpus) == 2  # two different physical GPUs
    for gpu in gpus:
        assert any(row.startswith(("gpu-tests-", "xdist-tests-")) and f"on {gpu}" in row for row in merged[2:])
    assert len(merged) == 2 + 3 + 2  # header, rule, the rows of both files


# --- validity by configuration, fresh-process repeats, where the noise lives -------------------------

def test_a_run_under_another_power_limit_is_not_comparable_and_says_why(storage, capsys):
    newest = sorted((storage / "Linux-CPython-3.12-64bit").glob("0004_*.json"))[0]
    edited = json.loads(newest.read_text())
    edited["machine_info"]["gpucolloc"]["power_limit_w"] = 600.0  # the baseline runs had 700 W
    path = storage.parent / "0004_edited.json"
    path.write_text(json.dumps(edited))
    capsys.readouterr()
    assert cli.main(["gate", str(path), "--storage", str(storage), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["verdict"] for r in rows} == {"not comparable"}
    assert "power limit (W) 700.0 -> 600.0" in rows[0]["reason"]


def test_runs_under_another_configuration_are_left_out_of_the_baseline():
    history = [dataclass_replace(r, config={"power_limit_w": 700.0}) for r in steady_history()]
    history.append(dataclass_replace(run([500.0] * 10, "zz-600w"), config={"power_limit_w": 600.0}))
    current = dataclass_replace(run([1000.0] * 10, "zzz"), config={"power_limit_w": 700.0})
    verdict = gate.decide(current, history)
    assert "zz-600w" not in verdict.baseline_runs
    assert any("another GPU configuration left out (power limit (W) 600.0 -> 700.0)" in n for n in verdict.notes)


def test_power_capped_runs_saved_by_earlier_versions_stay_in_the_baseline():
    from pytest_gpucolloc import record

    info = json.loads(next(H200_HISTORY.rglob("0001_*.json")).read_text())["benchmarks"][0]["extra_info"]
    info = dict(info, throttled=True, telemetry=[dict(info["telemetry"][0], throttled=True,
                                                      throttle_share={"sw_power_cap": 0.9})])
    assert record.read(info).throttled is False  # capped 90% of the window: normal for a GPU-bound job
    info["telemetry"][0]["throttle_share"] = {"sw_power_cap": 0.9, "hw_slowdown": 0.3}
    assert record.read(info).throttled is True
    early = dict(info, telemetry=[{"throttle_reasons": ["sw_power_cap"], "throttled": True}])
    assert record.read(early).throttled is False  # early runs kept which reasons, not for how long


def repeated_run(run_id, rng, process_cv, round_cv=0.002, repeats=3, rounds=5, level=1000.0):
    sets = []
    for _ in range(repeats):
        process_level = level * math.exp(rng.gauss(0, process_cv))
        sets.append(tuple(process_level * math.exp(rng.gauss(0, round_cv)) for _ in range(rounds)))
    return gate.RunSample(run_id, tuple(x for s in sets for x in s), gpu_name="NVIDIA H200", gpu_uuid="GPU-a",
                          throttled=False, datetime=run_id, repeats=tuple(sets), eager=True)


def test_each_repeat_of_processes_weighs_the_same_in_a_run():
    sample = gate.RunSample("r", (100.0, 100.0, 100.0, 400.0), repeats=((100.0, 100.0, 100.0), (400.0,)))
    assert sample.throughput == pytest.approx(200.0)  # geometric mean of 100 and 400, not of the four rounds


def test_noise_between_processes_is_named_with_the_repeats_that_resolve_it():
    rng = random.Random(23)
    history = [repeated_run(f"b{i}", rng, process_cv=0.01) for i in range(5)]
    verdict = gate.decide(repeated_run("now", rng, process_cv=0.01), history)
    assert verdict.verdict == "inconclusive" and verdict.noise["dominant"] == "processes"
    assert "--colloc-repeats=" in verdict.noise["lever"] and "cuda_graph=True" in verdict.noise["lever"]
    repeats = int(verdict.noise["lever"].split("--colloc-repeats=")[1].split()[0])
    # with that many repeats per run the threshold is resolved (the A/A run is then "unchanged")
    rng = random.Random(5)
    verdicts = []
    for _ in range(10):
        more = [repeated_run(f"c{i}", rng, process_cv=0.01, repeats=repeats) for i in range(5)]
        verdicts.append(gate.decide(repeated_run("then", rng, process_cv=0.01, repeats=repeats), more).verdict)
    assert verdicts.count("unchanged") >= 8, verdicts


def test_noise_no_number_of_repeats_can_fix_is_said_so():
    rng = random.Random(1)
    history = [repeated_run(f"b{i}", rng, process_cv=0.12) for i in range(5)]
    verdict = gate.decide(repeated_run("now", rng, process_cv=0.12), history)
    assert verdict.noise["dominant"] == "processes"
    assert "not by repeats (it would take over 50 fresh-process repeats per run)" in verdict.noise["lever"]


def test_round_noise_is_named_and_needs_no_lever_when_the_threshold_is_resolved():
    verdict = gate.decide(run([1000.0] * 10, "now"), steady_history(spread=0.005))
    assert verdict.verdict == "unchanged"
    assert verdict.noise["dominant"] == "rounds" and verdict.noise["lever"] is None

    row = gate_table.rows([("s", verdict.to_dict())])[0]
    assert row[8].startswith("rounds ") and row[9] == "-"


def dataclass_replace(sample, **changes):
    import dataclasses

    return dataclasses.replace(sample, **changes)


# --- cuDNN's algorithm choice, and a test id whose jobs changed ------------------------------------------

CUDNN_HISTORY = DATA / "cudnn-history"


@pytest.fixture(scope="module")
def cudnn_history():
    """Seven runs saved on an H200: graphed ResNet26 bs128 x1 with cuDNN autotuning, x7 with its heuristics; runs
    1-5 the baseline, 6 an A/A run, 7 one extra step every 33."""
    return load(CUDNN_HISTORY)


def test_h200_graphed_jobs_are_gated_at_two_percent_when_cudnn_chooses_the_same_algorithms(cudnn_history):
    runs = cudnn_history.runs
    assert len(runs) == 7
    for name in runs[0].scenarios:
        samples = cudnn_history.samples(name)
        aa, slowed = gate.decide(samples[5], samples[:5]), gate.decide(samples[6], samples[:5])
        if name.endswith("heuristics]"):
            assert aa.verdict == "unchanged" and aa.mde < 0.025 and aa.mde_noise < 0.012, (name, aa)
            assert slowed.verdict == "regressed" and slowed.failed and -0.04 < slowed.change < -0.025
            assert "the noise alone resolves" in aa.reason
            # to catch a 2% drop 95% of the time, lower the threshold: nothing else changes
            lower = gate.Policy(threshold=0.015)
            aa, slowed = gate.decide(samples[5], samples[:5], lower), gate.decide(samples[6], samples[:5], lower)
            assert aa.verdict == "unchanged" and aa.mde < 0.02 and slowed.verdict == "regressed"
        else:  # autotuning: processes may time different algorithms, so runs differ by 0.6-1.1%
            assert aa.verdict == "inconclusive" and aa.mde > 0.05, (name, aa)
            assert aa.noise["lever"].startswith('options={"cudnn_autotune": False}')


def test_the_detectable_drop_says_when_the_threshold_binds_rather_than_the_noise(cudnn_history):

    name = next(n for n in cudnn_history.runs[0].scenarios if n.endswith("n7-heuristics]"))
    samples = cudnn_history.samples(name)
    row = gate_table.rows([(name, gate.decide(samples[5], samples[:5]).to_dict())])[0]
    detectable, noise = row[6].split(" (noise: ")
    assert 0.02 < float(detectable.rstrip("%")) / 100 < 0.025 and float(noise.rstrip("%)")) / 100 < 0.012, row[6]


def test_an_eager_launch_bound_job_is_not_sent_to_cudnn_heuristics():
    rng = random.Random(23)
    history = [dataclass_replace(r, autotuned=True) for r in (repeated_run(f"b{i}", rng, process_cv=0.05)
                                                              for i in range(5))]
    verdict = gate.decide(dataclass_replace(repeated_run("now", rng, process_cv=0.05), autotuned=True), history)
    assert verdict.verdict == "inconclusive"
    assert "cuda_graph=True" in verdict.noise["lever"] and "cudnn_autotune" not in verdict.noise["lever"]


def test_runs_of_other_jobs_under_the_same_test_id_are_never_its_baseline():
    graphed = ("resnet26-cifar10/bs128/graph", "resnet26-cifar10/bs128/graph")
    heuristics = ("resnet26-cifar10/bs128/graph/cudnn-heuristics",) * 2
    old = [dataclass_replace(run([1030.0 + i] * 10, f"a{i}"), jobs=graphed) for i in range(5)]
    new = [dataclass_replace(run([1000.0 + i] * 10, f"b{i}"), jobs=heuristics) for i in range(2)]
    verdict = gate.decide(dataclass_replace(run([1000.0] * 10, "now"), jobs=heuristics), old + new)
    assert verdict.verdict == "no baseline" and not verdict.failed  # not "regressed" against the faster old jobs
    assert any("5 run(s) of other jobs under this test id left out" in note and "cudnn-heuristics" in note
               for note in verdict.notes), verdict.notes
    unknown = [run([1000.0 + i] * 10, f"c{i}") for i in range(3)]  # saved before jobs were compared: kept
    assert gate.decide(dataclass_replace(run([1000.0] * 10, "now"), jobs=heuristics), unknown).baseline_runs


# --- a robust baseline: disturbed runs, the current level, a fleet of GPUs ----------------------------------

def test_one_disturbed_run_does_not_blind_the_gate_and_is_named():
    """The H200 case: steady runs 0.1-0.4% apart, one run -9% with a 5% round spread and the power cap for 4% of
    the window; a -3.8% change must still be caught, and the disturbed run named."""
    from doubles.gatesim import DISTURBED, disturbed_run

    rng = random.Random(4)
    steady = [synthetic_run(rng, f"b{i}", 3560.0, 0.004, 0.002, 10, cap=(0.88, 1.0)) for i in range(4)]
    history = steady[:2] + [disturbed_run(rng, "b-bad", 3560.0, 0.004, 0.002, 10, DISTURBED)] + steady[2:]
    slowed = synthetic_run(rng, "now", 3560.0 * 0.962, 0.004, 0.0, 10, cap=(0.88, 1.0))
    verdict = gate.decide(slowed, history)
    assert verdict.verdict == "regressed", verdict
    assert set(verdict.left_out) == {"b-bad"} and "round spread" in verdict.left_out["b-bad"]
    assert "b-bad" not in verdict.baseline_runs and any("b-bad" in note for note in verdict.notes)

    assert "1 disturbed run(s) left out: b-bad" in gate_table.table([("s", verdict.to_dict())])
    # another machine folder's steady run of the disturbed run's id (one --benchmark-save name) stays in
    same_id = gate.decide(slowed, history + [dataclass_replace(steady[0], run_id="b-bad")])
    assert same_id.baseline_runs.count("b-bad") == 1 and set(same_id.left_out) == {"b-bad"}, same_id
    # without the rules the same history could not tell: its spread is the disturbed run's
    gate_without = gate.decide(slowed, [dataclass_replace(r, power_capped_share=None) for r in history],
                               gate.Policy(min_runs=5))
    assert gate_without.left_out  # its level alone still gives it away


def test_a_cold_first_run_is_left_out_by_its_power_cap_share():
    from doubles.gatesim import COLD, disturbed_run

    rng = random.Random(9)
    history = [disturbed_run(rng, "a-cold", 1000.0, 0.05, 0.0, 10, COLD)]
    history += [synthetic_run(rng, f"b{i}", 1000.0, 0.05, 0.0, 10, cap=(0.88, 1.0)) for i in range(4)]
    verdict = gate.decide(synthetic_run(rng, "now", 1000.0, 0.05, 0.0, 10, cap=(0.88, 1.0)), history)
    assert list(verdict.left_out) == ["a-cold"] and "power cap" in verdict.left_out["a-cold"]


def test_a_disturbed_current_run_is_named_but_still_judged():
    """A signature that persists is the code's, not the machine's: the verdict names it (the pytest gate measures
    it again) and still judges the level: an injected slowdown also widens the rounds."""
    from doubles.gatesim import DISTURBED, disturbed_run

    rng = random.Random(2)
    history = [synthetic_run(rng, f"b{i}", 1000.0, 0.003, 0.001, 10, cap=(0.88, 1.0)) for i in range(5)]
    verdict = gate.decide(disturbed_run(rng, "now", 1000.0, 0.003, 0.0, 10, DISTURBED), history)
    assert verdict.disturbed and "round spread" in verdict.disturbed and verdict.verdict == "regressed"
    calm = gate.decide(synthetic_run(rng, "calm", 1000.0, 0.003, 0.0, 10, cap=(0.88, 1.0)), history)
    assert calm.disturbed is None


def test_level_outliers_leave_steady_runs_alone_and_take_the_odd_one():
    assert level_outliers([0.0, 0.001, -0.001, 0.002, -0.002]) == {}
    found = level_outliers([0.0, 0.001, -0.001, 0.002, -0.09])
    assert list(found) == [4] and found[4] == pytest.approx(-0.0905, abs=1e-3)


@pytest.mark.parametrize("disturbed,cold,runs", [(1, 0, 5), (1, 1, 5), (1, 2, 10)])
def test_false_alarms_stay_at_alpha_with_disturbed_and_cold_runs_in_the_history(disturbed, cold, runs):
    result = detection_rate(0.0, 0.05, 0.0, trials=300, seed=21, disturbed=disturbed, cold=cold, baseline_runs=runs)
    assert result["rate"] <= 0.01 and result["named"] >= 0.95 and result["steady_left_out"] <= 0.02, result


def test_a_four_percent_drop_is_caught_with_a_disturbed_and_a_cold_run_in_the_history():
    result = detection_rate(0.04, 0.003, 0.002, trials=200, seed=22, disturbed=1, cold=1)
    assert result["rate"] >= 0.85 and result["named"] >= 0.95, result


def test_the_baseline_is_the_level_since_the_last_shift_not_only_the_last_five_runs():
    rng = random.Random(6)
    old = [synthetic_run(rng, f"a{i:02d}", 1050.0, 0.002, 0.002, 10) for i in range(8)]
    new = [synthetic_run(rng, f"b{i:02d}", 1000.0, 0.002, 0.002, 10) for i in range(12)]
    verdict = gate.decide(synthetic_run(rng, "now", 1000.0, 0.002, 0.0, 10), old + new)
    assert verdict.baseline_runs == [r.run_id for r in new]  # all twelve of the current level, none before
    assert any("8 run(s) before the level shift at b00 left out" in note for note in verdict.notes), verdict.notes
    assert verdict.verdict == "unchanged"


LEVELS = {"s1": 500.0, "s2": 2000.0, "s3": 9000.0, "s4": 1200.0, "s5": 6000.0, "target": 3500.0}


def fleet(rng, effects, scenarios=tuple(LEVELS), runs=4, unalike=0.0):
    """Histories of several scenarios on GPUs whose levels differ by ``effects`` (log); ``unalike``: each scenario
    also moves by its own N(0, unalike) on each GPU (a GPU-bound job and a host-paced one do not move alike)."""
    saved = {}
    for name in scenarios:
        saved[name] = [synthetic_run(rng, f"{gpu}-{name}-{i}", LEVELS[name] * math.exp(effect + own), 0.003, 0.002,
                                     10, uuid=gpu)
                       for gpu, effect in effects.items() for own in [rng.gauss(0, unalike)] for i in range(runs)]
    return saved


def test_a_new_gpu_is_judged_against_the_fleet_at_its_own_level():
    rng = random.Random(8)
    saved = fleet(rng, {"GPU-a": 0.0, "GPU-b": 0.08})
    here = -0.06  # the new GPU is 6% slower than GPU-a
    references = [(synthetic_run(rng, f"new-{n}", LEVELS[n] * math.exp(here), 0.003, 0.002, 10, uuid="GPU-new"),
                   saved[n]) for n in ("s1", "s2", "s3", "s4", "s5")]
    current = synthetic_run(rng, "now", 3500.0 * math.exp(here), 0.003, 0.002, 10, uuid="GPU-new")
    adjusted = gate.decide(current, saved["target"], references=references)  # placed to within about 2-3%
    assert adjusted.verdict in ("unchanged", "inconclusive") and abs(adjusted.change) < 0.01, adjusted
    assert adjusted.fleet.startswith("other GPUs of this model (2), level adjusted by") and "5 shared scenario" in adjusted.fleet
    slowed = dataclass_replace(current, rounds=tuple(x * 0.96 for x in current.rounds))
    assert gate.decide(slowed, saved["target"], references=references).verdict == "regressed"
    plain = gate.decide(current, saved["target"])  # no references: GPUs 8% apart, this one's level unknown
    assert plain.verdict == "no baseline" and "this GPU's level is unknown" in plain.reason
    assert "not adjusted: fewer than 2 scenarios shared" in plain.fleet and any("not adjusted" in n for n in plain.notes)


def test_one_shared_scenario_does_not_place_a_new_gpu():
    """One reference cannot say whether the judged scenario moves with it between machines: no baseline."""
    rng = random.Random(5)
    saved = fleet(rng, {"GPU-a": 0.0, "GPU-b": 0.0})
    references = [(synthetic_run(rng, "new-s1", 500.0, 0.003, 0.002, 10, uuid="GPU-new"), saved["s1"])]
    current = synthetic_run(rng, "now", 3500.0 * 0.96, 0.003, 0.002, 10, uuid="GPU-new")
    verdict = gate.decide(current, saved["target"], references=references)
    assert verdict.verdict == "no baseline" and "fewer than 2 scenarios measured both" in verdict.reason


def test_scenarios_that_move_unalike_between_machines_widen_the_bound():
    """Real H200s: a GPU-bound job ran at the same level on two GPUs where a job paced by its host differed by
    2-4%. When the shared scenarios' offsets disagree, a judged scenario's own offset is that uncertain: a 4% gap
    from the fleet is no longer called a regression, where scenarios that agree still place the GPU exactly."""
    rng = random.Random(12)
    saved = fleet(rng, {"GPU-a": 0.0, "GPU-b": 0.0})
    current = synthetic_run(rng, "now", 3500.0 * 0.96, 0.003, 0.002, 10, uuid="GPU-new")

    def judged(offsets):
        references = [(synthetic_run(rng, f"new-{n}", LEVELS[n] * math.exp(o), 0.003, 0.002, 10, uuid="GPU-new"),
                       saved[n]) for n, o in zip(("s1", "s2", "s3", "s4", "s5"), offsets)]
        return gate.decide(current, saved["target"], references=references)
    assert judged([0.0] * 5).verdict == "regressed"  # the machine is the fleet's: -4% is the code
    unalike = judged([0.0, 0.03, -0.03, 0.03, -0.03])
    assert unalike.verdict == "inconclusive" and unalike.mde > 0.05, unalike


def test_placement_keeps_false_alarms_at_alpha_when_scenarios_move_unalike():
    """Each scenario moves by its own 2% between machines beside the GPUs' 5%: the spread of the references'
    offsets is estimated from few of them, so the test's degrees of freedom are theirs, and A/A runs stay at
    alpha (with the baseline runs' degrees of freedom instead, 2-4% of them were called regressed)."""
    rng = random.Random(77)
    alarms = 0
    for trial in range(400):
        effects = {f"GPU-{g}": rng.gauss(0, 0.05) for g in "ab"}
        saved = fleet(rng, effects, runs=4, unalike=0.02)
        here = rng.gauss(0, 0.05)
        names = ("s1", "s2") if trial % 2 else ("s1", "s2", "s3")
        references = [(synthetic_run(rng, f"{trial}-{n}", LEVELS[n] * math.exp(here + rng.gauss(0, 0.02)), 0.003,
                                     0.002, 10, uuid="GPU-new"), saved[n]) for n in names]
        current = synthetic_run(rng, f"{trial}-now", 3500.0 * math.exp(here + rng.gauss(0, 0.02)), 0.003, 0.002, 10,
                                uuid="GPU-new")
        alarms += gate.decide(current, saved["target"], references=references).failed
    assert alarms <= 4  # 400 trials at alpha 0.5%: 2 expected


def test_fleet_adjustment_keeps_false_alarms_at_alpha():
    """GPUs of one model 5% apart (log sd), each scenario known on two of them; a new GPU with two reference
    scenarios: the uncertainty of its estimated level widens the bound, so A/A runs stay at alpha."""
    rng = random.Random(31)
    alarms = 0
    for trial in range(150):
        effects = {f"GPU-{g}": rng.gauss(0, 0.05) for g in "ab"}
        saved = fleet(rng, effects, runs=3)
        here = rng.gauss(0, 0.05)
        references = [(synthetic_run(rng, f"{trial}-{n}", LEVELS[n] * math.exp(here), 0.003, 0.002, 10,
                                     uuid="GPU-new"), saved[n]) for n in ("s1", "s2")]
        current = synthetic_run(rng, f"{trial}-now", 3500.0 * math.exp(here), 0.003, 0.002, 10, uuid="GPU-new")
        alarms += gate.decide(current, saved["target"], references=references).failed
    assert alarms <= 2  # 150 trials at alpha 0.5%: 0.75 expected




def test_a_disturbed_run_is_measured_again_before_it_is_judged(pytester, monkeypatch, remeasure=1):
    """Real workers on the CPU; the gate calls the first measurement disturbed. With --colloc-gate-remeasure=1 the
    scenario is measured once more and judged on that, and the verdict and the terminal say so."""
    real = gate.decide
    calls = []

    def first_disturbed(*args, **kwargs):
        verdict = real(*args, **kwargs)
        calls.append(verdict.current)
        if len(calls) == 1:
            verdict.disturbed = "round spread 5.2%, 13x the usual 0.40%"
        return verdict

    monkeypatch.setattr(gate, "decide", first_disturbed)
    pytester.makepyfile(tiny_workload=TINY_SOURCE)
    pytester.makepyfile('''
import pytest
@pytest.mark.gpucolloc_quick
def test_x(collocate):
    collocate(["tiny_workload:factory"])
''')
    result = pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", "--colloc-gate", "--colloc-alone=off",
                                f"--colloc-gate-remeasure={remeasure}", "--colloc-rounds=2",
                                "--colloc-round-seconds=0.2", "--colloc-warmup-seconds=0.1", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert len(calls) == 1 + remeasure and (remeasure == 0 or calls[0] != calls[1])  # a new measurement
    text = result.stdout.str()
    assert "measured again before judging test_x[cpu-naive]: round spread 5.2%, 13x the usual 0.40%" in text
    assert "measured 2 times, judged on the last" in text
