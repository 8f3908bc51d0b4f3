"""History holds runs, not experiments: an A/B arm's run left in the storage, and a run the user set aside with
``pytest-gpucolloc forget``, enter no baseline and no comparison unless named; their files are never touched."""
import json
import math
import os
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from pytest_gpucolloc import forget, history
from test_benchmark_interop import ARGS, ONE
from test_cli import run_cli, save_runs
from test_plugin import TINY

MACHINE = "Linux-CPython-3.12-64bit"


def add_ab_arms(root, level: float, commit: str, stamp: str = "05", marked: bool = False) -> list[str]:
    """Both arms of an A/B saved the way ``ab`` saved them into the user's storage before 2026-12-03 (``marked``:
    as an arm's run says it now), at ``level``: an arm's workers idle half the time, its windows measure less."""
    ids = []
    for arm, number in (("baseline", 6), ("candidate", 7)):
        data = json.loads((root / MACHINE / "0001_run.json").read_text())
        data["datetime"] = f"2026-11-20T{stamp}:30:0{number}"
        data["commit_info"]["id"] = commit
        if marked:
            data["machine_info"]["gpucolloc"]["experiment"] = f"the {arm} arm of a paired A/B"
        for bench in data["benchmarks"]:
            bench["extra_info"]["aggregate_round_throughputs"] = [level * (1 + 0.001 * i) for i in range(6)]
        name = f"{number:04d}_{'abtag' if marked else 'ab-20261120T053000'}-{arm}"
        (root / MACHINE / f"{name}.json").write_text(json.dumps(data))
        ids.append(name)
    return ids


def test_an_ab_arm_in_the_storage_is_never_a_baseline_nor_a_comparison(tmp_path, capsys):
    storage = tmp_path / "storage"
    save_runs(storage, [1000.0] * 5)  # commits 00abcdef .. 04abcdef, unchanged code
    arms = add_ab_arms(storage, 620.0, "04abcdef")  # an old A/B's arms, under the last commit
    marked = add_ab_arms(storage, 600.0, "04abcdef", stamp="06", marked=True)
    loaded = history.load(storage)
    assert [r.run_id for r in loaded.runs] == [f"{i:04d}_run" for i in range(1, 6)]
    assert sorted(r.run_id for r, _ in loaded.left_out) == sorted(arms + marked)
    # the gate of a run made after them judges it against ordinary runs only: unchanged, not -38%
    save_runs(tmp_path / "later", [1000.0] * 6)
    latest = tmp_path / "later" / MACHINE / "0006_run.json"
    code, out, err = run_cli(capsys, "gate", latest, "--storage", storage, "--format", "json", "--min-runs", "3")
    assert code == 0, out + err
    assert all(v["verdict"] == "unchanged" and not set(v["baseline_runs"]) & set(arms + marked)
               for v in json.loads(out)), out
    assert "4 run(s) left out of the history: 0006_ab-20261120T053000-baseline (an A/B arm's run" in err
    code, _, err = run_cli(capsys, "gate", "--storage", storage, "--format", "json", "--min-runs", "3")
    assert code == 0 and err.count("left out of the history") == 1, err  # the latest run's gate says it once
    # an arm's run itself is not gated against ordinary runs
    code, out, err = run_cli(capsys, "gate", storage / MACHINE / f"{arms[0]}.json", "--storage", storage)
    assert code == 2 and "an A/B arm's run" in err and "judged by `pytest-gpucolloc ab`" in err
    code, out, err = run_cli(capsys, "gate", storage / MACHINE / f"{marked[1]}.json", "--storage", storage)
    assert code == 2 and "the candidate arm of a paired A/B" in err
    # compare --commits: the commit's ordinary run only; named by id, an arm is compared as asked
    code, out, err = run_cli(capsys, "compare", "--commits", "03abcdef", "04abcdef", "--storage", storage,
                             "--format", "json")
    assert code == 0 and all(abs(row["change"]) < 0.01 for row in json.loads(out)), out
    code, out, err = run_cli(capsys, "compare", "--runs-ids", "0005_run", arms[1], "--storage", storage,
                             "--format", "json")
    assert all(math.isclose(row["change"], -0.38, abs_tol=0.01) for row in json.loads(out)), out


