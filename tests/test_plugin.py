"""Plugin behaviour through real pytest runs (pytester), with real worker processes on the CPU."""
import dataclasses
import json
from datetime import datetime, timedelta

import pytest

from pytest_gpucolloc.history import load
from test_cli import run_cli

FAST = ["--colloc-rounds=2", "--colloc-round-seconds=0.2", "--colloc-warmup-seconds=0.1", "-p", "no:cacheprovider"]

TINY = '''
import time
import torch


class Step:
    def __init__(self, batch_size, device, sleep=0.0):
        self.samples_per_step = batch_size
        self.model = torch.nn.Linear(8, 2)
        self.x = torch.randn(batch_size, 8)
        self.sleep = sleep

    def train_step(self):
        self.model(self.x).sum().backward()
        if self.sleep:
            time.sleep(self.sleep)


def factory(batch_size, device, precision="fp32", sleep=0.001):  # not spinning: see tiny_workload.py
    return Step(batch_size, device, sleep)
'''

SCENARIOS = '''
import pytest
from pytest_gpucolloc import Workload

pytestmark = pytest.mark.gpucolloc_quick

@pytest.mark.parametrize("n", [1, 2])
def test_tiny(collocate, n):
    result = collocate([Workload("tiny_workload:factory", batch_size=4, options={{"sleep": {sleep}}})] * n)
    assert result.aggregate_throughput > 0
'''


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(tiny_workload=TINY)

    def write(sleep=0.001):
        pytester.makepyfile(test_scenarios=SCENARIOS.format(sleep=sleep))

    return write


def test_help_shows_the_option_group(pytester):
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*GPU collocation benchmarks (pytest-gpucolloc)*", "*--gpu-mode=MODE*",
                                 "*--colloc-rounds=ROUNDS*", "*--colloc-cpus=CPUS*"])


def test_unknown_mode_is_a_usage_error_listing_the_valid_ones(pytester):
    result = pytester.runpytest("--gpu-mode=naive,turbo")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown --gpu-mode 'turbo'; valid modes: sequential, naive, mps, mps-partitioned*"])


@pytest.mark.parametrize("args,message", [
    (["--colloc-rounds=-1"], "*--colloc-rounds must be between 2 and 10000*"),
    (["--colloc-round-seconds=nan"], "*--colloc-round-seconds must be between*"),
    (["--colloc-cpus=0-3;x"], "*--colloc-cpus: invalid CPU list*"),
    (["--colloc-gpu=../../etc"], "*--colloc-gpu must be a GPU index or a GPU-... UUID*"),
    (["--colloc-device=tpu"], "*--colloc-device must be one of auto, cuda, cpu, got 'tpu'*"),
    (["--gpu-mode="], "*--gpu-mode needs at least one mode*"),
    (["--colloc-cudnn=fast"], "*--colloc-cudnn must be one of autotune, heuristics, got 'fast'*"),
    (["--colloc-alone=maybe"], "*--colloc-alone*expected on or off (true or false), got 'maybe'*"),
])
def test_bad_option_values_are_usage_errors(pytester, args, message):
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_options_are_read_once_into_a_typed_config_whose_device_defaults_fill_in_by_device(pytester):
    from pytest_gpucolloc.options import read_options

    config = read_options(pytester.parseconfig("--colloc-rounds=4", "--colloc-gate"))
    assert config.colloc_gate is True and config.colloc_rounds == 4 and config.gpu_mode is None
    gpu, cpu = config.for_device(on_gpu=True), config.for_device(on_gpu=False)
    assert (gpu.modes, gpu.rounds, gpu.max_rounds, gpu.round_s) == (["mps"], 4, 10, 1.0)
    assert (cpu.modes, cpu.rounds, cpu.max_rounds, cpu.round_s) == (["naive"], 4, 4, 0.5)
    with pytest.raises(ValueError, match=r"--colloc-max-rounds \(3\) must be at least --colloc-rounds \(4\)"):
        read_options(pytester.parseconfig("--colloc-rounds=4", "--colloc-max-rounds=3")).for_device(on_gpu=True)


