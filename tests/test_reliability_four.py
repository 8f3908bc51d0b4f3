"""Reliability, round four: what an independent fault probe broke, each checked from outside the code under test."""
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_gpucolloc import cli, record, record_checks
from pytest_gpucolloc.device import standalone_target
from pytest_gpucolloc.modes.naive import NaiveMode
from pytest_gpucolloc.scenario import Settings, run_scenario
from pytest_gpucolloc.workloads import Workload
from test_cli import run_cli, save_runs
from test_gate_serving import write_run
from test_plugin import FAST, SCENARIOS, TINY

# --- extreme latencies in a saved serving run -------------------------------------------------------------


def with_latency(path: Path, round_p99: list[float], field: str = "round_p99_ms") -> Path:
    """The saved run with its serving job's ``round_p99`` (or ``field`` set to its first), as given."""
    data = json.loads(path.read_text())
    data["benchmarks"][0]["extra_info"]["serving"][field] = round_p99 if field == "round_p99_ms" else round_p99[0]
    path.write_text(json.dumps(data))
    return path


def serving_history(root: Path, round_p99: list[float], field: str = "round_p99_ms") -> Path:
    """Six steady runs at 10 ms and a seventh to gate; run 3 carries ``round_p99`` (or ``field`` set to its first)."""
    for number in range(1, 7):
        write_run(root, number, 10.0)
    with_latency(root / "0003_run.json", round_p99, field)
    return write_run(root, 7, 10.0)


@pytest.mark.parametrize("field", ["round_p99_ms", "p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms", "alone_p99_ms"])
@pytest.mark.parametrize("value", [5e-324, 1e-300, 1e-9, 1e308, 1e12])
def test_a_saved_run_with_an_impossible_latency_is_named_and_the_gate_still_decides(tmp_path, capsys, field, value):
    current = serving_history(tmp_path, [value] * 6, field)
    code = cli.main(["gate", str(current), "--storage", str(tmp_path)])
    said = capsys.readouterr()
    assert code == 0, said.out + said.err
    assert f"0003_run.json: scenario benchmarks/test_serving.py::test_service_beside_training[mps-rate80] skipped " \
           f"({'an item of ' if field == 'round_p99_ms' else ''}serving.{field} must be a latency" in said.err


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.floats(*record_checks.LATENCY_MS), min_size=1, max_size=6), st.floats(*record_checks.LATENCY_MS))
def test_the_gate_decides_over_any_latency_the_reader_lets_through(tmp_path_factory, rounds, current_p99):
    root = tmp_path_factory.mktemp("history")
    current = with_latency(serving_history(root, rounds), [current_p99] * 6)
    record.read(json.loads(current.read_text())["benchmarks"][0]["extra_info"])  # the reader lets it through
    assert cli.main(["gate", str(current), "--storage", str(root), "--format", "json"]) in (0, 1)


# --- stdout that cannot be written -------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


@pytest.mark.parametrize("argv", [["check"], ["table", str(DATA / "default-run.json")],
                                  ["history", "--storage", str(DATA / "aa-history")]])
@pytest.mark.parametrize("stdout", ["/dev/full", "closed"])
def test_a_command_whose_stdout_cannot_be_written_exits_4_in_one_line(argv, stdout):
    redirect = ">/dev/full" if stdout == "/dev/full" else ">&-"
    done = subprocess.run(["bash", "-c", f'exec "$@" {redirect}', "-", sys.executable, "-m", "pytest_gpucolloc.cli",
                           *argv], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 4, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.strip().startswith("error: cannot write the output")


# --- a storage or report under a read-only pseudo file system ------------------------------------------------

@pytest.mark.parametrize("option", ["--benchmark-storage=file:///proc/gpucolloc-history",
                                    "--colloc-gate-report=/proc/gpucolloc-gate.md"])
def test_a_storage_or_report_where_no_file_can_be_created_is_a_usage_error_before_anything_runs(pytester, option):
    """As root, /proc passes every permission check: a file created (and removed) there is what tells."""
    pytester.makepyfile(tiny_workload=TINY)
    pytester.makepyfile(test_scenarios=SCENARIOS.format(sleep=0.001))
    done = pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", "--colloc-gate", "--benchmark-autosave",
                              "-k", "naive-1", *FAST, option)
    assert done.ret == pytest.ExitCode.USAGE_ERROR
    done.stderr.fnmatch_lines(["*/proc* is not writable, so nothing measured could be saved*"])
    assert not list(Path("/tmp").glob(f"gc-*/{pytester.path.name}*"))


def test_an_output_folder_where_no_file_can_be_created_exits_4(capsys):
    assert cli.main(["plot", "--storage", str(DATA / "aa-history"), "--out", "/proc"]) == 4
    assert "cannot write into /proc" in capsys.readouterr().err