def test_forget_leaves_a_run_out_of_the_history_lists_it_and_undo_brings_it_back(tmp_path, capsys):
    storage = tmp_path / "storage"
    ids = save_runs(storage, [1000.0, 1000.0, 700.0, 1000.0])  # run 3 was disturbed
    before = {path: path.read_bytes() for path in storage.rglob("*.json")}
    code, out, err = run_cli(capsys, "forget", "0003", "--why", "a neighbour's job", "--storage", storage)
    assert code == 0 and f"{MACHINE}/{ids[2]}.json" in out, out + err
    assert [r.run_id for r in history.load(storage).runs] == [ids[0], ids[1], ids[3]]
    code, out, err = run_cli(capsys, "history", "--storage", storage, "--format", "json")
    assert "0003_run (set aside with `pytest-gpucolloc forget` on " in err and "a neighbour's job" in err
    assert all(series["runs"] == 3 for series in json.loads(out)["series"]), out
    code, out, err = run_cli(capsys, "forget", "--list", "--storage", storage, "--format", "json")
    (listed,) = json.loads(out)
    assert listed["run"] == f"{MACHINE}/{ids[2]}.json" and listed["why"] == "a neighbour's job"
    code, out, err = run_cli(capsys, "forget", "--list", "--storage", storage)  # a terminal's: by its number
    assert out.splitlines()[2].split()[0] == "0003" and "a neighbour's job" in out, out
    assert {path: path.read_bytes() for path in storage.rglob("*.json")} == before  # no file edited or deleted
    code, out, err = run_cli(capsys, "forget", "--undo", ids[2], "--storage", storage)
    assert code == 0 and [r.run_id for r in history.load(storage).runs] == ids
    assert run_cli(capsys, "forget", "--list", "--storage", storage)[1].startswith("no run set aside")
    code, out, err = run_cli(capsys, "forget", "0009", "--storage", storage)
    assert code == 2 and "'0009' names 0 saved runs" in err


@pytest.mark.parametrize("damage", ["binary", "fifo", "folder"])
def test_a_damaged_list_of_runs_is_named_and_left_as_it_is(damage, tmp_path, capsys):
    storage = tmp_path / "storage"
    save_runs(storage, [1000.0, 1000.0, 1000.0])
    listed = storage / forget.FILE
    if damage == "binary":
        listed.write_bytes(bytes(range(256)) * 4)
    elif damage == "fifo":
        os.mkfifo(listed)  # read blindly, it would block every command
    else:
        listed.mkdir()
    for argv in (["history"], ["gate"], ["forget", "0002"], ["forget", "--list"]):
        code, out, err = run_cli(capsys, *argv, "--storage", storage)
        assert code == 2 and "is not a list of runs that pytest-gpucolloc can read" in err, (argv, out, err)
        assert "Traceback" not in err and err.count("\n") == 1
    assert listed.is_fifo() if damage == "fifo" else listed.is_dir() if damage == "folder" else \
        listed.read_bytes() == bytes(range(256)) * 4  # left as it was: the user's to look at


