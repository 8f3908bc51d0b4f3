"""Paired A/B in one job (``pytest-gpucolloc ab``): real git revisions of a scenario, each arm a fresh pytest
process on the CPU, alternating; bad input refused before anything runs; the working tree never touched."""
import json
import math
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from pytest_gpucolloc import ab_arms, ab_judge, cli

WORKLOAD = '''
import time
import torch


class Step:
    def __init__(self, batch_size, sleep):
        self.samples_per_step = batch_size
        self.sleep = sleep
        self.x = torch.ones(batch_size, 4)

    def train_step(self):
        (self.x * 2).sum()
        time.sleep(self.sleep)


def factory(batch_size, device, precision="fp32", sleep=0.002):
    return Step(batch_size, sleep)
'''

SCENARIO = '''
from pytest_gpucolloc import Workload

def test_tiny(collocate):
    collocate([Workload("workload:factory", batch_size=4, options={{"sleep": {sleep}}})])

def test_same(collocate):  # the same code in both revisions: an A/A from the same pairs
    collocate([Workload("workload:factory", batch_size=4, options={{"sleep": 0.002}})])
'''

ARGS = ["--", "test_scenario.py", "--colloc-device=cpu", "--colloc-cpu-full", "--gpu-mode=naive", "--colloc-rounds=3",
        "--colloc-round-seconds=0.3", "--colloc-warmup-seconds=0.3"]


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A project with two commits: the second makes test_tiny's training step three times as slow."""
    path = tmp_path / "project"
    path.mkdir()
    git(path, "init", "-q")
    git(path, "config", "user.email", "ab@example.invalid")
    git(path, "config", "user.name", "ab")
    (path / "workload.py").write_text(WORKLOAD)
    (path / "test_scenario.py").write_text(SCENARIO.format(sleep=0.002))
    git(path, "add", ".")
    git(path, "commit", "-qm", "fast")
    (path / "test_scenario.py").write_text(SCENARIO.format(sleep=0.006))
    git(path, "commit", "-qam", "slow")
    monkeypatch.chdir(path)
    return path


def test_a_slower_revision_is_regressed_and_the_tree_is_left_as_it_was(repo, tmp_path, capsys):
    before = git(repo, "status", "--porcelain")
    report = tmp_path / "ab.json"
    code = cli.main(["ab", "--baseline", "HEAD~1", "--candidate", "HEAD", "--threshold", "10", "--alpha", "0.05",
                     "--ab-pairs", "3", "--ab-window-seconds", "0.2", "--ab-max-blocks", "3",
                     "--out", str(tmp_path / "arms"), "--json", str(report),
                     *ARGS])
    out = capsys.readouterr()
    assert code == 1, out.out + out.err
    assert "blocks of fresh processes; CPU smoke mode: its numbers check the suite, not a GPU" in out.out
    judged = {j["scenario"]: j for j in json.loads(report.read_text())["judgements"]}
    slowed, same = judged["test_tiny[cpu-naive]"], judged["test_same[cpu-naive]"]
    assert slowed["verdict"] == "regressed" and slowed["change"] < -0.3
    assert same["verdict"] != "regressed" and abs(same["change"]) < 0.1
    # three blocks of fresh processes (an answer is not taken from fewer), three pairs of windows each
    assert slowed["blocks"] == same["blocks"] == 3 and slowed["pairs"] == len(slowed["log_ratios"]) == 9
    # each arm is one pytest session, saved once into the A/B's own folder (never the project's history), its run
    # saying what it is, its scenarios holding every window it measured
    saved = sorted((tmp_path / "arms" / "storage").rglob("*.json"), key=lambda path: path.name.split("-")[-1])
    assert len(saved) == 2 and saved[0].name.endswith("-baseline.json"), saved
    assert json.loads(saved[0].read_text())["machine_info"]["gpucolloc"]["experiment"] == \
        "the baseline arm of a paired A/B"
    assert not (repo / ".benchmarks").exists()
    # progress as it runs: where the logs are, then each block's running verdict and the time spent
    assert f"A/B: each arm's pytest writes to {tmp_path / 'arms' / 'baseline.log'} (baseline)" in out.err
    assert re.search(r"test_tiny\[cpu-naive\]: block 1: both arms warming up \(\d+\.\d minutes of the A/B's 60\)",
                     out.err), out.err
    assert re.search(r"test_tiny\[cpu-naive\]: block 3 done: throughput -\d+\.\d% \[-\d+\.\d%, -\d+\.\d%\] regressed "
                     r"so far; \d+ s of its 5 minutes, \d\.\d minutes of the A/B's 60", out.err), out.err
    arm = json.loads((tmp_path / "arms" / "candidate.json").read_text())
    rounds = {b["name"]: len(b["stats"]["data"]) for b in arm["benchmarks"]}
    assert rounds == {"test_tiny[cpu-naive]": 9, "test_same[cpu-naive]": 9}, rounds
    assert git(repo, "status", "--porcelain") == before and git(repo, "worktree", "list").count("\n") == 0