# --- what a workload starts, out of its session, without descriptors or environment ---------------------------

QUICK = Settings(rounds=2, round_s=0.2, warmup_s=0.2, warmup_steps=2, timeout_s=120)
HOW = ["exec", "popen", "daemon"]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def escapees(pid_file: Path, expected: int) -> list[int]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids = [int(x) for x in pid_file.read_text().split()] if pid_file.exists() else []
        if len(pids) >= expected:
            return pids
        time.sleep(0.05)
    raise AssertionError(f"the workload started {pids} of {expected} children")


def escape(how: str, pid_file: Path, **options) -> Workload:
    return Workload("tests.user_workloads:escapes", batch_size=4, options={"how": how, "pid_file": str(pid_file),
                                                                           **options})


@pytest.mark.slow
@pytest.mark.parametrize("spawn", ["forkserver", "fresh"])
def test_no_child_a_workload_hides_outlives_its_scenario(tmp_path, spawn):
    """Each of the three escapes is a real process that carries no mark: another session, no descriptor, an empty
    (or, forked without exec, the server's) environment."""
    pid_files = [tmp_path / f"{how}-children" for how in HOW]
    jobs = [escape(how, pid_file) for how, pid_file in zip(HOW, pid_files)]
    with standalone_target("cpu") as target:
        run_scenario(jobs, NaiveMode(), target, dataclasses.replace(QUICK, spawn=spawn), tmp_path)
    children = [pid for pid_file in pid_files for pid in escapees(pid_file, 1)]
    assert len(children) == 3
    assert [pid for pid in children if alive(pid)] == [], "a workload's child outlived its scenario"


@pytest.mark.slow
@pytest.mark.parametrize("spawn", ["forkserver", "fresh"])
def test_no_child_a_workload_hides_outlives_a_pytest_killed_outright(pytester, tmp_path, spawn):
    """pytest SIGKILLed mid-scenario: the fork server, their keeper, ends them within seconds, no next run needed."""
    pid_file = tmp_path / "children"
    pytester.makepyfile(test_escapes=f'''
import pytest
from pytest_gpucolloc import Workload

@pytest.mark.gpucolloc_quick
def test_x(collocate):
    collocate([Workload("tests.user_workloads:escapes", batch_size=4,
                        options={{"how": {HOW!r}, "pid_file": "{pid_file}", "step_sleep": 0.01}})] * 2)
''')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--colloc-device=cpu",
                            "--gpu-mode=naive", "--colloc-round-seconds=30", f"--colloc-spawn={spawn}",
                            "test_escapes.py"],
                           cwd=pytester.path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        children = escapees(pid_file, 3)  # the job alone (the first phase) has started all three
        time.sleep(0.5)
        assert all(alive(pid) for pid in children)
    finally:
        run.kill()
        run.wait()
    deadline = time.monotonic() + 15
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in children if alive(pid)] == [], "a workload's child outlived the pytest that ran it"


# --- ab interrupted while its arms start, or killed outright ------------------------------------------------

STUCK = """import os, signal
signal.signal(signal.SIGINT, signal.SIG_IGN)  # an arm that cannot act on Ctrl-C (stuck)
if "ARMS_STARTED" in os.environ:
    open(os.path.join(os.environ["ARMS_STARTED"], str(os.getpid())), "w").close()
"""


@pytest.fixture
def ab_repo(tmp_path):
    """test_ab's project (two revisions of a scenario) whose pytest sessions ignore SIGINT."""
    from test_ab import SCENARIO, WORKLOAD, git

    path = tmp_path / "project"
    path.mkdir()
    for args in (["init", "-q"], ["config", "user.email", "ab@example.invalid"], ["config", "user.name", "ab"]):
        git(path, *args)
    (path / "workload.py").write_text(WORKLOAD)
    (path / "conftest.py").write_text(STUCK)
    (path / "test_scenario.py").write_text(SCENARIO.format(sleep=0.002))
    git(path, "add", ".")
    git(path, "commit", "-qm", "fast")
    (path / "test_scenario.py").write_text(SCENARIO.format(sleep=0.006))
    git(path, "commit", "-qam", "slow")
    return path


def start_ab(repo: Path, tmp_path: Path) -> subprocess.Popen:
    """``pytest-gpucolloc ab`` of the two revisions, once both arms' worktrees exist and their sessions start."""
    from test_ab import ARGS, git

    command = [sys.executable, "-m", "pytest_gpucolloc.cli", "ab", "--baseline", "HEAD~1", "--candidate", "HEAD",
               "--out", str(tmp_path / "arms"), *ARGS]
    started = tmp_path / "started"
    started.mkdir()
    controller = subprocess.Popen(command, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env=dict(os.environ, PYTHONPATH=str(ROOT), ARMS_STARTED=str(started)))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(started.iterdir())) < 2:
        time.sleep(0.1)
    assert git(repo, "worktree", "list").count("\n") == 2, "the arms' worktrees never appeared"
    assert len(list(started.iterdir())) == 2, "the arms' sessions never started"
    return controller