def test_ini_values_are_read_and_checked(pytester, suite):
    suite()
    pytester.makeini("[pytest]\ngpu_mode = naive\ncolloc_rounds = 2\ncolloc_round_seconds = 0.2\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--colloc-warmup-seconds=0.1")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*gpucolloc: modes naive;*"])
    pytester.makeini("[pytest]\ncolloc_rounds = lots\n")
    bad = pytester.runpytest()
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--colloc-rounds must be an integer, got 'lots'*"])


def test_a_run_says_how_long_it_will_take_going_by_the_last_run_here(pytester, suite):
    suite()
    args = ["--gpu-mode=naive", "--colloc-device=cpu", "--colloc-rounds=2", "--colloc-round-seconds=0.2"]
    pytester.makepyfile(tiny_workload="def factory(**options):\n    raise RuntimeError('a broken environment')\n")
    pytester.runpytest(*args, "--colloc-warmup-seconds=0.1").assert_outcomes(failed=2)  # within the second
    assert "going by" not in pytester.runpytest(*args, "--colloc-warmup-seconds=0.1", "--co").stdout.str()
    pytester.makepyfile(tiny_workload=TINY)
    first = pytester.runpytest(*args, "--colloc-warmup-seconds=0.1")
    first.assert_outcomes(passed=2)
    assert "going by" not in first.stdout.str()  # nothing to go by yet: the bound alone
    second = pytester.runpytest(*args, "--colloc-warmup-seconds=0.1", "--co")
    second.stdout.fnmatch_lines(["gpucolloc: 2 scenarios, at most about *",
                                 "gpucolloc: about * s going by their last run here (2 of 2 scenarios, this kind of "
                                 "machine and these settings)"])
    # other settings take other times: nothing to go by
    assert "going by" not in pytester.runpytest(*args, "--colloc-warmup-seconds=0.2", "--co").stdout.str()


def test_modes_that_cannot_run_here_are_skipped_with_the_reason(pytester, suite):
    suite()
    result = pytester.runpytest("--gpu-mode=naive,mps", "--colloc-device=cpu", "-rs", *FAST)
    result.assert_outcomes(passed=2, skipped=2)
    result.stdout.fnmatch_lines(["*SKIPPED*mps: MPS needs an NVIDIA GPU (running in CPU smoke mode)*"])
    # the plugin's own summary says what it skipped and why, without -rs
    plain = pytester.runpytest("--gpu-mode=naive,mps", "--colloc-device=cpu", *FAST)
    plain.stdout.fnmatch_lines(["skipped test_tiny?cpu-mps-1?: mps: MPS needs an NVIDIA GPU (running in CPU smoke mode)"])