def test_benchmark_compare_compares_with_the_latest_run_of_the_history(pytester):
    """``--benchmark-compare`` without a run: pytest-benchmark's latest saved run is an A/B arm's here; the run
    compared with is the latest ordinary one."""
    pytester.makepyfile(tiny_workload=TINY, test_scenario=ONE % 0.002)
    assert pytester.runpytest(*ARGS, "--benchmark-autosave").ret == 0
    (saved,) = (pytester.path / ".benchmarks").rglob("0001_*.json")
    data = json.loads(saved.read_text())
    data["machine_info"]["gpucolloc"]["experiment"] = "the candidate arm of a paired A/B"
    (saved.parent / "0002_ab-20261203T101010-candidate.json").write_text(json.dumps(data))
    result = pytester.runpytest(*ARGS, "--benchmark-compare")
    assert result.ret == 0
    output = result.stdout.str() + result.stderr.str()
    assert "Comparing against benchmarks from: .benchmarks/" in output and "0002_ab-" not in output, output
    assert f"Comparing against benchmarks from: .benchmarks/{saved.parent.name}/{saved.name}" in output
    # the latest run set aside through its copy's file (an archive kept with its times): still not compared with
    later = {**json.loads(saved.read_text()), "datetime": "2099-01-01T00:00:00"}
    (saved.parent / "0003_later.json").write_text(json.dumps(later))
    (pytester.path / ".benchmarks" / "archive").mkdir()
    copy = pytester.path / ".benchmarks" / "archive" / "0003_later.json"
    copy.write_text(json.dumps(later))
    os.utime(copy, ns=(10**18, 10**18))  # the older file: the one the history counts
    assert forget.add(pytester.path / ".benchmarks", [copy])
    result = pytester.runpytest(*ARGS, "--benchmark-compare", "-k", "no_such_test")  # chosen before any test runs
    output = result.stdout.str() + result.stderr.str()
    assert f"Comparing against benchmarks from: .benchmarks/{saved.parent.name}/{saved.name}" in output, output


def mark_regressed(root, run_ids: list[str], verdict: str = "regressed") -> None:
    """As the pytest gate saves a run it judged regressed (or ``verdict``): the verdict in each scenario's record."""
    for run_id in run_ids:
        path = root / MACHINE / f"{run_id}.json"
        data = json.loads(path.read_text())
        for bench in data["benchmarks"]:
            bench["extra_info"]["gate"] = {"verdict": verdict, "change": -0.2 if verdict == "regressed" else 0.0}
        path.write_text(json.dumps(data))


def test_a_regressed_run_is_no_baseline_until_accepted_and_then_its_level_is_the_baseline(tmp_path, capsys):
    storage = tmp_path / "storage"
    ids = save_runs(storage, [1000.0 * (1 + 0.003 * (i % 3)) for i in range(6)] + [800.0] * 4)
    mark_regressed(storage, ids[6:10])  # a slower commit, gated four times (three retries), each run saved
    mark_regressed(storage, ids[2:3], "unchanged")
    latest = storage / MACHINE / f"{ids[9]}.json"
    gate = ("gate", latest, "--storage", storage, "--format", "json", "--min-runs", "3")
    # a fourth try is judged against the runs before the regression, not against its retries
    code, out, err = run_cli(capsys, *gate)
    verdicts = json.loads(out)
    assert code == 1 and all(v["verdict"] == "regressed" for v in verdicts), out
    assert all(not set(v["baseline_runs"]) & set(ids[6:9]) for v in verdicts), out
    assert "3 run(s) judged regressed left out until accepted (0007, 0008, 0009; `pytest-gpucolloc accept RUN`" \
        in " ".join(verdicts[0]["notes"])
    assert "`pytest-gpucolloc accept 0010` makes it the new level" in err
    # a run the gate did not judge regressed, or a file that is not a run of this storage: refused, nothing listed
    code, out, err = run_cli(capsys, "accept", "0003", "--storage", storage)
    assert code == 2 and "accept takes a run the gate judged regressed, and 0003_run was not" in err, out + err
    for outside in (tmp_path / "elsewhere.json", Path("/etc/passwd")):
        outside.exists() or outside.write_text("{}")
        assert run_cli(capsys, "forget", str(outside), "--storage", storage)[0] == 2
    assert not (storage / forget.FILE).exists() and not (storage / forget.ACCEPTED).exists()
    # the change is intended: accepting the first slower run makes its level the baseline, retries included
    code, out, err = run_cli(capsys, "accept", "0007", "--why", "a larger model", "--storage", storage)
    assert code == 0 and "accepted as the new level" in out and f"{MACHINE}/{ids[6]}.json" in out
    code, out, err = run_cli(capsys, *gate)
    verdicts = json.loads(out)
    assert code == 0 and all(v["verdict"] == "unchanged" and v["baseline_runs"] == ids[6:9] for v in verdicts), out
    assert "6 run(s) before the level accepted at 0007_run (`pytest-gpucolloc accept`) left out" \
        in " ".join(verdicts[0]["notes"])
    # the accepted run gated again (a CI job re-run): still slower than the level before it, but not a failure
    code, out, err = run_cli(capsys, "gate", storage / MACHINE / f"{ids[6]}.json", "--storage", storage, "--min-runs", "3")
    assert code == 0 and "regressed" in out and "0007_run was accepted as the new level on " in out, out + err
    assert "makes it the new level" not in out + err  # not told to accept it again
    # another file of the accepted run's name, slower than the new level: judged against it, not accepted
    slower = save_runs(tmp_path / "slower", [640.0] * 10)
    elsewhere = tmp_path / "elsewhere" / f"{ids[6]}.json"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes((tmp_path / "slower" / MACHINE / f"{slower[9]}.json").read_bytes())
    code, out, err = run_cli(capsys, "gate", elsewhere, "--storage", storage, "--min-runs", "3")
    assert code == 1 and "was accepted" not in out + err, out + err
    assert run_cli(capsys, "accept", "0007", "0007", "--storage", storage)[0] == 0  # again, without a reason
    code, out, err = run_cli(capsys, "accept", "--list", "--storage", storage, "--format", "json")
    assert [row["why"] for row in json.loads(out)] == ["a larger model"]  # the reason given before stays
    # taken back, the slower runs are regressions again; the files were never touched
    assert run_cli(capsys, "accept", "--undo", "0007", "--storage", storage)[0] == 0
    assert run_cli(capsys, *gate)[0] == 1
    assert all(json.loads((storage / MACHINE / f"{i}.json").read_text())["benchmarks"] for i in ids)