def ab_left(repo: Path, tmp_path: Path, controller: int) -> dict[str, list]:
    from test_ab import git

    arms = subprocess.run(["pgrep", "-f", str(tmp_path / "arms")], capture_output=True, text=True).stdout.split()
    owners = {str(controller), *(p.name for p in (tmp_path / "started").iterdir())}  # ab's, and its arms'
    folders = [str(p) for p in Path("/tmp").glob("gc-*") if (p / "owner.pid").is_file()
               and (p / "owner.pid").read_text().strip() in owners]
    worktrees = git(repo, "worktree", "list", "--porcelain").count("worktree ") - 1
    return {"arms": arms, "folders": folders, "worktrees": [worktrees] if worktrees else [],
            "registered": list((repo / ".git" / "worktrees").glob("*"))}


@pytest.mark.slow
def test_sigterm_to_ab_while_its_arms_start_acts_within_seconds(ab_repo, tmp_path):
    controller = start_ab(ab_repo, tmp_path)
    began = time.monotonic()
    controller.send_signal(signal.SIGTERM)
    out, _ = controller.communicate(timeout=180)
    took = time.monotonic() - began
    assert controller.returncode == 130, out
    assert took < 20, f"ab took {took:.0f} s to act on SIGTERM"
    assert ab_left(ab_repo, tmp_path, controller.pid) == {"arms": [], "folders": [], "worktrees": [],
                                                          "registered": []}