def test_records_time_per_sample_and_throughput_in_the_benchmark_json(pytester, suite, tmp_path):
    suite()
    out = tmp_path / "run.json"
    result = pytester.runpytest("--gpu-mode=sequential,naive", "--colloc-device=cpu", f"--benchmark-json={out}", "-rs", *FAST)
    # the same job twice one after another is the job alone: no second measurement, no second id
    result.assert_outcomes(passed=3, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*sequential: the same job run again one after another is the job alone*"])
    data = json.loads(out.read_text())
    by_name = {b["name"]: b for b in data["benchmarks"]}
    assert set(by_name) == {"test_tiny[cpu-sequential-1]", "test_tiny[cpu-naive-1]", "test_tiny[cpu-naive-2]"}
    naive = by_name["test_tiny[cpu-naive-2]"]
    info = naive["extra_info"]
    assert info["mode"] == "naive" and info["n_workers"] == 2 and len(info["workers"]) == 2
    assert info["workloads"] == ["tiny_workload:factory/bs4"] * 2
    rounds = info["aggregate_round_throughputs"]
    assert naive["stats"]["rounds"] == len(rounds) == 2
    assert naive["stats"]["min"] == pytest.approx(1 / max(rounds))  # timing = seconds per sample
    assert info["speedup_vs_sequential"] is not None  # against the job alone, measured once in the session
    alone = by_name["test_tiny[cpu-sequential-1]"]["extra_info"]
    assert info["speedup_vs_sequential"] == pytest.approx(
        sum(w["throughput"] for w in info["workers"]) / alone["workers"][0]["throughput"])
    assert info["measurement"]["rounds"] == 2 and info["measurement"]["fixed_cost_s"] > 0
    # one job under naive is the job alone: its record is that measurement (the same process), not a second one
    one = by_name["test_tiny[cpu-naive-1]"]["extra_info"]
    assert one["mode"] == "naive" and one["measurement"]["same_as"] == "alone"
    assert one["workers"][0]["pid"] == alone["workers"][0]["pid"]
    assert one["aggregate_round_throughputs"] == alone["aggregate_round_throughputs"]
    assert one["speedup_vs_sequential"] == pytest.approx(1.0, rel=1e-4) and one["measurement"]["fixed_cost_s"] == 0.0
    # where the time went: two measurements (the job alone, naive-2); two scenarios recorded one taken once
    result.stdout.fnmatch_lines(["time: 2 measurements took * s: start-up * s (first training steps * s), 4 rounds of 0.2 s, "
                                 "the rest * s; "
                                 "2 scenarios recorded a measurement taken once*"])
    assert all(len(w["round_throughputs"]) == 2 and w["cpus"] is not None or w["cpus"] is None for w in info["workers"])
    assert data["machine_info"]["gpucolloc"]["device"] == "cpu"


def test_alone_measurements_can_be_left_out(pytester, suite, tmp_path):
    suite()
    out = tmp_path / "run.json"
    result = pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", "--colloc-alone=off", "-k", "naive-2",
                                f"--benchmark-json={out}", *FAST)
    result.assert_outcomes(passed=1)
    assert "alone: tiny" not in result.stdout.str()
    # said plainly: no job alone, so no speedups; one of anything is singular
    result.stdout.fnmatch_lines(["gpucolloc: 1 scenario, at most about * no job measured alone (--colloc-alone=off)",
                                 "alone: off (--colloc-alone=off): no job was measured alone, so the "
                                 "speedups are left out (-)", "CV: *", "time: 1 measurement took *"])
    assert "measured alone once" not in result.stdout.str()
    assert json.loads(out.read_text())["benchmarks"][0]["extra_info"]["speedup_vs_sequential"] is None


def test_summary_table_lists_every_scenario(pytester, suite, monkeypatch):
    suite()
    monkeypatch.setenv("COLUMNS", "300")  # a terminal wide enough for every column
    result = pytester.runpytest("--gpu-mode=sequential,naive", "--colloc-device=cpu", *FAST)
    result.stdout.fnmatch_lines([
        "*gpucolloc: collocation scenarios*",
        "CPU smoke mode (--colloc-device=cpu)",
        "telemetry sampler: off (no GPU)",
        "scenario*mode*workers*per-worker samples/s*aggregate samples/s*CV*speedup*efficiency*",
        "alone: tiny_workload:factory/bs4*sequential*",
        "test_tiny?cpu-sequential-1?*sequential*tiny_workload:factory/bs4*1.00x*",
        "test_tiny?cpu-naive-2?*naive*2x tiny_workload:factory/bs4*",
    ])
    # measured alone once: one alone row although three scenarios used it
    assert result.stdout.str().count("alone: tiny_workload:factory/bs4") == 1


def test_ideal_reference_gives_efficiency(pytester, suite, tmp_path):
    suite()
    out = tmp_path / "run.json"
    pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", "--colloc-ideal", f"--benchmark-json={out}",
                       "-k", "naive-2", *FAST).assert_outcomes(passed=1)
    info = json.loads(out.read_text())["benchmarks"][0]["extra_info"]
    assert info["ideal_throughput"] > 0
    assert info["efficiency"] == pytest.approx(info["aggregate_throughput"] / info["ideal_throughput"])