GPU_BOUND = Path(__file__).resolve().parent / "data" / "gpu-bound-history" / MACHINE  # 0007: a real -3.7%, gated


def nightly_folders(storage: Path, folders: list[str]) -> None:
    """The real history saved with --benchmark-save=nightly in each of ``folders``: runs of the same ids, each
    folder's a millisecond after the one before (another machine's runs, not copies of them)."""
    for k, folder in enumerate(folders):
        (storage / folder).mkdir(parents=True)
        for number, path in enumerate(sorted(GPU_BOUND.glob("*.json")), 1):
            data = json.loads(path.read_text())
            data["datetime"] = (datetime.fromisoformat(data["datetime"]) + timedelta(milliseconds=k)).isoformat()
            (storage / folder / f"{number:04d}_nightly.json").write_text(json.dumps(data))


def test_accepting_a_run_accepts_its_file_not_another_folders_run_of_the_same_id(tmp_path, capsys):
    nightly_folders(tmp_path, ["A", "B"])
    assert run_cli(capsys, "accept", tmp_path / "A" / "0007_nightly.json", "--storage", tmp_path)[0] == 0
    code, out, err = run_cli(capsys, "gate", tmp_path / "B" / "0007_nightly.json", "--storage", tmp_path)
    assert code == 1 and "was accepted" not in out + err, out + err  # it passed as accepted
    assert f"`pytest-gpucolloc accept {tmp_path / 'B' / '0007_nightly.json'}` makes it" in out  # its id names two
    code, out, err = run_cli(capsys, "gate", tmp_path / "A" / "0007_nightly.json", "--storage", tmp_path)
    assert code == 0 and "0007_nightly was accepted as the new level on " in out, out + err
    # set aside, likewise: the other folder's run stays in the history
    assert run_cli(capsys, "forget", tmp_path / "A" / "0006_nightly.json", "--storage", tmp_path)[0] == 0
    assert sorted(str(r.path.relative_to(tmp_path)) for r in history.load(tmp_path).runs if r.run_id == "0006_nightly") \
        == ["B/0006_nightly.json"]