@pytest.mark.parametrize("spec, message", [
    ("no-such-branch", "--candidate no-such-branch: no such git revision"),
    ("/no/such/python", "--candidate /no/such/python: not a Python interpreter or a virtual environment"),
])
def test_bad_arms_are_refused_before_anything_runs(repo, tmp_path, capsys, spec, message):
    assert cli.main(["ab", "--baseline", "HEAD", "--candidate", spec, "--out", str(tmp_path / "arms"), *ARGS]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "arms").exists()


def test_an_interpreter_without_the_plugin_is_refused(repo, tmp_path, capsys):
    bare = tmp_path / "bare-env"
    venv.create(bare, with_pip=False)
    assert cli.main(["ab", "--baseline", sys.executable, "--candidate", str(bare), *ARGS]) == 2
    err = capsys.readouterr().err
    assert "lacks pytest-gpucolloc, pytest, pytest-benchmark, torch, torchvision" in err, err
    checkout = Path(ab_arms.__file__).resolve().parents[1]  # the plugin as this one is installed brings the rest
    assert f"install it there first: {bare}/bin/python -m pip install -e {checkout}" in err, err


def test_an_environment_without_torchvision_is_refused_with_the_command_that_fixes_it(repo, tmp_path, capsys):
    env = tmp_path / "no-torchvision"
    venv.create(env, with_pip=False)
    site = next(env.glob("lib/python*/site-packages"))
    for name, version in (("pytest_gpucolloc", "1.0"), ("pytest", "8.3.0"), ("pytest_benchmark", "5.1.0"),
                          ("torch", "2.11.0")):  # installed as metadata says: all but torchvision
        (site / f"{name}-{version}.dist-info").mkdir()
        (site / f"{name}-{version}.dist-info" / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
    code = cli.main(["ab", "--baseline", sys.executable, "--candidate", str(env), "--out", str(tmp_path / "arms"),
                     *ARGS])
    err = capsys.readouterr().err
    assert code == 2 and f"--candidate {env}: {env}/bin/python lacks torchvision, which each arm" in err, err
    assert f"install it there first: {env}/bin/python -m pip install torchvision (from the index its torch" in err
    assert not (tmp_path / "arms").exists()  # nothing started


def test_a_dirty_tree_is_refused_for_revision_arms(repo, capsys):
    (repo / "workload.py").write_text(WORKLOAD + "\n# edited\n")
    assert cli.main(["ab", "--baseline", "HEAD~1", "--candidate", "HEAD", *ARGS]) == 2
    assert "uncommitted changes (workload.py)" in capsys.readouterr().err


@pytest.mark.parametrize("ratios, verdict", [
    ([math.log(0.9)] * 2 + [math.log(0.91)], "regressed"),
    ([0.001, -0.002, 0.0005, 0.001, -0.001, 0.0], "unchanged"),
    ([0.05, -0.06, 0.04], "inconclusive"),
    ([math.log(1.2), math.log(1.21), math.log(1.19)], "improved"),
])
def test_paired_log_ratios_decide(ratios, verdict):
    assert ab_judge.judge("s", ratios, threshold=0.02, alpha=0.05).verdict == verdict


def test_arms_on_different_machines_are_named():
    arms = [ab_arms.Arm("baseline", "HEAD~1", "revision", sys.executable, None)] * 2
    changes = ab_arms.unexpected_differences(arms, {"driver_version": "570", "torch": "2.11"},
                                        {"driver_version": "580", "torch": "2.11"})
    assert changes == ["driver 570 -> 580"]
    interpreters = [ab_arms.Arm("candidate", "/venv", "interpreter", sys.executable, None)] * 2
    assert ab_arms.unexpected_differences(interpreters, {"torch": "2.11"}, {"torch": "2.12"}) == []  # the change itself


def test_a_scenario_budget_too_small_for_the_blocks_asked_for_says_so(repo, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")  # a narrow terminal: the table fits it
    code = cli.main(["ab", "--baseline", "HEAD", "--candidate", "HEAD", "--ab-pairs", "2", "--ab-window-seconds",
                     "0.2", "--ab-scenario-minutes", "0.01", "--out", str(tmp_path / "arms"), "--json", str(tmp_path / "ab.json"), *ARGS, "-k", "test_same"])
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    assert "test_same[cpu-naive]: no more blocks within the budget (1 so far" in out.err
    (judged,) = json.loads((tmp_path / "ab.json").read_text())["judgements"]
    assert judged["verdict"] == "inconclusive" and judged["blocks"] == 1 and judged["pairs"] == 2
    assert "noise between processes is not known" in judged["reason"] and "raise --ab-scenario-minutes" in judged["reason"]
    lines = out.out.splitlines()
    table = lines[1:lines.index(next(line for line in lines if line.startswith("[1] ")))]
    prose = [line for line in lines if not line.startswith("  pytest-gpucolloc compare")]  # a command: whole
    assert max(map(len, prose)) <= 100 and any(line.startswith("left out to fit 100 characters: ") for line in table)
    assert "[1] test_same[cpu-naive] throughput inconclusive: one block of processes" in out.out
    assert re.search(r"each arm's run is saved in \S+/arms/storage \(\d{4}_ab-\S+-baseline, \d{4}_ab-\S+-candidate\), "
                     r"kept out of every history .*:\n  pytest-gpucolloc compare \S+ \S+ --storage \S+/arms/storage\n",
                     re.sub(r"\n  (?!pytest-gpucolloc compare)", " ", out.out)), out.out  # wrapped lines joined
    said = re.search(r"pytest-gpucolloc compare (.*)\n", out.out).group(1).split()
    assert cli.main(["compare", *said]) == 0, capsys.readouterr().err  # the command it prints works
    capsys.readouterr()
    # a second A/B into the same folder keeps the first one's arms: it writes into arms-2
    log = (tmp_path / "arms" / "baseline.log").read_text()
    code = cli.main(["ab", "--baseline", "HEAD", "--candidate", "HEAD", "--out", str(tmp_path / "arms"), *ARGS,
                     "-k", "not test_"])  # fast: nothing selected
    err = capsys.readouterr().err
    assert f"holds an earlier A/B's arms (kept): this one writes into {tmp_path / 'arms-2'}" in err.replace("\n  ", " ")
    # never into a history's storage: the default one, or a folder holding ordinary saved runs
    (tmp_path / "history" / "Linux").mkdir(parents=True)
    (tmp_path / "history" / "Linux" / "0001_run.json").write_text("{}")
    for out in (Path(".benchmarks"), Path(".benchmarks") / "ab", tmp_path / "history"):
        assert cli.main(["ab", "--baseline", "HEAD", "--candidate", "HEAD", "--out", str(out), *ARGS]) == 2
        assert "is a history's storage" in capsys.readouterr().err and not (out / "baseline.log").exists()
    assert (tmp_path / "arms" / "baseline.log").read_text() == log and (tmp_path / "arms-2" / "baseline.log").exists()


def test_the_ab_table_fits_a_terminal_and_shows_the_columns_asked_for():
    from pytest_gpucolloc import ab_table

    judged = [ab_judge.judge_blocks(f"test_tiny[cpu-naive-{n}]", [[0.01, 0.02], [0.015, 0.01], [0.02, 0.0]], 0.02,
                                    0.005) for n in range(2)]
    judged[0].reason = "a budget stopped it after 3 blocks: raise --ab-scenario-minutes or --ab-budget-minutes"
    wide = ab_table.table(judged)
    assert max(map(len, wide.splitlines())) > 100  # every column: wider than this terminal
    text = ab_table.table(judged, width=100)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 100, text  # the notes below wrapped too
    assert lines[4].startswith("left out to fit 100 characters: pairs") and "--columns=scenario,measure,verdict,blocks,pairs," in lines[5]
    assert "\n".join(lines[6:]).replace("\n  ", " ").splitlines()[0] == \
        f"[1] test_tiny[cpu-naive-0] throughput {judged[0].verdict}: {judged[0].reason}"
    asked = ab_table.table(judged, columns=["scenario", "verdict", "p"], width=20)  # asked for: never left out
    assert asked.splitlines()[0].split() == ["scenario", "verdict", "p", "(slower)"]
    assert judged[0].reason in ab_table.table(judged, "github")  # Markdown keeps every cell whole
    assert cli.main(["ab", "--baseline", "HEAD", "--candidate", "HEAD", "--columns", "scenario,nope"]) == 2


def test_fewer_blocks_at_most_than_at_least_is_a_usage_error(capsys):
    assert cli.main(["ab", "--baseline", "HEAD", "--candidate", "HEAD", "--ab-min-blocks", "5",
                     "--ab-max-blocks", "2"]) == 2
    assert "--ab-max-blocks (2) must be at least --ab-min-blocks (5)" in capsys.readouterr().err


def test_an_inconclusive_judgement_says_why():
    noisy = ab_judge.judge_blocks("test_x[cpu-naive]", [[0.05], [-0.04], [0.03], [-0.02]], 0.02, 0.005)
    assert noisy.verdict == "inconclusive"
    assert noisy.reason == (f"its interval holds both no change and a change of the 2% threshold: 4 blocks resolve "
                            f"changes of {noisy.detectable:.1%} or more")
    steady = ab_judge.judge_blocks("test_x[cpu-naive]", [[0.001], [-0.001], [0.0005]], 0.02, 0.005)
    assert steady.verdict == "unchanged" and steady.reason == ""


def test_an_interval_beyond_what_three_blocks_can_say_is_said_as_such():
    """Three blocks of a noisy A/A (the CPU smoke mode's): the interval's upper bound is thousands of percent, which
    says nothing more than 'unbounded'; the table and the line after each block say so."""
    from pytest_gpucolloc import ab_table, report

    wild = ab_judge.judge_blocks("test_x[cpu-naive]", [[0.3], [-0.9], [-0.4]], 0.02, 0.005)
    assert wild.ci[1] > 10 and wild.verdict == "inconclusive"
    row = ab_table.rows([wild])[0]
    assert row[ab_table.COLUMNS.index("interval")] == f"[{wild.ci[0]:+.2%}, >+1000%]"
    assert report.interval(wild.ci) == f"[{wild.ci[0]:+.1%}, >+1000%]" and report.interval(None) == "-"


def test_an_arm_that_cannot_start_is_quoted_from_its_log(repo, tmp_path, capsys):
    """The candidate's scenario module raises at import: no pair can be measured, and the error quotes the end of
    that arm's log (the traceback a user needs), not only where the log is."""
    (repo / "test_scenario.py").write_text("raise RuntimeError('the scenario module is broken in this revision')\n")
    git(repo, "commit", "-qam", "broken")
    code = cli.main(["ab", "--baseline", "HEAD~1", "--candidate", "HEAD", "--out", str(tmp_path / "arms"), *ARGS,
                     "-k", "not test_"])  # fast: the baseline arm selects nothing (5), the candidate cannot collect
    err = capsys.readouterr().err
    assert code == 2 and "no scenario was measured in both arms" in err and "candidate 2" in err, err
    quoted = err.split("the candidate arm's log ends:\n", 1)[1]
    assert "RuntimeError: the scenario module is broken in this revision" in quoted, err
    assert "the baseline arm's log ends" not in err  # an arm that ran as asked is not quoted


def test_arms_whose_scenarios_were_all_skipped_say_why(repo, tmp_path, capsys):
    """The README's `ab ... -- benchmarks/ --gpu-mode=mps` on a machine without a GPU: every scenario is skipped; the
    error says why from the arm's own summary, not only where its log is."""
    args = [arg.replace("--gpu-mode=naive", "--gpu-mode=mps") for arg in ARGS]
    code = cli.main(["ab", "--baseline", "HEAD", "--candidate", "HEAD", "--out", str(tmp_path / "arms"), *args])
    err = capsys.readouterr().err
    assert code == 2 and "no scenario was measured in both arms" in err, err
    assert "\nskipped test_tiny[cpu-mps]: mps: MPS needs an NVIDIA GPU" in err, err


def test_scenarios_after_the_jobs_budget_is_spent_are_skipped_saying_why(repo, tmp_path, capsys):
    code = cli.main(["ab", "--baseline", "HEAD", "--candidate", "HEAD", "--ab-budget-minutes", "0.001",
                     "--out", str(tmp_path / "arms"), *ARGS])
    err = capsys.readouterr().err
    assert code == 2 and "no scenario was measured in both arms" in err, err
    assert "not started, the job's budget was spent (no verdict): test_scenario.py::test_tiny[cpu-naive]" in err
    log = (tmp_path / "arms" / "baseline.log").read_text()
    assert "the A/B's budget of 0.001 minutes was spent before this scenario" in log



def test_an_arm_expects_the_other_arms_mps_daemon_and_no_one_elses(tmp_path):
    """Both arms run at once, each with its own MPS daemon: a daemon whose scratch directory belongs to a sibling
    session (started by the same controller) is the other arm's; any other daemon still makes mps unavailable."""
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for owner, expected in ((sibling.pid, True), (1, False)):
            scratch = tmp_path / f"gc-{owner}"
            (scratch / "mps" / "pipe").mkdir(parents=True)
            (scratch / "owner.pid").write_text(str(owner))
            probe = ("import sys; from pytest_gpucolloc.modes.mps import _other_arm; "
                     f"print(_other_arm({str(scratch / 'mps' / 'pipe')!r}))")
            for env, answer in (({"GPUCOLLOC_AB_SOCKET": "/nonexistent"}, expected), ({}, False)):
                done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                      env={"PATH": "/usr/bin:/bin", **env}, check=True)
                assert done.stdout.strip() == str(answer), (owner, env, done.stderr)
    finally:
        sibling.kill()
        sibling.wait()


def test_a_scenario_only_the_candidate_has_leaves_the_next_one_paired(repo, tmp_path, capsys):
    """The candidate adds a test between two both arms have: it is measured in that arm alone, and the test after it
    still pairs (the baseline waits for the candidate to reach it)."""
    extra = "def test_extra(collocate):\n    collocate([Workload(\"workload:factory\", batch_size=4)])\n\n\n"
    source = (repo / "test_scenario.py").read_text()
    (repo / "test_scenario.py").write_text(source.replace("def test_same", extra + "def test_same"))
    git(repo, "commit", "-qam", "extra")
    code = cli.main(["ab", "--baseline", "HEAD~1", "--candidate", "HEAD", "--threshold", "50", "--ab-min-blocks", "2",
                     "--ab-max-blocks", "2", "--ab-pairs", "1", "--ab-window-seconds", "0.1", "--out",
                     str(tmp_path / "arms"), "--json", str(tmp_path / "ab.json"),
                     *ARGS, "-k", "not tiny"])
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    judged = {j["scenario"]: j["blocks"] for j in json.loads((tmp_path / "ab.json").read_text())["judgements"]}
    assert judged == {"test_same[cpu-naive]": 2}, out.err
    assert "measured in one arm only (no verdict): test_scenario.py::test_extra[cpu-naive] (candidate only)" in out.err


@pytest.mark.parametrize("xdist", [["-n", "2"], ["-n2"], ["--numprocesses=2"], ["--dist", "load"]])
def test_xdist_inside_an_arm_is_refused_before_anything_runs(repo, tmp_path, capsys, xdist):
    code = cli.main(["ab", "--baseline", "HEAD", "--candidate", "HEAD", "--out", str(tmp_path / "arms"), *ARGS, *xdist])
    assert code == 2 and "pytest-xdist (-n, --dist) cannot run inside an arm" in capsys.readouterr().err
    assert not (tmp_path / "arms").exists()


def test_sigterm_of_ab_stops_both_arms_and_leaves_no_worktree(repo, tmp_path):
    """A cancelled CI job: SIGTERM unwinds like Ctrl-C; the arms (sessions of their own) are stopped once, and the
    temporary worktrees and the socket folder are removed."""
    import signal
    import time

    command = [sys.executable, "-m", "pytest_gpucolloc.cli", "ab", "--baseline", "HEAD~1", "--candidate", "HEAD",
               "--out", str(tmp_path / "arms"), *ARGS]
    controller = subprocess.Popen(command, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and git(repo, "worktree", "list").count("\n") < 2:
        time.sleep(0.2)
    assert git(repo, "worktree", "list").count("\n") == 2, "the arms' worktrees never appeared"
    time.sleep(3)  # the arms' pytest sessions are running
    controller.send_signal(signal.SIGTERM)
    out, _ = controller.communicate(timeout=120)
    assert controller.returncode != 0, out
    assert git(repo, "worktree", "list").count("\n") == 0, out
    arms = subprocess.run(["pgrep", "-f", str(tmp_path / "arms")], capture_output=True, text=True).stdout.split()
    assert arms == [], f"arm processes left: {arms}"


def test_an_environment_whose_torchvision_wants_another_torch_is_refused_with_the_fix():
    from pytest_gpucolloc import ab_arms

    versions = {"torch": "2.12.0+cu130", "torchvision": "0.26.0", "torchvision wants": ["torch==2.11.0"]}
    assert ab_arms._torchvision_mismatch(versions) == \
        "torch 2.12.0+cu130 beside torchvision 0.26.0, which wants torch==2.11.0"
    assert ab_arms._torchvision_mismatch({**versions, "torch": "2.11.0+cu130"}) is None
    assert ab_arms._torchvision_mismatch({"torch": "2.13.0", "torchvision wants": ["torch (>=2.14.0)"]})
    assert ab_arms._torchvision_mismatch({"torch": "2.13.0"}) is None  # no torchvision: nothing to mismatch


PARENTS = """
import os
from workload import Step


def live(pid):  # a process not yet exited (a zombie has)
    try:
        return " Z " not in open(f"/proc/{pid}/stat").read()
    except OSError:
        return False


def factory(batch_size, device, precision="fp32"):
    arm, server = os.environ["GPUCOLLOC_AB_ARM"], str(os.getppid())
    with open(os.environ["PARENTS"], "a+") as f:
        f.seek(0)
        earlier = {line.split()[1] for line in f if line.split()[0] == arm} - {server}
        f.write(f"{arm} {server} {sum(map(live, earlier))}\\n")
    return Step(batch_size, 0.002)
"""


def test_every_block_forks_its_workers_from_a_new_server(repo, tmp_path):
    """Workers forked from one server share a host-bound service's latency level; a server per arm would give each arm
    a level of its own, one no block could tell from a change (an A/A once read p50 +3.0%, every block above 0).
    Each block's workers come from a server of their own, the arm's earlier servers closed."""
    parents = tmp_path / "parents"
    (repo / "parents.py").write_text(PARENTS)
    (repo / "test_parents.py").write_text(
        "from pytest_gpucolloc import Workload\n\ndef test_parents(collocate):\n"
        "    collocate([Workload('parents:factory', batch_size=4)])\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "parents")
    done = subprocess.run([sys.executable, "-m", "pytest_gpucolloc.cli", "ab", "--baseline", "HEAD", "--candidate",
                           "HEAD", "--ab-pairs", "2", "--ab-window-seconds", "0.2", "--ab-max-blocks", "3",
                           "--out", str(tmp_path / "arms"), "--", "test_parents.py", *ARGS[2:]],
                          cwd=repo, env={**os.environ, "PARENTS": str(parents)}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    workers = [line.split() for line in parents.read_text().splitlines()]
    assert len(workers) == 6, workers  # three blocks, two arms, one worker each
    assert len({server for _, server, _ in workers}) == 6, workers
    assert all(alive == "0" for _, _, alive in workers), workers  # no earlier server of its arm still running