def test_cudnn_heuristics_apply_to_the_convolutional_jobs_whose_options_do_not_say(pytester, tmp_path):
    pytester.makepyfile('''
import pytest
from pytest_gpucolloc import Workload
pytestmark = pytest.mark.gpucolloc_quick
def test_jobs(collocate):
    collocate([Workload("resnet26-cifar10", batch_size=4),
               Workload("resnet26-cifar10", batch_size=4, options={"cudnn_autotune": True})])
''')
    out = tmp_path / "run.json"
    pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", "--colloc-alone=off", "--colloc-cudnn=heuristics",
                       f"--benchmark-json={out}", *FAST).assert_outcomes(passed=1)
    workers = json.loads(out.read_text())["benchmarks"][0]["extra_info"]["workers"]
    # the job that asks for autotuning keeps it; the other says in its label (its history's name) how it ran
    assert [(w["workload"], w["params"]["options"].get("cudnn_autotune")) for w in workers] == [
        ("resnet26-cifar10/bs4/cudnn-heuristics", False), ("resnet26-cifar10/bs4", True)]


def test_cudnn_autotuning_is_the_default_and_leaves_the_jobs_as_written():
    from pytest_gpucolloc.scenario import Settings
    from pytest_gpucolloc.workloads import Workload

    default = Settings(rounds=2, round_s=0.2, warmup_s=0.1, warmup_steps=2, timeout_s=60)
    assert default.cudnn == "autotune"
    for job in (Workload("resnet26-cifar10"), Workload("gpt-mini"), Workload("resnet50", options={"cudnn_autotune": False})):
        assert default.adapt(job) == job
    heuristics = dataclasses.replace(default, cudnn="heuristics")
    assert heuristics.adapt(Workload("gpt-mini")) == Workload("gpt-mini")  # no convolutions to choose for


def test_unknown_workload_fails_at_collection(pytester):
    pytester.makepyfile('''
from pytest_gpucolloc import Workload
JOBS = [Workload("resnet999")]
def test_x(collocate):
    collocate(JOBS)
''')
    result = pytester.runpytest("--colloc-device=cpu")
    result.stdout.fnmatch_lines(["*unknown workload 'resnet999': did you mean *? Known workloads "
                                 "(pytest_gpucolloc.known_workloads(), the README's Workloads): gpt-mini, gpt2-small, "
                                 "resnet152-imagenet*"])
    assert result.ret == pytest.ExitCode.INTERRUPTED  # collection error


@pytest.mark.parametrize("typed, near", [("resnet25-cifar10", "'resnet26-cifar10' or 'resnet50'"),
                                         ("resnet26-cifar", "'resnet26-cifar10' or 'resnet26' or 'resnet152-imagenet'")])
def test_a_mistyped_workload_in_a_test_names_the_closest_built_in_ones(pytester, typed, near):
    """Said where the Workload is made, before anything starts; the name alone had said nothing of the nearest."""
    pytester.makepyfile(f'''
from pytest_gpucolloc import Workload
def test_x(collocate):
    collocate([Workload("{typed}", batch_size=128)] * 2)
''')
    result = pytester.runpytest("--colloc-device=cpu")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"E * unknown workload '{typed}': did you mean {near}? Known workloads "
                                 "(pytest_gpucolloc.known_workloads(), the README's Workloads): *"])


def test_full_tier_is_skipped_in_cpu_smoke_mode_with_the_reason(pytester):
    pytester.makepyfile('''
from pytest_gpucolloc import Workload
def test_big(collocate):
    collocate([Workload("resnet152", batch_size=128)] * 7)
''')
    result = pytester.runpytest("--colloc-device=cpu", "-rs", *FAST)
    result.assert_outcomes(skipped=1)  # one mode by default in CPU smoke mode: naive
    result.stdout.fnmatch_lines(["*CPU smoke mode*runs only the quick tier*--colloc-cpu-full*"])


def test_gpu_marked_tests_skip_with_the_reason_without_a_gpu(pytester):
    pytester.makepyfile('''
import pytest
@pytest.mark.gpucolloc_gpu
def test_needs_gpu():
    raise AssertionError("must not run")
''')
    result = pytester.runpytest("--colloc-device=cpu", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs an NVIDIA GPU: CPU smoke mode*"])


def test_worker_failure_fails_the_test_with_the_workers_error(pytester):
    pytester.makepyfile(tiny_workload='''
def factory(batch_size, device, precision="fp32"):
    raise MemoryError("injected: cannot build the model")
''')
    pytester.makepyfile('''
import pytest
from pytest_gpucolloc import Workload
@pytest.mark.gpucolloc_quick
def test_x(collocate):
    collocate([Workload("tiny_workload:factory")] * 2)
''')
    result = pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", *FAST)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*naive: worker w? failed: MemoryError: injected: cannot build the model*"])
    # said once: not again as the cause of the scenario's failure and of the test's
    # (counted in the test's failure report: a warnings summary the session may add is not the failure's text)
    report = result.stdout.str().split(" FAILURES ", 1)[1].split("\n=", 1)[0]
    lines = [line.strip() for line in report.splitlines()]
    assert lines.count("MemoryError: injected: cannot build the model") == 1, result.stdout.str()
    assert "The above exception was the direct cause" not in result.stdout.str()
    assert "Benchmark fixture was not used" not in result.stdout.str()  # the failure says why nothing was measured


