"""The gate judges a serving job's latency (lower is better) beside the scenario's throughput: saved histories of
serving scenarios through ``pytest-gpucolloc gate`` and ``history --metric p99``, and a gated pytest run."""
import json
import math
import random
import re
from pathlib import Path

import pytest

from pytest_gpucolloc import cli, gate
from serving_workload import SOURCE as SERVE_SOURCE
from tiny_workload import SOURCE as TINY_SOURCE

DATA = Path(__file__).resolve().parent / "data"  # cut from real runs: data/README.md
TEMPLATE = sorted((DATA / "cudnn-history").rglob("*.json"))[0]  # a version-2 run on an H200
TRAINER = "resnet26-cifar10/bs128/graph"
SCENARIO = "test_service_beside_training[mps-rate80]"


def write_run(root: Path, number: int, p99_ms: float, *, spread: float = 0.004, saturated: bool = False,
              seed: int = 0, p50_ms: float | None = None) -> Path:
    """A saved run of one scenario: a training job beside a service asked for 80% of its capacity, which each
    session measures anew (so the requests/s it came to differs from run to run); throughput steady, the service's
    p99 at ``p99_ms`` with a round-to-round spread of ``spread``."""
    rng = random.Random(seed * 1000 + number)
    data = json.loads(TEMPLATE.read_text())
    bench = data["benchmarks"][0]
    data["benchmarks"] = [bench]
    bench["fullname"] = f"benchmarks/test_serving.py::{SCENARIO}"
    bench["name"] = SCENARIO
    data["datetime"] = f"2026-12-{number:02d}T00:00:00"
    data["commit_info"]["id"] = f"{number:02d}abcdef"
    rounds = [1000.0 * math.exp(rng.gauss(0, 0.003)) for _ in range(6)]
    capacity = 150.0 + rng.uniform(-2, 2)
    service = f"resnet50-imagenet224/bs4/bf16/serve-{0.8 * capacity:.1f}rps"
    round_p99 = [p99_ms * math.exp(rng.gauss(0, spread)) for _ in rounds]
    round_p50 = [(p50_ms or p99_ms / 2.5) * math.exp(rng.gauss(0, spread)) for _ in rounds]
    info = bench["extra_info"]
    info.update(aggregate_round_throughputs=rounds, repeats=[rounds], aggregate_throughput=sum(rounds) / 6,
                workloads=[service, TRAINER], n_workers=2, workers=info["workers"] * 2)
    info["serving"] = {"workload": service, "rate_asked": f"80% of {capacity:,.1f}/s alone back to back",
                       # the whole run's percentiles, over every request: near its rounds' (the gate's level)
                       "p99_ms": math.exp(sum(map(math.log, round_p99)) / len(round_p99)), "round_p99_ms": round_p99,
                       "p50_ms": math.exp(sum(map(math.log, round_p50)) / len(round_p50)), "round_p50_ms": round_p50,
                       "saturated": saturated,
                       "why": "120.0 requests/s is more than it serves: the queue grew to 900" if saturated else None}
    path = root / f"{number:04d}_run.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def storage(tmp_path):
    """Six saved runs of the service at a steady 10 ms p99."""
    root = tmp_path / ".benchmarks" / "Linux"
    root.mkdir(parents=True)
    for number in range(1, 7):
        write_run(root, number, 10.0)
    return root


def gate_json(path: Path, storage: Path, capsys) -> tuple[int, dict]:
    capsys.readouterr()
    code = cli.main(["gate", str(path), "--storage", str(storage.parent), "--format", "json"])
    return code, json.loads(capsys.readouterr().out)[0]