@pytest.mark.slow
@pytest.mark.alone  # any other pytest session's sweep would remove what the killed ab left before it is looked at
def test_what_a_killed_ab_left_is_removed_by_the_next_run(ab_repo, tmp_path):
    """SIGKILL (a CI cancel whose grace ran out; a SIGTERM first may let ab clean up before it, leaving nothing to
    test): the arms are told by the kernel (their parent-death signal); the next run of the plugin removes the
    worktrees (and their registration) and the socket folder."""
    controller = start_ab(ab_repo, tmp_path)
    controller.kill()
    controller.communicate()
    left = ab_left(ab_repo, tmp_path, controller.pid)
    assert left["folders"] and left["registered"], left  # what the killed ab left
    nxt = subprocess.run([sys.executable, "-m", "pytest", "--colloc-device=cpu", "--co", "-q", "-p", "no:cacheprovider",
                          "test_scenario.py"], cwd=ab_repo, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert nxt.returncode == 0, nxt.stdout + nxt.stderr
    deadline = time.monotonic() + 30  # the arms unwind on their own meanwhile
    while ab_left(ab_repo, tmp_path, controller.pid)["arms"] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ab_left(ab_repo, tmp_path, controller.pid) == {"arms": [], "folders": [], "worktrees": [],
                                                          "registered": []}


# --- the storage's latest run: the file saved last -------------------------------------------------------------

def with_datetime(path: Path, when: str) -> Path:
    data = json.loads(path.read_text())
    data["datetime"] = when
    path.write_text(json.dumps(data))
    return path


def test_the_gate_judges_the_run_saved_last_against_those_saved_before_it_whatever_its_clock_said(tmp_path, capsys):
    """A machine whose clock went back: the run it saved last records the oldest datetime."""
    ids = save_runs(tmp_path, [1000.0] * 4 + [900.0])
    folder = tmp_path / "Linux-CPython-3.12-64bit"
    with_datetime(folder / f"{ids[4]}.json", "2026-11-19T00:00:00")
    code, out, _ = run_cli(capsys, "gate", ids[3], "--storage", tmp_path, "--format", "json")
    assert ids[4] not in out  # a run saved after it is no part of its baseline, not even one left out as disturbed
    code, out, err = run_cli(capsys, "gate", "--storage", tmp_path, "--format", "json")
    assert code == cli.NEGATIVE, out + err  # the run saved last, 10% slower
    assert {row["verdict"] for row in json.loads(out)} == {"regressed"}
    assert {tuple(row["baseline_runs"]) for row in json.loads(out)} == {tuple(ids[:4])}
    # another machine folder: folders count apart, the one whose last run records the later datetime holds the
    # latest (a copy of a storage gives every file the copy's time: written earlier, a run is still the latest)
    other = tmp_path / "Linux-CPython-3.13-64bit"
    other.mkdir()
    newer = with_datetime(Path(shutil.copy(folder / f"{ids[0]}.json", other / "0001_other.json")), "2026-11-21T00:00")
    os.utime(newer, ns=(1, 1))
    assert run_cli(capsys, "gate", "--storage", tmp_path)[1].startswith("gate: 0001_other")
    with_datetime(newer, "2026-11-18T00:00")
    assert run_cli(capsys, "gate", "--storage", tmp_path)[1].startswith(f"gate: {ids[4]}")
    newer.unlink()
    # renamed by hand: no number, its datetime places it (after the four runs at 1000/s, before the slower one)
    renamed = with_datetime(Path(shutil.copy(folder / f"{ids[4]}.json", folder / "candidate.json")), "2026-11-20T03:30")
    code, out, err = run_cli(capsys, "gate", renamed, "--storage", tmp_path, "--format", "json")
    assert code == cli.NEGATIVE and {tuple(row["baseline_runs"]) for row in json.loads(out)} == {tuple(ids[:4])}, \
        out + err
    renamed.unlink()
    # a run set aside is never the latest
    assert run_cli(capsys, "forget", ids[4], "--storage", tmp_path)[0] == cli.OK
    assert run_cli(capsys, "gate", "--storage", tmp_path)[1].startswith(f"gate: {ids[3]}")


@pytest.mark.parametrize("benchmarks", [[], [{"name": "test_plain", "fullname": "test_b.py::test_plain",
                                              "extra_info": {}, "stats": {"mean": 0.001}}]],
                         ids=["none", "another-benchmark"])
def test_a_run_saved_last_without_scenarios_fails_the_gate_instead_of_an_older_run_passing(tmp_path, capsys,
                                                                                          benchmarks):
    """The collocation tests deselected or skipped: the run pytest saved holds other benchmarks, or none."""
    ids = save_runs(tmp_path, [1000.0] * 4)
    path = tmp_path / "Linux-CPython-3.12-64bit" / "0005_run.json"
    data = json.loads(path.with_name(f"{ids[3]}.json").read_text())
    path.write_text(json.dumps({**data, "benchmarks": benchmarks, "datetime": "2026-11-20T05:00:00"}))
    for argv in (["gate"], ["gate", tmp_path], ["table"], ["advise", "--jobs", "resnet26*2"]):
        code, out, err = run_cli(capsys, *argv, "--storage", tmp_path)
        assert code == cli.NOTHING_TO_READ and out == "", out + err
        assert f"error: {path}, the latest run saved under {tmp_path}, holds no pytest-gpucolloc scenarios (none of " \
               "its collocation tests ran" in err and "--benchmark-autosave" in err, err
    assert run_cli(capsys, "gate", "0004", "--storage", tmp_path)[0] == cli.OK  # named, an earlier run is read


def test_a_run_saved_last_that_cannot_be_read_fails_the_gate_instead_of_an_older_run_passing(tmp_path, capsys):
    """A run cut short as it was written: the gate says so rather than judging the run saved before it."""
    ids = save_runs(tmp_path, [1000.0] * 4)
    folder = tmp_path / "Linux-CPython-3.12-64bit"
    path = folder / "0005_run.json"
    path.write_text((folder / f"{ids[3]}.json").read_text()[:200])
    code, out, err = run_cli(capsys, "gate", "--storage", tmp_path)
    assert code == cli.NOTHING_TO_READ and out == "", out + err
    assert f"error: {path}, the latest run saved under {tmp_path}, could not be read (above)" in err, err
    assert run_cli(capsys, "gate", "0004", "--storage", tmp_path)[0] == cli.OK  # named, an earlier run is read
    path.rename(tmp_path / "0005_run.json.broken")  # moved aside as the message says: the run before is the latest
    assert run_cli(capsys, "gate", "--storage", tmp_path)[1].startswith(f"gate: {ids[3]}")


def test_the_baseline_is_in_the_order_the_runs_were_saved_whatever_their_clock_said(tmp_path, capsys):
    """Four runs at 1,000/s, then four saved by a machine whose clock was two days behind at 1,030/s: the gate judges
    a run at 1,000/s against the four just before it (the newer level), and `history` puts the shift at run 5."""
    ids = save_runs(tmp_path, [1000.0] * 4 + [1030.0] * 4 + [1000.0])
    folder = tmp_path / "Linux-CPython-3.12-64bit"
    for i, run_id in enumerate(ids[4:8]):
        with_datetime(folder / f"{run_id}.json", f"2026-11-18T0{i}:00:00")
    code, out, err = run_cli(capsys, "gate", "--storage", tmp_path, "--format", "json", "--runs", "4")
    rows = json.loads(out)
    assert {tuple(row["baseline_runs"]) for row in rows} == {tuple(ids[4:8])}, out + err
    assert code == cli.NEGATIVE and {row["verdict"] for row in rows} == {"regressed"}, out + err


def test_a_regressed_file_outside_the_storage_gets_no_hint_to_accept_a_run_of_the_storage(tmp_path, capsys):
    """`accept` takes the storage's runs: `accept 0005` would have accepted the storage's own 0005, not the file."""
    ids = save_runs(tmp_path / "storage", [1000.0] * 5 + [900.0])
    outside = Path(shutil.move(tmp_path / "storage" / "Linux-CPython-3.12-64bit" / f"{ids[5]}.json",
                               tmp_path / f"{ids[4]}.json"))  # outside, and named as the storage's 0005
    code, out, err = run_cli(capsys, "gate", outside, "--storage", tmp_path / "storage")
    assert code == cli.NEGATIVE and "regressed" in out, out + err
    assert "accept" not in out + err, out + err


def test_a_run_whose_name_holds_a_tab_is_refused_by_forget_and_the_list_kept_whole(tmp_path, capsys):
    ids = save_runs(tmp_path, [1000.0] * 3)
    folder = tmp_path / "Linux-CPython-3.12-64bit"
    (folder / f"{ids[2]}.json").rename(folder / "0003_night\tly.json")
    assert run_cli(capsys, "forget", "1", "--storage", tmp_path)[0] == cli.OK
    code, out, err = run_cli(capsys, "forget", "3", "--storage", tmp_path)
    assert code == cli.USAGE and "a tab or line break in its name cannot be kept" in err, out + err
    code, out, _ = run_cli(capsys, "forget", "--list", "--storage", tmp_path, "--format", "json")
    assert [row["run"] for row in json.loads(out)] == [f"Linux-CPython-3.12-64bit/{ids[0]}.json"], out


def test_a_run_of_another_machine_folder_with_the_same_id_stays_in_the_baseline(tmp_path, capsys):
    """Runs saved with one --benchmark-save name on two machines share ids: gating one leaves the other's in."""
    ids = save_runs(tmp_path, [1000.0] * 3)
    other = tmp_path / "Linux-CPython-3.13-64bit"
    shutil.copytree(tmp_path / "Linux-CPython-3.12-64bit", other)
    for run_id in ids:  # the second machine ran a day later
        data = json.loads((other / f"{run_id}.json").read_text())
        with_datetime(other / f"{run_id}.json", data["datetime"].replace("2026-11-20", "2026-11-21"))
    code, out, err = run_cli(capsys, "gate", other / f"{ids[2]}.json", "--storage", tmp_path, "--format", "json",
                             "--min-runs", "3")
    assert {tuple(row["baseline_runs"]) for row in json.loads(out)} == {(*ids, *ids[:2])}, out + err


def test_another_projects_benchmarks_or_an_unreadable_file_of_another_folder_do_not_stop_the_gate(tmp_path, capsys):
    """A storage shared with plain pytest-benchmark runs (no machine info of this plugin), and a copied storage whose
    files all carry one time: what was saved last of this plugin's runs is still the latest."""
    ids = save_runs(tmp_path, [1000.0] * 4)
    folder = tmp_path / "Linux-CPython-3.12-64bit"
    data = json.loads((folder / f"{ids[3]}.json").read_text())
    plain = {**data, "machine_info": {"node": "ci"}, "benchmarks": [{"name": "test_micro", "stats": {"mean": 1e-3}}]}
    (folder / "0005_micro.json").write_text(json.dumps(plain))
    older = tmp_path / "Linux-CPython-3.10-64bit"
    older.mkdir()
    with_datetime(Path(shutil.copy(folder / f"{ids[0]}.json", older / "0001_old.json")), "2026-11-01T00:00")
    (older / "0002_cut.json").write_text('{"benchmarks": [')
    for path in [*folder.iterdir(), *older.iterdir()]:
        os.utime(path, ns=(10**18, 10**18))
    code, out, err = run_cli(capsys, "gate", "--storage", tmp_path)
    assert code == cli.OK and out.startswith(f"gate: {ids[3]}"), out + err
    code, out, err = run_cli(capsys, "advise", "--p99-within", "2x", "--storage", tmp_path)  # runs saved: not "none"
    assert code == cli.NOTHING_TO_READ and f"none of the runs read ({ids[3]}) has a serving job" in err, out + err


def test_a_run_copied_within_the_storage_is_counted_once_and_the_copy_named(tmp_path, capsys):
    """An ``archive/`` folder of copies, a link to a run file: one run saved twice weighed twice in a baseline."""
    ids = save_runs(tmp_path, [1000.0] * 4)
    folder = tmp_path / "Linux-CPython-3.12-64bit"
    archive = tmp_path / "archive"
    archive.mkdir()
    shutil.copy(folder / f"{ids[0]}.json", archive)  # written later: the copy
    shutil.copy2(folder / f"{ids[1]}.json", archive)
    os.utime(archive / f"{ids[1]}.json", ns=(10**18, 10**18))  # the older file: kept, the machine folder's a copy
    (tmp_path / "linked.json").symlink_to(folder / f"{ids[2]}.json")
    code, out, err = run_cli(capsys, "gate", folder / f"{ids[3]}.json", "--storage", tmp_path, "--format", "json",
                             "--min-runs", "3")
    assert code == cli.OK and [row["baseline_runs"] for row in json.loads(out)] == [ids[:3]], out + err
    assert "3 run(s) left out of the history" in err and f"a copy of {folder / ids[0]}.json" in err, err
    assert f"a copy of {archive / ids[1]}.json" in err, err
    # forgetting the run kept forgets it: its copy is not counted in its place
    assert run_cli(capsys, "forget", ids[0], "--storage", tmp_path)[0] == cli.OK
    code, out, err = run_cli(capsys, "gate", folder / f"{ids[3]}.json", "--storage", tmp_path, "--format", "json",
                             "--min-runs", "2")
    assert [row["baseline_runs"] for row in json.loads(out)] == [ids[1:3]], out + err
    # copied with its times (`cp -a`) into a folder that sorts first: the machine folder's file is kept
    shutil.copytree(folder, tmp_path / "Archive", copy_function=shutil.copy2)
    code, out, err = run_cli(capsys, "gate", "--storage", tmp_path, "--format", "json", "--min-runs", "2")
    assert [row["file"] for row in json.loads(out)] == [str(folder / f"{ids[3]}.json")], out + err


@pytest.mark.parametrize("linked", [False, True])
def test_a_run_forgotten_is_left_out_whether_the_storage_or_its_machine_folder_is_named(tmp_path, capsys, linked,
                                                                                        tmp_path_factory):
    """`gate .benchmarks/Linux-...` (a storage folder named as the run) read no list kept in `.benchmarks`: a run set
    aside was a baseline again; and a list kept in the machine folder was not read through `--storage .benchmarks`.
    ``linked``: the machine folder kept elsewhere and linked in (its list was looked for in the folder above its
    target)."""
    ids = save_runs(tmp_path, [1000.0] * 5)
    folder = tmp_path / "Linux-CPython-3.12-64bit"
    if linked:
        folder.symlink_to(shutil.move(folder, tmp_path_factory.mktemp("elsewhere")))
    assert run_cli(capsys, "forget", ids[0], "--storage", tmp_path)[0] == cli.OK
    assert run_cli(capsys, "forget", ids[1], "--storage", folder)[0] == cli.OK
    for storage in (tmp_path, folder):
        code, out, err = run_cli(capsys, "gate", folder / f"{ids[4]}.json", "--storage", storage, "--format", "json",
                                 "--min-runs", "2")
        assert code == cli.OK and [row["baseline_runs"] for row in json.loads(out)] == [ids[2:4]], (storage, out, err)
    code, out, err = run_cli(capsys, "gate", folder, "--format", "json", "--min-runs", "2")
    assert code == cli.OK and [row["baseline_runs"] for row in json.loads(out)] == [ids[2:4]], out + err
    for storage, prefix in ((tmp_path, f"{folder.name}/"), (folder, "")):  # --list: what the history leaves out
        code, out, err = run_cli(capsys, "forget", "--list", "--storage", storage, "--format", "json")
        assert [row["run"] for row in json.loads(out)] == [f"{prefix}{ids[0]}.json", f"{prefix}{ids[1]}.json"], out


def test_a_run_set_aside_by_any_of_its_files_is_left_out(tmp_path, capsys):
    """A run forgotten by its copy's file stayed in the history through the file counted in its place; and a run
    forgotten before it was copied came back where the copy was the file counted (the run's own file touched since)."""
    ids = save_runs(tmp_path, [1000.0] * 5)
    folder = tmp_path / "Linux-CPython-3.12-64bit"
    archive = tmp_path / "archive"
    archive.mkdir()
    assert run_cli(capsys, "forget", ids[1], "--storage", tmp_path)[0] == cli.OK
    for run_id in ids[:2]:
        shutil.copy2(folder / f"{run_id}.json", archive)
    os.utime(folder / f"{ids[1]}.json")  # touched: its copy in archive/ is now the older file, counted
    assert run_cli(capsys, "forget", archive / f"{ids[0]}.json", "--storage", tmp_path)[0] == cli.OK
    code, out, err = run_cli(capsys, "gate", folder / f"{ids[4]}.json", "--storage", tmp_path, "--format", "json",
                             "--min-runs", "2")
    assert code == cli.OK and [row["baseline_runs"] for row in json.loads(out)] == [ids[2:4]], out + err


def test_a_link_to_a_run_is_its_copy_and_the_run_keeps_its_name(tmp_path, capsys):
    """A link sharing its file's time, sorted before it, was the file counted: the run was named by the link, and
    `forget` of the run by its id set aside the file taken as the copy, leaving the run in the history."""
    ids = save_runs(tmp_path, [1000.0] * 5)
    folder = tmp_path / "Linux-CPython-3.12-64bit"
    (tmp_path / "Baseline.json").symlink_to(folder / f"{ids[1]}.json")
    code, out, err = run_cli(capsys, "gate", folder / f"{ids[4]}.json", "--storage", tmp_path, "--format", "json",
                             "--min-runs", "2")
    assert [row["baseline_runs"] for row in json.loads(out)] == [ids[:4]], out + err
    assert f"Baseline (a copy of {folder / ids[1]}.json" in err, err
    assert run_cli(capsys, "forget", ids[1], "--storage", tmp_path)[0] == cli.OK
    code, out, err = run_cli(capsys, "gate", folder / f"{ids[4]}.json", "--storage", tmp_path, "--format", "json",
                             "--min-runs", "2")
    assert [row["baseline_runs"] for row in json.loads(out)] == [[ids[0], *ids[2:4]]], out + err


def test_a_copy_named_to_the_gate_is_not_judged_against_its_own_run(tmp_path, capsys):
    ids = save_runs(tmp_path, [1000.0] * 5)
    (tmp_path / "archive").mkdir()
    copy = shutil.copy(tmp_path / "Linux-CPython-3.12-64bit" / f"{ids[4]}.json", tmp_path / "archive")
    code, out, err = run_cli(capsys, "gate", copy, "--storage", tmp_path, "--format", "json", "--min-runs", "2")
    assert code == cli.OK and [row["baseline_runs"] for row in json.loads(out)] == [ids[:4]], out + err


def test_a_folder_of_the_storage_its_user_may_not_enter_is_named_and_the_runs_judged(tmp_path):
    """lost+found at the top of a disk: reading the lists beside the runs failed on it, and every command said it
    could not write its output (exit 4)."""
    ids = save_runs(tmp_path, [1000.0] * 4)
    closed = tmp_path / "lost+found"
    closed.mkdir(mode=0o700)
    prefix = []
    if os.geteuid() == 0:  # root passes every permission check: the folder another user's, root's override dropped
        if not shutil.which("setpriv"):
            pytest.skip("as root, setpriv runs the command without root's right to read any folder")
        os.chown(closed, 65534, 65534)
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    else:
        closed.chmod(0)
    done = subprocess.run([*prefix, sys.executable, "-m", "pytest_gpucolloc.cli", "gate", "--storage", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    closed.chmod(0o700)
    assert done.returncode == cli.OK and done.stdout.startswith(f"gate: {ids[3]}"), done.stdout + done.stderr
    assert f"{closed}: skipped (PermissionError" in done.stderr, done.stderr


def test_a_damaged_list_in_a_machine_folder_is_a_usage_error_before_anything_runs(pytester):
    """It was read at the session's start, after the usage checks: an internal error with a traceback."""
    pytester.makepyfile(tiny_workload=TINY)
    pytester.makepyfile(test_scenarios=SCENARIOS.format(sleep=0.001))
    folder = pytester.path / ".benchmarks" / "Linux-CPython-3.12-64bit"
    folder.mkdir(parents=True)
    (folder / "gpucolloc-forgotten.tsv").write_bytes(bytes(range(256)) * 4)
    done = pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", "--colloc-gate", "-k", "naive-1", *FAST)
    assert done.ret == pytest.ExitCode.USAGE_ERROR
    done.stderr.fnmatch_lines([f"*{folder}/gpucolloc-forgotten.tsv is not a list of runs that pytest-gpucolloc can "
                               "read*"])


# --- a storage that jobs save into and list runs of at once -------------------------------------------------

AT_ONCE = """
import logging, sys, time
from pytest_benchmark.storage.file import FileStorage
from pytest_gpucolloc import benchmark_api, cli
root, job, first, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
storage = FileStorage(root, logging.getLogger(), "Linux-CPython-3.12-64bit")
benchmark_api.guard_saving(storage, [], [])
time.sleep(max(0.0, start - time.time()))
for number in range(first, first + 20):
    if job == "save":
        storage.save({"benchmarks": []}, f"job{first}-{number}")  # as a gated run saves at its session's end
    else:
        cli.main([job, f"{number:04d}", "--storage", root])
"""


def at_once(root: Path, jobs: list[tuple[str, int]]) -> None:
    """The jobs started together, each saving 20 runs or listing 20 runs of ``root`` from its first number on."""
    start = time.time() + 1.5  # every job started and imported
    running = [subprocess.Popen([sys.executable, "-c", AT_ONCE, str(root), job, str(first), str(start)], cwd=ROOT,
                                env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.DEVNULL)
               for job, first in jobs]
    assert [job.wait(timeout=60) for job in running] == [0] * len(jobs)


def test_jobs_saving_into_one_storage_at_once_each_take_a_number_of_their_own(tmp_path):
    """Runs of other names were saved under one number: `gate 0012`, `accept 0012` then named two runs."""
    at_once(tmp_path, [("save", 1), ("save", 21), ("save", 41)])
    numbers = [path.name.split("_")[0] for path in (tmp_path / "Linux-CPython-3.12-64bit").glob("*.json")]
    assert sorted(numbers) == [f"{n:04d}" for n in range(1, 61)]


def test_runs_forgotten_and_accepted_by_jobs_at_once_are_all_on_the_lists(tmp_path, capsys):
    """Each job read the list, added its run and wrote the list back: a run another job added meanwhile was lost."""
    save_runs(tmp_path, [1000.0] * 80)
    at_once(tmp_path, [("forget", 1), ("forget", 21), ("accept", 41), ("accept", 61)])
    for command, first in ("forget", 1), ("accept", 41):
        code, out, _ = run_cli(capsys, command, "--list", "--storage", tmp_path, "--format", "json")
        assert [row["run"] for row in json.loads(out)] == [f"Linux-CPython-3.12-64bit/{n:04d}_run.json"
                                                           for n in range(first, first + 40)]


@pytest.mark.parametrize("argv", [["forget", "0002"], ["accept", "0002"], ["forget", "--undo", "0001"]])
def test_a_list_of_a_storage_this_user_may_not_write_is_named_with_what_to_do(tmp_path, argv):
    """A read-only mount: it said "cannot write the output", as if stdout had failed."""
    save_runs(tmp_path, [1000.0] * 3)
    assert cli.main(["forget", "0001", "--storage", str(tmp_path)]) == cli.OK
    prefix = []
    if os.geteuid() == 0:  # root writes anywhere: its override dropped
        if not shutil.which("setpriv"):
            pytest.skip("as root, setpriv runs the command without root's right to write any folder")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    tmp_path.chmod(0o555)
    done = subprocess.run([*prefix, sys.executable, "-m", "pytest_gpucolloc.cli", *argv, "--storage", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    tmp_path.chmod(0o755)
    listed = "gpucolloc-accepted.tsv" if argv[0] == "accept" else "gpucolloc-forgotten.tsv"
    assert done.returncode == cli.UNWRITABLE and done.stderr.startswith(
        f"error: cannot change {tmp_path / listed} (run `pytest-gpucolloc {argv[0]}` as a user who may write the "
        "storage, not on a read-only mount): [Errno 13] Permission denied"), done.stderr


def test_a_gated_run_that_records_nothing_says_so_in_lines_of_the_tables_width(pytester, monkeypatch):
    """--benchmark-disable saves nothing: the gate's summary said its first scenario "is saved to start its
    history"; and the note that nothing was recorded was one line of 170 (the summary's prose wraps, docs/cli.md)."""
    monkeypatch.setenv("COLUMNS", "100")
    pytester.makepyfile(tiny_workload=TINY)
    pytester.makepyfile(test_scenarios=SCENARIOS.format(sleep=0.001))
    done = pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", "--colloc-gate", "--benchmark-disable",
                              "-k", "naive-1", *FAST)
    assert done.ret == 0 and not list(pytester.path.rglob("*.json"))
    assert "is saved to start its history" not in done.stdout.str()
    done.stdout.fnmatch_lines(["a scenario with no baseline yet passes; this run was not saved, so it starts no*"])
    lines = done.stdout.lines
    start = next(i for i, line in enumerate(lines) if line.startswith("gpucolloc: --benchmark-disable:"))
    note = [lines[start]] + [line for line in lines[start + 1:start + 3] if line.startswith("  ")]
    assert len(note) > 1 and all(len(line) <= 100 for line in note), "\n".join(lines)


@pytest.mark.parametrize("command", ["gate", "table", "report", "advise"])
def test_an_id_that_names_runs_of_two_machine_folders_says_how_to_name_one(tmp_path, capsys, command):
    """`forget` and `accept` said "name it by its file"; the commands reading runs named both files and no way out."""
    for machine, history in (("a", "aa-history"), ("b", "cudnn-history")):  # two runs 0001, not copies of one
        shutil.copytree(DATA / history / "Linux-CPython-3.12-64bit", tmp_path / machine)
    more = ["--jobs", "resnet26*1"] if command == "advise" else []
    code, out, err = run_cli(capsys, command, "0001", "--storage", tmp_path, *more)
    assert code == cli.USAGE and "names 2 saved runs under" in err and "name it by its file" in err, out + err