def test_collocate_runs_one_scenario_per_test(pytester, suite):
    pytester.makepyfile(tiny_workload=TINY)
    pytester.makepyfile('''
import pytest
@pytest.mark.gpucolloc_quick
def test_twice(collocate):
    collocate(["tiny_workload:factory"])
    collocate(["tiny_workload:factory"])
''')
    result = pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", *FAST)
    result.stdout.fnmatch_lines(["*collocate can run one scenario per test*"])


def test_a_run_slowed_on_purpose_is_judged_and_in_the_history_but_no_later_runs_baseline(pytester, suite, capsys):
    """--colloc-extra-step-every checks that the gate catches a slowdown: its run stays in `history` (a level shift
    to find), but a later run is not judged against it, and there is nothing to accept."""
    suite(sleep=0.001)
    args = ["--gpu-mode=naive", "--colloc-device=cpu", "--benchmark-autosave", "--colloc-gate", "-k", "naive-1", *FAST]
    assert pytester.runpytest(*args).ret == 0
    slowed = pytester.runpytest(*args, "--colloc-extra-step-every=1")
    slowed.stdout.fnmatch_lines(["--colloc-extra-step-every=1: every job slowed on purpose to check the gate; a run "
                                 "saved is marked so: judged, and in `history`, but no later run's baseline"])
    assert "accept" not in slowed.stdout.str()
    storage = pytester.path / ".benchmarks"
    loaded = load(storage)
    assert len(loaded.runs) == 2 and loaded.runs[1].machine["slowed"] == 1, loaded
    capsys.readouterr()  # the in-process sessions' output
    code, out, err = run_cli(capsys, "gate", "--storage", storage, "--format", "json", "--min-runs", "1")
    assert all(row["baseline_runs"] == [loaded.runs[0].run_id] for row in json.loads(out)), out + err
    code, out, err = run_cli(capsys, "accept", "2", "--storage", storage)
    assert code == 2 and "slowed on purpose (--colloc-extra-step-every): it is never a baseline" in err, out + err
    first = loaded.runs[0].path  # a run saved after it (the first, an hour later, as the third): judged without it
    third = json.loads(first.read_text())
    third["datetime"] = (datetime.fromisoformat(third["datetime"]) + timedelta(hours=1)).isoformat()
    (first.parent / f"0003{first.name[4:]}").write_text(json.dumps(third))
    code, out, err = run_cli(capsys, "gate", "--storage", storage, "--format", "json", "--min-runs", "1")
    rows = json.loads(out)
    assert all(row["baseline_runs"] == [loaded.runs[0].run_id] for row in rows), out + err
    assert any("1 run(s) slowed on purpose (--colloc-extra-step-every) left out" in " ".join(row["notes"])
               for row in rows), out