def test_a_steady_p99_is_unchanged_and_says_what_the_tails_noise_resolves(storage, capsys):
    code, verdict = gate_json(write_run(storage, 7, 10.0), storage, capsys)
    assert code == 0 and verdict["verdict"] == "unchanged"
    p99 = verdict["latency"]["p99"]
    # runs whose service came to different requests/s are one history: each was asked for 80% of its capacity
    assert p99["verdict"] == "unchanged" and p99["metric"] == "p99" and len(p99["baseline_runs"]) == 6, p99
    assert p99["baseline"] == pytest.approx(10.0, rel=0.02) and p99["current"] == pytest.approx(10.0, rel=0.02)
    assert "p99 rises of" in p99["reason"] and "the p99 latency's own noise resolves" in p99["reason"]
    assert 0 < p99["mde_noise"] <= p99["mde"] < 0.05


def test_p99_up_30_percent_with_tight_rounds_regresses_and_fails_the_gate(storage, capsys, tmp_path):
    path = write_run(storage, 7, 13.0)
    code, verdict = gate_json(path, storage, capsys)
    assert code == 1 and verdict["verdict"] == "unchanged"  # the training throughput did not move: the tail did
    p99 = verdict["latency"]["p99"]
    assert p99["verdict"] == "regressed" and p99["change"] == pytest.approx(0.30, abs=0.03)
    assert "higher p99 latency, beyond the baseline's run-to-run spread" in p99["reason"]
    low, high = p99["ci"]
    assert 0 < low < p99["change"] < high  # an interval of the rise, in p99's own terms
    assert "p99 latency regressed (+30" in " ".join(verdict["notes"])
    summary = tmp_path / "summary.md"
    assert cli.main(["gate", str(path), "--storage", str(storage.parent), "--markdown", str(summary),
                     "--columns", "scenario,verdict,baseline,current,change"]) == 1  # any terminal's width
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if line.startswith(f"{SCENARIO} p99"))  # the short name
    verdict, baseline, unit, current, unit_again = row.split()[3:8]
    assert (verdict, unit, unit_again) == ("regressed", "ms", "ms") and "+30." in row, table
    assert float(baseline) == pytest.approx(10, abs=0.05) and float(current) == pytest.approx(13, abs=0.05), table
    assert f"{SCENARIO} p99 latency | regressed" in summary.read_text()


def test_p99_down_is_improved_never_a_failure(storage, capsys):
    code, verdict = gate_json(write_run(storage, 7, 7.0), storage, capsys)
    p99 = verdict["latency"]["p99"]
    assert code == 0 and p99["verdict"] == "improved"
    assert p99["change"] == pytest.approx(-0.30, abs=0.03)
    assert "lower p99 latency" in p99["reason"]


def test_a_service_that_saturates_where_its_history_kept_up_is_regressed(storage, capsys):
    """The worst latency regression: the service can no longer keep up with a rate its earlier runs on this GPU
    served. Named disturbed too, so that the pytest gate measures it again before failing (a stall is not it)."""
    code, verdict = gate_json(write_run(storage, 7, 13.0, saturated=True), storage, capsys)
    p99 = verdict["latency"]["p99"]
    assert code == 1 and p99["verdict"] == "regressed"
    assert "at the rate its last 6 runs on this GPU served without a queue: it can no longer keep up" in \
        p99["reason"] and p99["disturbed"]


def test_a_saturated_service_without_a_history_that_kept_up_is_not_judged_and_leaves_p99_baselines(storage, capsys,
                                                                                                     tmp_path):
    fresh = tmp_path / "fresh" / ".benchmarks" / "Linux"
    fresh.mkdir(parents=True)
    code, verdict = gate_json(write_run(fresh, 1, 13.0, saturated=True), fresh, capsys)
    assert code == 0 and verdict["latency"]["p99"]["verdict"] == "not comparable"
    assert "latency not judged: the service was saturated (120.0 requests/s is more than it serves" in \
        verdict["latency"]["p99"]["reason"]
    write_run(storage, 7, 50.0, saturated=True)  # a saturated run in the history, its p99 a queue's
    code, verdict = gate_json(write_run(storage, 8, 10.0), storage, capsys)
    p99 = verdict["latency"]["p99"]
    assert code == 0 and p99["verdict"] == "unchanged"
    assert "0007_run" not in p99["baseline_runs"]
    assert any("1 saturated run(s) left out" in note for note in p99["notes"])