def test_a_run_saved_without_the_gate_is_accepted_as_the_gate_says_it_can_be(tmp_path, capsys):
    """Its regression was found by `pytest-gpucolloc gate`: the pytest gate saved no verdict in it (no --colloc-gate),
    so later baselines hold it, and accept takes it (it refused: "was not judged regressed")."""
    nightly_folders(tmp_path, [MACHINE])
    for path in (tmp_path / MACHINE).iterdir():
        data = json.loads(path.read_text())
        for bench in data["benchmarks"]:
            bench["extra_info"].pop("gate", None)
        path.write_text(json.dumps(data))
    code, out, err = run_cli(capsys, "gate", "--storage", tmp_path)
    assert code == 1 and "stays out of later baselines" not in out, out + err  # not true of this run
    assert "saved without a verdict of the gate (--colloc-gate), this run is part of later baselines: if the change " \
           "is intended, `pytest-gpucolloc accept 0007` starts the level at it" in " ".join(out.split()), out
    code, out, err = run_cli(capsys, "accept", "0007", "--storage", tmp_path)
    assert code == 0 and f"{MACHINE}/0007_nightly.json" in out, out + err
    assert "0007_nightly carries no verdict of the gate (saved without --colloc-gate): accepted all the same" in err
    assert run_cli(capsys, "gate", "--storage", tmp_path)[0] == 0
    code, out, err = run_cli(capsys, "accept", "--list", "--storage", tmp_path, "--format", "json")
    assert [row["why"] for row in json.loads(out)] == [None]  # no reason given: null, not "-"


def test_a_list_of_a_storage_that_does_not_exist_is_exit_3_and_a_reason_needs_a_run(tmp_path, capsys):
    for argv in (["forget", "--list"], ["accept", "--list"], ["accept"], ["forget", "--undo", "0001"]):
        code, out, err = run_cli(capsys, *argv, "--storage", tmp_path / "nonexist")
        assert code == 3 and out == "" and f"error: no storage folder {tmp_path / 'nonexist'}: check --storage" in err
    save_runs(tmp_path, [1000.0] * 2)
    for argv, said in ((["forget", "--why", "x"], "--why needs the runs it is for"),
                       (["accept", "--undo"], "--undo needs the runs it is for")):
        code, out, err = run_cli(capsys, *argv, "--storage", tmp_path)
        assert code == 2 and out == "" and said in err, out + err


def test_an_id_that_also_names_an_ab_arm_compares_the_ordinary_run_only(tmp_path, capsys):
    """``0006`` names the ordinary run 0006 and an A/B arm's 0006 (an older A/B saved into this storage): the
    comparison takes the ordinary run, not both mixed."""
    storage = tmp_path / "storage"
    save_runs(storage, [1000.0] * 7)
    add_ab_arms(storage, 600.0, "05abcdef")  # 0006_ab-...-baseline, 0007_ab-...-candidate
    code, out, err = run_cli(capsys, "compare", "--runs-ids", "0005", "0006", "--storage", storage, "--format", "json")
    assert code == 0, out + err
    assert all(abs(row["change"]) < 0.01 and row["baseline_runs"] == ["0005_run"] for row in json.loads(out)), out
    assert "compared as named" not in err


def test_the_runs_of_an_abs_own_storage_are_compared_when_named(tmp_path, capsys):
    """An A/B's storage holds only its arms' runs, all left out of a history: named by id they are compared (it
    said "no saved runs" before); unnamed, the error says to name them."""
    storage = tmp_path / "storage"
    save_runs(storage, [1000.0])
    arms = add_ab_arms(storage, 600.0, "00abcdef", marked=True)
    (storage / MACHINE / "0001_run.json").unlink()
    code, out, err = run_cli(capsys, "compare", "--runs-ids", "0006", "0007", "--storage", storage, "--format", "json")
    assert code == 0, out + err
    assert len(json.loads(out)) >= 1, out
    assert f"note: {arms[0]} is compared as named, though an experiment (the baseline arm" in err, err
    code, out, err = run_cli(capsys, "table", "--storage", storage)
    assert code == 3 and "every saved run under" in err and "name one by its id" in err, err
    assert run_cli(capsys, "table", "0007", "--storage", storage)[0] == 0