def test_gate_fails_the_run_on_an_injected_slowdown(pytester, suite):
    gated = ["--gpu-mode=naive", "--colloc-device=cpu", "--benchmark-autosave", "--colloc-gate",
             "--colloc-rounds=5", "--colloc-round-seconds=0.2",
             "--colloc-warmup-seconds=0.1", "-p", "no:cacheprovider", "-k", "naive-1"]
    suite(sleep=0.004)
    first = pytester.runpytest(*gated)
    first.assert_outcomes(passed=1)
    first.stdout.fnmatch_lines(["*gpucolloc gate: 0 regressed of 1; 1 with no baseline yet*",
                                "a scenario with no baseline yet is saved to start its history, and passes",
                                "CPU smoke mode: its numbers check the suite, not a GPU",
                                "*test_tiny?cpu-naive-1?*no baseline*"])
    for _ in range(3):  # three runs make a baseline: a fourth, so that one left out as disturbed leaves three
        assert pytester.runpytest(*gated).ret == 0
    # the same scenario, its code genuinely (about ten times) slower: with three or four baseline runs the t bound is
    # wide, and one run disturbed by a busy CI machine must not hide the slowdown
    pytester.makepyfile(tiny_workload=TINY.replace("time.sleep(self.sleep)", "time.sleep(self.sleep * 10)"))
    slow = pytester.runpytest(*gated, "--colloc-gate-report=gate.md")
    assert slow.ret == pytest.ExitCode.TESTS_FAILED
    slow.stdout.fnmatch_lines(["*gpucolloc gate: 1 regressed of 1*",
                               "*test_tiny?cpu-naive-1?*regressed*slower, beyond the baseline's run-to-run spread*",
                               "*a regressed run stays out of later baselines until accepted*"
                               "`pytest-gpucolloc accept 0005` makes it the new level*"])
    assert "| regressed |" in (pytester.path / "gate.md").read_text().replace("  ", " ")
    assert "CPU smoke mode: its numbers check the suite, not a GPU" in (pytester.path / "gate.md").read_text()
    other = pytester.path / ".benchmarks" / "Another-machine" / "0006_elsewhere.json"  # another Python's folder
    other.parent.mkdir()
    other.write_text("{}")
    retry = pytester.runpytest(*gated)  # the slower code again: the regressed run saved above is no baseline
    assert retry.ret == pytest.ExitCode.TESTS_FAILED
    retry.stdout.fnmatch_lines(["*1 run(s) judged regressed left out until accepted (0005*",
                                "*`pytest-gpucolloc accept 0006_*` makes it the new level*"])  # 0006 names two runs


def test_a_gated_run_is_saved_without_autosave_so_the_next_one_has_history(pytester, suite):
    """A user's own project has no conftest that autosaves: --colloc-gate saves the run itself, says where, and the
    next gated run finds it."""
    suite()
    gated = ["--gpu-mode=naive", "--colloc-device=cpu", "--colloc-gate", "-k", "naive-1", *FAST]
    first = pytester.runpytest(*gated)
    first.assert_outcomes(passed=1)
    first.stdout.fnmatch_lines(["gpucolloc: --colloc-gate saves this run into .benchmarks as --benchmark-autosave "
                                "does*"])
    (saved,) = (pytester.path / ".benchmarks").rglob("0001_*.json")
    assert json.loads(saved.read_text())["benchmarks"][0]["name"] == "test_tiny[cpu-naive-1]"
    assert pytester.runpytest(*gated, "--benchmark-save=mine").ret == 0  # its own name, saved once
    assert len(list((pytester.path / ".benchmarks").rglob("*.json"))) == 2
    assert len(list((pytester.path / ".benchmarks").rglob("0002_mine.json"))) == 1
    assert pytester.runpytest(*gated, "--benchmark-disable").ret == 0  # records nothing: nothing saved
    assert len(list((pytester.path / ".benchmarks").rglob("*.json"))) == 2
    plain = pytester.runpytest(*[a for a in gated if a != "--colloc-gate"], "--benchmark-disable")
    assert "this run was not saved" not in plain.stdout.str()  # no advice to autosave what records nothing


def test_a_gate_that_judged_nothing_does_not_pass(pytester):
    """Every scenario skipped (here: it needs a GPU, as on a runner whose driver broke): the gated run says so in red
    and exits 5, not 0 with "0 regressed of 0"."""
    pytester.makepyfile(tiny_workload=TINY)
    pytester.makepyfile(test_gpu_only='''
import pytest
@pytest.mark.gpucolloc_gpu
def test_x(collocate):
    collocate(["tiny_workload:factory"])
''')
    result = pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", "--colloc-gate",
                                "--colloc-gate-report=gate.md", *FAST)
    result.assert_outcomes(skipped=1)
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    report = (pytester.path / "gate.md").read_text()  # a CI job summary: why, and no empty table
    assert "no scenario was judged against history: 1 skipped" in report and "|" not in report, report
    result.stdout.fnmatch_lines(["*gpucolloc gate: no scenario judged, exit code 5: the gate did not pass*",
                                 "no scenario was judged against history: 1 skipped",
                                 "  skipped test_x?cpu-naive?: needs an NVIDIA GPU*"])
    assert "0 regressed of 0" not in result.stdout.str()