def test_history_follows_p99_of_serving_scenarios(tmp_path, capsys):
    root = tmp_path / ".benchmarks" / "Linux"
    root.mkdir(parents=True)
    for number in range(1, 13):
        write_run(root, number, 10.0 if number <= 6 else 13.0, spread=0.02)
    capsys.readouterr()
    assert cli.main(["history", "--storage", str(root.parent), "--metric", "p99", "--format", "json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["metric"] == "p99" and len(found["change_points"]) == 1
    shift = found["change_points"][0]
    assert shift["run_id"] == "0007_run" and shift["metric"] == "p99"
    assert shift["before"] == pytest.approx(10.0, rel=0.03) and shift["change"] == pytest.approx(0.30, abs=0.03)
    assert cli.main(["history", "--storage", str(root.parent), "--metric", "p99"]) == 0
    text = capsys.readouterr().out
    assert "of the serving job's p99 latency" in text and "before, p99 ms" in text
    assert cli.main(["history", "--storage", str(root.parent), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["change_points"] == []  # the throughput did not move


def test_history_of_p99_without_a_serving_scenario_says_so(capsys):
    assert cli.main(["history", "--storage", str(DATA / "aa-history"), "--metric", "p99"]) == 2
    assert "no saved scenario with a serving job's p99" in capsys.readouterr().err



def test_a_p50_rise_is_judged_apart_from_the_tail(tmp_path, capsys):
    """The service itself got slower: its p50 rose 15% while its p99 stayed; p50 regressed, p99 not."""
    root = tmp_path / ".benchmarks" / "Linux"
    root.mkdir(parents=True)
    for number in range(1, 8):
        path = write_run(root, number, 10.0, p50_ms=4.0 * (1.15 if number == 7 else 1.0))
    code, verdict = gate_json(path, root, capsys)
    assert code == 1 and verdict["latency"]["p50"]["verdict"] == "regressed", verdict["latency"]["p50"]
    assert verdict["latency"]["p50"]["change"] == pytest.approx(0.15, abs=0.02)
    assert verdict["latency"]["p99"]["verdict"] == "unchanged"


def test_runs_that_cannot_resolve_a_change_say_so_in_words(tmp_path, capsys):
    """Three runs whose p99 spread by tens of percent: no "+21309%" of a detectable rise, but "not resolvable"."""
    root = tmp_path / ".benchmarks" / "Linux"
    root.mkdir(parents=True)
    for number, ms in enumerate([4.4, 7.6, 4.4, 5.0], 1):
        path = write_run(root, number, ms)
    code, verdict = gate_json(path, root, capsys)
    p99 = verdict["latency"]["p99"]
    assert p99["verdict"] == "inconclusive" and p99["reason"].startswith("not resolvable with 3 baseline runs"), p99
    assert p99["ci"] is None and p99["mde"] is None
    # the table: each latency on its row of its own, not said again in the scenario's row
    cli.main(["gate", str(path), "--storage", str(root.parent), "--format", "markdown"])
    scenario_row, p99_row = [line for line in capsys.readouterr().out.splitlines()
                             if line.startswith(f"| benchmarks/test_serving.py::{SCENARIO} ")][::2]
    assert "p99 latency" not in scenario_row and "not resolvable with 3 baseline runs" in p99_row, scenario_row


def test_a_gated_pytest_run_judges_the_services_p99_and_fails_on_its_regression(pytester, monkeypatch):
    """Real workers on the CPU. The p99 judgement is made regressed: the run fails, and the saved verdict holds it."""
    real = gate.decide
    judged = []

    def p99_regressed(current, *args, **kwargs):
        verdict = real(current, *args, **kwargs)
        judged.append(verdict.metric)
        if current.latency == "p99":
            verdict.verdict, verdict.change = "regressed", 0.3
        return verdict

    monkeypatch.setattr(gate, "decide", p99_regressed)
    pytester.makepyfile(tiny_workload=TINY_SOURCE, serve_workload=SERVE_SOURCE)
    pytester.makepyfile('''
import pytest
from pytest_gpucolloc import Workload

@pytest.mark.gpucolloc_quick
def test_service(collocate):
    collocate([Workload("serve_workload:factory", batch_size=2, rate=50), "tiny_workload:factory"])
''')
    out = pytester.path / "run.json"
    result = pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", "--colloc-gate", "--colloc-alone=off",
                                "--colloc-rounds=2", "--colloc-round-seconds=0.2", "--colloc-warmup-seconds=0.1",
                                f"--benchmark-json={out}", "-p", "no:cacheprovider")
    assert judged == ["throughput", "p50", "p99"]  # alone is off: no alone latency to judge
    assert result.ret == 1  # the test passed; the gate failed the run
    result.stdout.fnmatch_lines(["*gpucolloc gate: 1 regressed of 1*"])
    assert re.search(r"test_service\[cpu-naive\] p99 latency\s+regressed", result.stdout.str())  # its own row
    saved = json.loads(out.read_text())["benchmarks"][0]["extra_info"]["gate"]
    assert saved["verdict"] == "no baseline" and saved["latency"]["p99"]["verdict"] == "regressed"
    assert saved["latency"]["p50"]["verdict"] == "no baseline"
    assert gate.Verdict.from_dict(saved).failed  # as an xdist controller reads it back


def test_a_p99_regression_is_the_runs_regression_wherever_verdicts_are_counted():
    """The report's summary, its gate history and the figures mark a run regressed when its service's p99 regressed,
    though its throughput did not."""
    from pytest_gpucolloc import plots, record, report

    saved = json.loads((DATA / "serving-cpu-run.json").read_text())
    info = next(b["extra_info"] for b in saved["benchmarks"]
                if (b["extra_info"].get("serving") or {}).get("training_jobs"))
    throughput = {"verdict": "unchanged", "reason": "change within noise", "baseline_runs": ["a", "b", "c"]}
    info["gate"] = {**throughput, "p99": {**throughput, "verdict": "regressed", "metric": "p99"}}
    scenario = record.read(info)
    assert scenario.verdict == "regressed" and plots.regressed(scenario)
    (row,) = report.summary([("test_service", scenario)])
    assert row.verdicts["regressed"] == 1
    info["gate"]["p99"]["verdict"] = "unchanged"
    assert record.read(info).verdict == "unchanged"


def test_compare_says_each_latency_beside_the_throughput(tmp_path, capsys):
    root = tmp_path / ".benchmarks" / "Linux"
    root.mkdir(parents=True)
    write_run(root, 1, 10.0, p50_ms=4.0)
    write_run(root, 2, 10.0, p50_ms=4.6)
    capsys.readouterr()
    assert cli.main(["compare", "--storage", str(root.parent), "--runs-ids", "0001", "0002", "--format", "json"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert set(row["latency"]) == {"p50", "p99"}  # no alone latency in these runs
    assert row["latency"]["p50"]["change"] == pytest.approx(0.15, abs=0.01)
    assert row["latency"]["p50"]["metric"] == "p50"
    assert abs(row["latency"]["p99"]["change"]) < 0.02


def test_compare_of_alternated_sessions_judges_a_median_by_signed_ranks(tmp_path, capsys):
    """Sessions alternated A B A B ...: each B run's p50 against its neighbours. Five of six rose by about 10%, one fell
    by 0.5% (a session at another level): its sign is a full vote against (p 0.11), its rank the smallest (p 0.031)."""
    root = tmp_path / ".benchmarks" / "Linux"
    root.mkdir(parents=True)
    b_p50 = iter([4.4, 4.48, 3.98, 4.36, 4.44, 4.52])
    for number in range(1, 14):
        side = "A" if number % 2 else "B"
        path = write_run(root, number, 10.0, spread=1e-5, p50_ms=4.0 if side == "A" else next(b_p50))
        data = json.loads(path.read_text())
        data["machine_info"]["gpucolloc"]["driver_version"] = side
        path.write_text(json.dumps(data))
    capsys.readouterr()
    code = cli.main(["compare", "--group-by", "driver_version", "--groups", "A", "B", "--storage", str(root.parent),
                     "--format", "json", "--alpha", "0.05"])
    row = json.loads(capsys.readouterr().out)[0]
    p50 = row["latency"]["p50"]
    assert p50["verdict"] == "regressed" and p50["change"] == pytest.approx(0.10, abs=0.01), p50
    assert row["verdict"] != "regressed" and code == 1  # a latency that regressed fails it, as the gate's exit says
    assert "5 of 6 slower" in p50["reason"]


def test_a_runs_latency_is_its_percentile_over_every_request_as_its_record_says(storage, capsys):
    """The gate and history judge and show the run's percentile over all its requests (the record's and the
    summary's number), not a mean of its rounds' (for a p99, a mean of each round's slowest requests)."""
    path = write_run(storage, 7, 10.0)
    data = json.loads(path.read_text())
    data["benchmarks"][0]["extra_info"]["serving"]["p99_ms"] = 12.5  # its rounds' p99s stay about 10 ms
    path.write_text(json.dumps(data))
    code, verdict = gate_json(path, storage, capsys)
    assert verdict["latency"]["p99"]["current"] == pytest.approx(12.5), verdict["latency"]["p99"]
    assert code == 1 and verdict["latency"]["p99"]["verdict"] == "regressed"
    cli.main(["history", "--storage", str(storage.parent), "--metric", "p99", "--format", "json"])
    shown = json.loads(capsys.readouterr().out)["series"][0]["shown"]
    assert shown[-1]["run_id"] == "0007_run" and shown[-1]["value"] == pytest.approx(12.5), shown


def test_compare_says_which_run_after_it_judged(tmp_path, capsys):
    """Two runs after, not alternated with the runs before: the newest is judged, and the command says so (its title
    counts both)."""
    root = tmp_path / ".benchmarks" / "Linux"
    root.mkdir(parents=True)
    for number in range(1, 7):
        path = write_run(root, number, 10.0)
        data = json.loads(path.read_text())
        data["machine_info"]["gpucolloc"]["driver_version"] = "A" if number <= 4 else "B"
        path.write_text(json.dumps(data))
    capsys.readouterr()
    cli.main(["compare", "--group-by", "driver_version", "--groups", "A", "B", "--storage", str(root.parent)])
    out = capsys.readouterr()
    assert "(4 runs -> 2 runs;" in out.out, out.out
    assert "note: the newest of the 2 runs after is judged against the 4 runs before" in out.err, out.err


def test_a_storage_with_an_index_reads_each_runs_latency_over_every_request(tmp_path, capsys):
    """64 runs or more keep an index beside the files: its samples carry each run's percentile over every request
    too, read back as the files say (an index of the earlier schema is built again)."""
    from pytest_gpucolloc import history, index

    root = tmp_path / ".benchmarks" / "Linux"
    root.mkdir(parents=True)
    made = tmp_path / "made"
    made.mkdir()
    for number in range(1, history.INDEX_FROM + 2):
        data = json.loads(write_run(made, number % 28 + 1, 10.0, seed=number).read_text())
        data["benchmarks"][0]["extra_info"]["serving"]["p99_ms"] = 13.0  # its rounds' p99s stay about 10 ms
        (root / f"{number:04d}_run.json").write_text(json.dumps(data))
    for _ in range(2):  # the first call builds the index, the second reads it
        code, verdict = gate_json(root / f"{history.INDEX_FROM + 1:04d}_run.json", root, capsys)
        p99 = verdict["latency"]["p99"]
        assert p99["baseline"] == pytest.approx(13.0) and p99["current"] == pytest.approx(13.0), p99
        assert p99["verdict"] != "regressed" and code == 0
    assert (root.parent / index.NAME).exists()  # the storage's index: what the second call read
