"""Reliability, round two: what an independent fault probe broke, each checked from outside the code under test."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hostile
from processes import fork_servers
from pytest_gpucolloc import cli, protocol, record
from pytest_gpucolloc.device import standalone_target
from pytest_gpucolloc.history import load
from pytest_gpucolloc.modes.naive import NaiveMode
from pytest_gpucolloc.scenario import ScenarioFailed, Settings, run_scenario
from pytest_gpucolloc.workloads import Workload
from test_plugin import FAST, SCENARIOS, TINY

QUICK = Settings(rounds=2, round_s=0.2, warmup_s=0.2, warmup_steps=2, timeout_s=120)
ROOT = Path(__file__).resolve().parents[1]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def pids_in(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def tiny(**options) -> Workload:
    return Workload("tests.user_workloads:tiny", batch_size=4, options=options)


# --- processes a workload starts -------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("spawn", ["own-session", "plain"])
def test_processes_a_workload_starts_do_not_escape_the_scenario(tmp_path, spawn):
    pid_file = tmp_path / "children"
    with standalone_target("cpu") as target:
        run_scenario([tiny(spawn=spawn, pid_file=str(pid_file))] * 2, NaiveMode(), target, QUICK, tmp_path)
    children = pids_in(pid_file)
    assert len(children) == 2
    time.sleep(0.2)
    assert not any(alive(pid) for pid in children), "a child of a workload outlived its scenario"


@pytest.mark.slow
@pytest.mark.alone  # any other pytest session's sweep would kill the orphan before this test's next run
def test_orphans_of_a_killed_run_are_killed_by_the_next_run(pytester, tmp_path):
    # pytest and its fork server SIGKILLed together (kill -9 of both, the OOM killer): nothing of the plugin runs
    # to end the child in its own session (the server ends it when pytest alone is killed: test_reliability_four),
    # and it carries its worker's mark: the next run's sweep finds it.
    pid_file = tmp_path / "children"
    pytester.makepyfile(test_orphan=f'''
import pytest
from pytest_gpucolloc import Workload

@pytest.mark.gpucolloc_quick
def test_x(collocate):
    collocate([Workload("tests.user_workloads:tiny", batch_size=4,
                        options={{"spawn": "own-session", "pid_file": "{pid_file}", "step_sleep": 0.01}})])
''')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--colloc-device=cpu",
                            "--gpu-mode=naive", "--colloc-round-seconds=30", "test_orphan.py"],
                           cwd=pytester.path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not pids_in(pid_file) and time.monotonic() < deadline:
        time.sleep(0.2)
    children = pids_in(pid_file)
    assert children, "the workload never started its child"
    for pid in [run.pid, *fork_servers(run.pid)]:  # SIGKILL: no cleanup of any kind runs; the workers die with
        os.kill(pid, signal.SIGKILL)              # their server, the child does not
    run.wait()
    time.sleep(1)
    assert alive(children[0]), "the orphan should still be there before the next run"
    nxt = pytester.runpytest_subprocess("--colloc-device=cpu", "--co")
    nxt.stdout.fnmatch_lines([f"*gpucolloc: killed * processes that workers of killed runs had started: pids*{children[0]}*"])
    assert not alive(children[0])


@pytest.mark.slow
def test_a_child_holding_the_message_pipe_does_not_hide_its_workers_exit(tmp_path):
    pid_file = tmp_path / "children"
    job = tiny(spawn="inherit-fds", pid_file=str(pid_file), fail_after=3, failure="exit")
    begin = time.monotonic()
    with standalone_target("cpu") as target, pytest.raises(ScenarioFailed, match="worker w0 failed: exited with code 3"):
        run_scenario([job], NaiveMode(), target, QUICK, tmp_path)
    assert time.monotonic() - begin < 60  # not after the 120 s timeout
    assert not any(alive(pid) for pid in pids_in(pid_file))


# --- what a workload reports or prints ------------------------------------------------------------------

@pytest.mark.slow
def test_a_flood_of_output_gives_a_bounded_failure_message(tmp_path):
    with standalone_target("cpu") as target, pytest.raises(ScenarioFailed) as failure:
        run_scenario([tiny(fail_after=1, failure="flood")], NaiveMode(), target, QUICK, tmp_path)
    message = str(failure.value)
    assert "failed after printing 50 MB" in message and len(message) < 20_000
    assert "x" * 400 + "... (" in message  # the flood itself, cut


@pytest.mark.slow
def test_zero_samples_per_step_fails_its_scenario_and_the_others_are_saved(pytester):
    pytester.makepyfile(tiny_workload=TINY, test_zero='''
import pytest
from pytest_gpucolloc import Workload

pytestmark = pytest.mark.gpucolloc_quick

def test_good(collocate):
    collocate([Workload("tiny_workload:factory", batch_size=4)])

def test_zero(collocate):
    collocate([Workload("tests.user_workloads:no_samples", batch_size=4)])
''')
    result = pytester.runpytest_subprocess("--gpu-mode=sequential,naive", "--colloc-device=cpu",
                                           "--benchmark-autosave", "--benchmark-storage=file://history", *FAST)
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["*samples_per_step must be a positive whole number of at most 4,294,967,296, got 0*"])
    saved = list((pytester.path / "history").rglob("*.json"))
    assert len(saved) == 1
    assert len(json.loads(saved[0].read_text())["benchmarks"]) == 2  # the good scenario under both modes


# --- the benchmark storage ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_corrupt_or_hostile_history_is_named_skipped_and_the_gated_run_still_saved(pytester):
    pytester.makepyfile(tiny_workload=TINY)
    pytester.makepyfile(test_scenarios=SCENARIOS.format(sleep=0.001))
    args = ["--gpu-mode=naive", "--colloc-device=cpu", "--benchmark-autosave", "--benchmark-storage=file://history",
            "--colloc-gate", "-k", "naive-1", *FAST]
    assert pytester.runpytest_subprocess(*args).ret == 0
    first = next((pytester.path / "history").rglob("0001_*.json"))
    storage = first.parent
    good = json.loads(first.read_text())
    zeros = json.loads(json.dumps(good))
    zeros["benchmarks"][0]["extra_info"]["aggregate_round_throughputs"] = [0, 0, 0]
    (storage / "0002_zeros.json").write_text(json.dumps(zeros))
    words = json.loads(json.dumps(good))
    words["benchmarks"][0]["extra_info"]["aggregate_round_throughputs"] = ["fast", "slow"]
    (storage / "0003_words.json").write_text(json.dumps(words))
    (storage / "0004_odd.json").write_text(json.dumps({"benchmarks": [], "commit_info": "x"}))
    (storage / "0005_dir.json").mkdir()
    os.mkfifo(storage / "0006_fifo.json")
    (storage / "0007_binary.json").write_bytes(os.urandom(4096))
    hostile_files, base = [], json.loads(json.dumps(good))
    base["benchmarks"][0]["extra_info"]["gpu"] = {"name": "another GPU"}  # what is read is never a baseline here
    variants = hostile.variants(base)
    for number, name in enumerate(hostile.one_of_each(variants), 8):  # each class once (all: research/fault-suite)
        text = variants[name]
        hostile_files.append(storage / f"{number:04d}_{name}.json")
        hostile_files[-1].write_text(text)
    result = pytester.runpytest_subprocess(*args, timeout=240)
    assert result.ret == 0 and "Traceback" not in result.stdout.str() + result.stderr.str()
    for name in ("0002_zeros", "0003_words", "0005_dir", "0006_fifo", "0007_binary"):
        result.stdout.fnmatch_lines([f"*history: *{name}.json*skipped*"])
    read = {run.run_id for run in load(storage).runs}
    refused = [path for path in hostile_files if path.stem not in read]
    assert len(refused) == len(hostile_files)
    issue = {"issue-gpu-uuid-number", "issue-repeats-mixed", "issue-round-throughputs-not-a-list",
             "nested-100000-in-record", "nested-100000-file"}
    assert issue <= {path.stem.split("_", 1)[1] for path in refused}
    shown = result.stdout.str()
    assert [path.name for path in refused if path.name not in shown] == []  # each named as skipped
    saved = sorted(storage.glob("*.json"))[-1]  # this run, measured and saved after them all
    assert saved.stem.startswith(f"{len(hostile_files) + 8:04d}_")
    assert json.loads(saved.read_text())["benchmarks"][0]["extra_info"]["gate"]["verdict"]


# --- options and commands ------------------------------------------------------------------------------

def test_a_gate_report_folder_is_created_and_an_unwritable_report_fails_the_run(pytester):
    pytester.makepyfile(tiny_workload=TINY)
    pytester.makepyfile(test_scenarios=SCENARIOS.format(sleep=0.001))
    args = ["--gpu-mode=naive", "--colloc-device=cpu", "--colloc-gate", "-k", "naive-1", *FAST]
    assert pytester.runpytest(*args, "--colloc-gate-report=reports/gate.md").ret == 0
    assert "### Collocation regression gate" in (pytester.path / "reports" / "gate.md").read_text()
    (pytester.path / "a-folder").mkdir()
    blocked = pytester.runpytest(*args, "--colloc-gate-report=a-folder")  # said before anything is measured
    assert blocked.ret == pytest.ExitCode.USAGE_ERROR and "gpucolloc [1/1]" not in blocked.stdout.str()
    blocked.stderr.fnmatch_lines(["*--colloc-gate-report=a-folder is a folder: name the report's file*"])
    ungated = pytester.runpytest(*[a for a in args if a != "--colloc-gate"], "--colloc-gate-report=reports/gate.md")
    assert ungated.ret == pytest.ExitCode.USAGE_ERROR  # no verdicts to write: the report of the run before stays
    ungated.stderr.fnmatch_lines(["*--colloc-gate-report=reports/gate.md writes the gate's verdicts: add --colloc-gate*"])
    saved = pytester.path / "history" / "Linux" / "0001_run.json"  # a saved run, named as the JSON dump by mistake
    saved.parent.mkdir(parents=True)
    saved.write_text('{"benchmarks": []}')
    dump = pytester.runpytest(*args, "--benchmark-storage=file://history", f"--benchmark-json={saved}")
    assert dump.ret == pytest.ExitCode.USAGE_ERROR and saved.read_text() == '{"benchmarks": []}'
    dump.stderr.fnmatch_lines(["*is a saved run of --benchmark-storage: writing there would overwrite it*"])
    never = pytester.runpytest(*args, "--colloc-gate-runs=2")  # below --colloc-gate-min-runs (3): never judged
    assert never.ret == pytest.ExitCode.USAGE_ERROR
    never.stderr.fnmatch_lines(["*--colloc-gate-runs (2) must be at least --colloc-gate-min-runs (3)*"])


@pytest.mark.parametrize("argv,message", [
    (["--threshold", "nan"], "--threshold must be between 0 and 99"),
    (["--threshold", "100"], "--threshold must be between 0 and 99"),
    (["--alpha", "0"], "--alpha must be between"),
    (["--runs", "1"], "--runs must be between 2 and 1000"),
    (["--min-runs", "x"], "--min-runs must be an integer"),
    (["--runs", "2"], "--runs (2) must be at least --min-runs (3): with fewer the gate could never judge"),
])
def test_the_cli_rejects_bad_gate_options_before_reading_anything(argv, message, capsys, tmp_path):
    assert cli.main(["gate", str(tmp_path / "run.json"), *argv]) == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("content", [None, b'{"benchmarks": [', b"\x00\xff binary", b'{"hello": 1}', b"[]"])
def test_the_cli_table_names_a_file_it_cannot_use_in_one_line(content, capsys, tmp_path):
    path = tmp_path / "run.json"
    if content is not None:
        path.write_bytes(content)
    assert cli.main(["table", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err


def test_cpu_cores_this_machine_lacks_are_a_usage_error(pytester):
    result = pytester.runpytest("--colloc-cpus=4000;4001", "--colloc-device=cpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--colloc-cpus names cores ?4000, 4001? that this process may not use*"])


def test_a_record_never_reaches_the_gate_with_impossible_numbers():
    with pytest.raises(record.RecordError):
        record.read({"gpucolloc": 2, "mode": "naive", "workloads": ["x"], "workers": [{"workload": "x",
                     "throughput": 1.0}], "aggregate_round_throughputs": [float("nan")]})
    assert load(Path("/nonexistent-storage")).runs == []


def hostile_storage(folder: Path, every: bool = False) -> tuple[list[Path], list[Path]]:
    """A storage of one good run and hostile variants of it, one of each class or ``every`` one: (all files,
    those a reader refuses)."""
    from test_record import measured

    info = json.loads(json.dumps(record.write(measured(), {"verdict": "unchanged"})))
    good = {"datetime": "2026-12-01T00:00:00", "commit_info": {"id": "abc"},
            "machine_info": {"gpucolloc": {"device": "cuda", "gpu_name": "H200"}},
            "benchmarks": [{"name": "t[mps-partitioned]", "fullname": "f.py::t[mps-partitioned]", "extra_info": info}]}
    folder.mkdir(parents=True)
    files = [folder / "0001_good.json"]
    files[0].write_text(json.dumps(good))
    variants = hostile.variants(good)
    for number, name in enumerate(variants if every else hostile.one_of_each(variants), 2):
        files.append(folder / f"{number:04d}_{name}.json")
        files[-1].write_text(variants[name])
    read = {run.path for run in load(folder).runs}
    return files, [path for path in files if path not in read]


def test_every_command_names_and_skips_hostile_records_without_a_traceback(tmp_path, capsys):
    storage = tmp_path / "history"
    files, refused = hostile_storage(storage)
    assert len(refused) == len(files) - 1 and files[0] not in refused
    out = tmp_path / "out"
    for argv in (["history", "--storage", str(storage)], ["gate", str(files[0]), "--storage", str(storage)],
                 ["compare", "--runs-ids", "0001", "0002", "--storage", str(storage)],
                 ["plot", "--storage", str(storage), "--out", str(out / "plots")],
                 ["report", "--storage", str(storage), "--out", str(out / "report")]):
        code = cli.main(argv)  # any exception fails this test: a traceback
        said = capsys.readouterr()
        assert isinstance(code, int), argv
        assert [p.name for p in refused if p.name not in said.err + said.out] == [], argv
    for path in files:  # the commands given files
        for argv in (["table", str(path)], ["advise", str(path), "--jobs", "resnet26-cifar10/bs32"]):
            code = cli.main(argv)
            said = capsys.readouterr()
            assert isinstance(code, int) and (path not in refused or path.name in said.err), argv


@pytest.mark.parametrize("samples", [10**30, 2**32 + 1, 2**70])
def test_an_absurd_samples_per_step_is_refused_with_its_bound(samples):
    line = json.dumps({"event": "ready", "pid": 1, "samples_per_step": samples, "warmup_steps": 1, "cpus": [],
                       "startup_phases_s": {}}).encode()
    with pytest.raises(protocol.ProtocolError, match="samples_per_step must be a whole number from 1 to 4,294,967,296"):
        protocol.decode_event(line)
    assert protocol.decode_event(line.replace(str(samples).encode(), str(2**32).encode())).samples_per_step == 2**32


def test_careless_collocate_calls_fail_the_test_with_a_clear_error_before_any_worker(pytester):
    pytester.makepyfile(test_careless='''
import pytest
from pytest_gpucolloc import Workload

pytestmark = pytest.mark.gpucolloc_quick

def test_a_name(collocate):
    collocate("resnet26-cifar10")

def test_one_workload(collocate):
    collocate(Workload("tests.user_workloads:tiny", batch_size=4, options={"sizes": [1, 2]}))

def test_an_object_option(collocate):
    collocate([Workload("tests.user_workloads:tiny", batch_size=4, options={"x": object()})])
''')
    result = pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(["*collocate() takes a list of workloads; got the string 'resnet26-cifar10'*",
                                 "*collocate() takes a list of workloads; got one Workload*",
                                 "*option 'x' must be a JSON value*found object*"])
    assert "TypeError" not in result.stdout.str()