def test_a_gate_where_no_scenario_ran_says_so_and_does_not_pass(pytester):
    """Every scenario deselected, or a project without one: the gated run says why in red and exits 5."""
    pytester.makepyfile(tiny_workload=TINY)
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    result = pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", "--colloc-gate", *FAST)
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines(["*gpucolloc gate: no scenario judged, exit code 5: the gate did not pass*",
                                 "no scenario was judged against history: no collocation scenario was measured "
                                 "(none collected, all deselected, or each failed first)"])


def test_gate_marker_threshold_must_be_a_percentage(pytester, suite):
    pytester.makepyfile(tiny_workload=TINY)
    pytester.makepyfile('''
import pytest
@pytest.mark.gpucolloc_quick
@pytest.mark.gpucolloc_gate(threshold=-5)
def test_x(collocate):
    collocate(["tiny_workload:factory"])
''')
    result = pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", "--colloc-gate", *FAST)
    result.stdout.fnmatch_lines(["*gpucolloc_gate(threshold=...) must be a percentage between 0 and 99, got -5*"])


def test_a_scenario_left_to_ab_is_measured_and_saved_but_not_judged(pytester, suite, capsys):
    """A launch-bound scenario whose runs differ by more than any useful threshold would be `inconclusive` forever
    under the history gate: gpucolloc_gate(by="ab") says so once, the gated run still measures and saves it (the
    history keeps its level), judges the others, and names it with the ab command that can judge it."""
    import json

    pytester.makepyfile(tiny_workload=TINY)
    pytester.makepyfile(test_pair='''
import pytest
@pytest.mark.gpucolloc_quick
def test_judged(collocate):
    collocate(["tiny_workload:factory"])
@pytest.mark.gpucolloc_quick
@pytest.mark.gpucolloc_gate(by="ab")
def test_noisy(collocate):
    collocate(["tiny_workload:factory"])
@pytest.mark.gpucolloc_quick
@pytest.mark.gpucolloc_gate(by="ab")
def test_broken(collocate):
    collocate(["tiny_workload:missing"])
''')
    gated = ["--gpu-mode=naive", "--colloc-device=cpu", "--colloc-gate", "--benchmark-autosave", "-p",
             "no:cacheprovider", "--colloc-gate-report=gate.md", *FAST]
    result = pytester.runpytest(*gated, "--benchmark-json=run.json")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*gpucolloc gate: 0 regressed of 1*",
                                 "left to paired A/B (gpucolloc_gate(by=\"ab\"))*: test_noisy?cpu-naive? (marked*",
                                 "  judge a change from the rootdir with `pytest-gpucolloc ab --baseline HEAD~1 "
                                 "--candidate HEAD -- test_pair.py::test_noisy --gpu-mode=naive`"])  # not the scenario that failed before it was measured
    saved = {b["name"]: b["extra_info"] for b in json.loads((pytester.path / "run.json").read_text())["benchmarks"]}
    assert "gate" in saved["test_judged[cpu-naive]"] and "gate" not in saved["test_noisy[cpu-naive]"]
    assert saved["test_noisy[cpu-naive]"]["gate_by"] == "ab" and "gate_by" not in saved["test_judged[cpu-naive]"]
    assert saved["test_noisy[cpu-naive]"]["aggregate_throughput"] > 0
    assert "test_noisy" in (pytester.path / "gate.md").read_text()
    # the gate command leaves it to A/B from the same files, as the pytest gate did
    capsys.readouterr()
    code, out, err = run_cli(capsys, "gate", pytester.path / "run.json", "--storage", pytester.path / ".benchmarks")
    assert code == 0 and "test_judged[cpu-naive]" in out and "test_noisy[cpu-naive]  " not in out, out + err
    assert "left to paired A/B (gpucolloc_gate(by=\"ab\")), measured and saved but not judged against history: " \
           "test_noisy[cpu-naive]" in out
    # an ungated run saves it as left to A/B too: no gate judges it, whichever run made it
    ungated = pytester.runpytest(*[a for a in gated if not a.startswith("--colloc-gate")], "-k", "noisy",
                                 "--benchmark-json=u.json")
    assert ungated.ret == 0
    capsys.readouterr()
    code, out, err = run_cli(capsys, "gate", pytester.path / "u.json", "--storage", pytester.path / ".benchmarks")
    assert code == 5 and "u.json: no scenario to judge: left to paired A/B" in err, out + err  # as pytest's gate


def test_gate_marker_by_names_who_judges(pytester, suite):
    pytester.makepyfile(tiny_workload=TINY)
    pytester.makepyfile('''
import pytest
@pytest.mark.gpucolloc_gate(by="nobody")
def test_x(collocate):
    collocate(["tiny_workload:factory"])
''')
    # an ungated run, and a test CPU smoke mode would skip (not of the quick tier): said all the same
    result = pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", *FAST)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*gpucolloc_gate(by=...) is 'history'*or 'ab'*got 'nobody'*"])


def test_unwritable_storage_is_refused_before_anything_runs(pytester, suite, tmp_path):
    suite()
    blocker = tmp_path / "a-file"
    blocker.write_text("a file where the storage folder would have to be")
    result = pytester.runpytest("--colloc-device=cpu", "--benchmark-autosave",
                                f"--benchmark-storage=file://{blocker}/history", *FAST)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--benchmark-storage*is not writable, so nothing measured could be saved*"])
    report = pytester.runpytest("--colloc-device=cpu", "--colloc-gate", f"--colloc-gate-report={blocker}/gate.md")
    assert report.ret == pytest.ExitCode.USAGE_ERROR


def test_a_gated_run_interrupted_before_any_verdict_says_so(pytester):
    """Ctrl-C after the first scenario was skipped and before any was judged: the gate says it was interrupted, not
    "no scenario judged, exit code 5: the gate did not pass" (the run exits 2, as pytest does when interrupted)."""
    pytester.makepyfile(tiny_workload=TINY)
    pytester.makepyfile('''
from pytest_gpucolloc import Workload
def test_a_full_tier(collocate):  # not quick: skipped in CPU smoke mode, saying why
    collocate([Workload("tiny_workload:factory")])
def test_b_interrupted():
    raise KeyboardInterrupt
''')
    result = pytester.runpytest_subprocess("--colloc-device=cpu", "--colloc-gate",
                                           f"--benchmark-storage=file://{pytester.path / 'runs'}", "-p", "no:randomly")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*gpucolloc gate: interrupted before any scenario was judged*"])
    assert "the gate did not pass" not in result.stdout.str()


def test_a_users_factory_called_with_other_options_starts_its_own_history(pytester, suite, capsys):
    """Options are part of what a user's job computes, as its batch size is: a run of other options is not judged
    against the old ones' runs (it was: a deeper model read as a regression of the shallower one)."""
    gated = ["--gpu-mode=naive", "--colloc-device=cpu", "--benchmark-autosave", "--colloc-gate", "-k", "naive-1",
             "--colloc-gate-min-runs=2", *FAST]
    suite(sleep=0.002)
    for _ in range(2):  # a baseline
        assert pytester.runpytest(*gated).ret == 0
    suite(sleep=0.02)  # ten times the sleep per step: judged against the runs above, a regression
    other = pytester.runpytest(*gated)
    assert other.ret == 0, other.stdout.str()
    other.stdout.fnmatch_lines(["*test_tiny?cpu-naive-1?*no baseline*"])
    capsys.readouterr()
    code, out, err = run_cli(capsys, "gate", "--storage", pytester.path / ".benchmarks", "--format", "json",
                             "--min-runs", "2")
    notes = " ".join(note for row in json.loads(out) for note in row["notes"])
    assert code == 0 and '2 run(s) of other jobs under this test id left out (tiny_workload:factory/bs4 {"sleep":0.002}; ' \
        'now tiny_workload:factory/bs4 {"sleep":0.02})' in notes, out + err
