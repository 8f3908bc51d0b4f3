"""The console command's convention (docs/cli.md): formats, exit codes, storage as pytest takes it, help, no
tracebacks; and compare's output field by field."""
import argparse
import dataclasses
import json
import math
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_gpucolloc import __version__, cli, gate

DATA = Path(__file__).resolve().parent / "data"  # cut from real runs: data/README.md
TEMPLATE = next((DATA / "aa-history").rglob("0001_*.json"))
ADVISE_RUN = DATA / "advise-run.json"


def save_runs(root: Path, levels: list[float], drivers: list[str] | None = None) -> list[str]:
    """Saved runs at these throughput levels (rounds 0.2% apart), one file each, in pytest-benchmark's layout;
    their run ids."""
    rng = random.Random(7)
    folder = root / "Linux-CPython-3.12-64bit"
    folder.mkdir(parents=True, exist_ok=True)
    template = json.loads(TEMPLATE.read_text())
    ids = []
    for i, level in enumerate(levels):
        data = json.loads(json.dumps(template))
        data["datetime"] = f"2026-11-20T{i:02d}:00:00"
        data["commit_info"]["id"] = f"{i:02d}abcdef"
        if drivers:
            data["machine_info"]["gpucolloc"]["driver_version"] = drivers[i]
        for bench in data["benchmarks"]:
            bench["extra_info"]["aggregate_round_throughputs"] = [level * math.exp(rng.gauss(0, 0.002)) for _ in range(6)]
            bench["extra_info"].pop("repeats", None)
        ids.append(f"{i + 1:04d}_run")
        (folder / f"{ids[-1]}.json").write_text(json.dumps(data))
    return ids


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_compare_json_reports_every_field_of_a_paired_verdict(tmp_path, capsys):
    # sessions alternated A B A B A B: each B run is judged against the A runs on either side of it
    levels = [600.0, 582.0, 600.0, 582.0, 600.0, 582.0]
    drivers = ["570.86", "580.159"] * 3
    ids = save_runs(tmp_path, levels, drivers)
    code, out, _ = run_cli(capsys, "compare", "--group-by", "driver_version", "--groups", "570.86", "580.159",
                           "--storage", tmp_path, "--format", "json")
    rows = json.loads(out)
    assert code == 1 and rows
    defaults = {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                for f in dataclasses.fields(gate.Verdict) if f.name != "verdict"}
    set_here = {"reason", "baseline", "current", "change", "ci", "mde", "threshold", "baseline_runs"}
    for row in rows:
        assert set(row) == {"scenario", "verdict", *defaults}
        assert row["scenario"].startswith("benchmarks/") or "::" in row["scenario"]
        assert row["verdict"] == "regressed"
        assert row["reason"].startswith("paired: 3 runs, each against the runs on either side of it")
        assert row["baseline"] == pytest.approx(600.0, rel=1e-3)
        assert row["current"] == pytest.approx(582.0, rel=1e-3)
        assert row["change"] == pytest.approx(-0.03, abs=2e-3)
        low, high = row["ci"]
        assert low <= row["change"] <= high < 0
        assert isinstance(row["mde"], float) and 0 < row["mde"] < 0.03
        assert row["threshold"] == 0.02  # the policy's threshold, not run ids
        assert row["baseline_runs"] == ids[0::2]  # the before runs, not an empty list
        for name, default in defaults.items():
            if name not in set_here:
                assert row[name] == default, name


def test_compare_of_one_run_against_one_says_the_change_and_what_a_decision_needs(tmp_path, capsys):
    ids = save_runs(tmp_path, [600.0, 570.0])
    code, out, _ = run_cli(capsys, "compare", "--runs-ids", ids[0], ids[1], "--storage", tmp_path, "--format", "json")
    assert code == 0
    for row in json.loads(out):
        assert row["verdict"] == "no baseline"
        assert row["change"] == pytest.approx(row["current"] / row["baseline"] - 1) == pytest.approx(-0.05, abs=4e-3)
        assert row["baseline"] == pytest.approx(600.0, rel=4e-3) and row["current"] == pytest.approx(570.0, rel=4e-3)
        assert row["baseline_runs"] == [ids[0]]
        assert f"changed {row['change']:+.1%}" in row["reason"] and "not a verdict" in row["reason"]
        assert "more runs" in row["reason"] and "pytest-gpucolloc ab" in row["reason"]
        assert "in the history" not in row["reason"]  # two runs named: no history was asked for


def test_compare_of_runs_that_share_no_scenario_says_so(tmp_path, capsys):
    ids = save_runs(tmp_path, [600.0, 570.0])
    path = tmp_path / "Linux-CPython-3.12-64bit" / f"{ids[1]}.json"
    data = json.loads(path.read_text())
    for bench in data["benchmarks"]:
        bench["fullname"] += "-renamed"
    path.write_text(json.dumps(data))
    code, out, err = run_cli(capsys, "compare", ids[0], ids[1], "--storage", tmp_path)
    assert code == 2 and "0001_run and 0002_run share no scenario: nothing to compare" in err, out + err


def test_compare_names_runs_as_gate_does_by_id_file_or_storage_folder(tmp_path, capsys):
    ids = save_runs(tmp_path, [600.0, 570.0])
    folder = tmp_path / "Linux-CPython-3.12-64bit"
    answers = []
    for before, after in ((ids[0], ids[1]), (folder / f"{ids[0]}.json", folder / f"{ids[1]}.json"),
                          (f"{ids[0][:4]}", tmp_path)):  # a storage folder names its latest run
        code, out, err = run_cli(capsys, "compare", before, after, "--storage", tmp_path, "--format", "json")
        assert code == 0, err
        answers.append(json.loads(out))
    assert answers[0] == answers[1] == answers[2] and answers[0][0]["baseline_runs"] == [ids[0]]
    code, _, err = run_cli(capsys, "compare", folder / "0009_missing.json", ids[1], "--storage", tmp_path)
    assert code == cli.USAGE and "0009_missing.json" in err and "Traceback" not in err
    # two files need no storage; two storages' runs of one file name are two runs
    files = [folder / f"{run}.json" for run in ids]
    assert run_cli(capsys, "compare", *files, "--storage", tmp_path / "nowhere")[0] == 0
    other = tmp_path / "other" / folder.name
    other.mkdir(parents=True)
    (other / f"{ids[0]}.json").write_bytes(files[1].read_bytes())
    code, out, err = run_cli(capsys, "compare", files[0], other / f"{ids[0]}.json", "--storage", tmp_path)
    assert code == 0 and "same run" not in err, err
    shutil.rmtree(tmp_path / "other")
    # a storage whose every run is left out names no latest run: said, not a traceback
    assert run_cli(capsys, "forget", ids[0], ids[1], "--storage", tmp_path)[0] == 0
    code, _, err = run_cli(capsys, "compare", tmp_path, files[1], "--storage", tmp_path)
    assert code == cli.NOTHING_TO_READ and "left out of the history" in err and "Traceback" not in err, err
    code, _, err = run_cli(capsys, "gate", ids[1], "--storage", tmp_path)
    assert code == cli.NOTHING_TO_READ and "nothing to judge against" in err, err


def test_two_storage_folders_compared_need_no_storage_here(tmp_path, capsys, monkeypatch):
    save_runs(tmp_path / "before", [600.0])
    save_runs(tmp_path / "after", [570.0])
    monkeypatch.chdir(tmp_path)  # no .benchmarks: never read, both runs are named
    code, out, err = run_cli(capsys, "compare", "before", "after", "--format", "json")
    assert code == 0 and all(row["change"] == pytest.approx(-0.05, abs=0.005) for row in json.loads(out)), out + err


@pytest.mark.parametrize("argv", [["gate", ""], ["compare", "", "0002"], ["compare", "--runs-ids", "0001", " "],
                                  ["table", ""], ["advise", "", "--jobs", "resnet26*2"], ["report", ""],
                                  ["plot", "--run", ""], ["forget", ""], ["accept", ""]])
def test_an_empty_run_name_is_a_usage_error_not_the_latest_run(tmp_path, capsys, monkeypatch, argv):
    """``gate "$RUN"`` with RUN unset in CI: it judged the latest run instead."""
    save_runs(tmp_path / "storage", [1000.0] * 3 + [800.0])
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, *argv, "--storage", "storage")
    assert code == cli.USAGE and out == "" and "the run named is empty (an unset variable?)" in err, out + err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["storage"]  # nothing written, no list started
    assert sorted(path.name for path in (tmp_path / "storage").iterdir()) == ["Linux-CPython-3.12-64bit"]


def test_storage_is_taken_as_pytest_takes_it_and_empty_storage_fails_loudly(tmp_path, capsys):
    ids = save_runs(tmp_path / "history", [600.0, 601.0, 599.0, 600.0])
    run = tmp_path / "history" / "Linux-CPython-3.12-64bit" / f"{ids[-1]}.json"
    code, by_path, _ = run_cli(capsys, "gate", run, "--storage", tmp_path / "history", "--format", "json")
    assert code == 0
    code, by_url, _ = run_cli(capsys, "gate", run, "--storage", f"file://{tmp_path / 'history'}", "--format", "json")
    assert code == 0 and by_url == by_path and json.loads(by_url)[0]["baseline_runs"] == ids[:3]
    # each row names the run it judged, by id and file (machine folders share ids); the title its machine folder
    assert {(row["run"], row["file"]) for row in json.loads(by_path)} == {(ids[-1], str(run))}
    code, out, _ = run_cli(capsys, "gate", run, "--storage", tmp_path / "history")
    assert out.startswith(f"gate: {ids[-1]} (Linux-CPython-3.12-64bit)"), out
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "0001_x.json").write_text(json.dumps({"benchmarks": [], "machine_info": {}}))
    for storage in (f"file://{tmp_path / 'missing'}", tmp_path / "empty", tmp_path / "other"):
        for argv in (["gate", run], ["compare", "--runs-ids", "1", "2"], ["history"], ["plot", "--out", tmp_path / "p"],
                     ["report", run, "--out", tmp_path / "r"]):
            code, out, err = run_cli(capsys, *argv, "--storage", storage)
            assert code == cli.NOTHING_TO_READ, (argv, storage, err)
            assert err.startswith("error: no ") and "check --storage" in err and "Traceback" not in err
    code, _, err = run_cli(capsys, "history", "--storage", "s3://bucket/runs")
    assert code == cli.USAGE and "file storage" in err


@pytest.mark.parametrize("argv", [
    ["gate", "{run}", "--storage", "{storage}", "--markdown", "{blocked}/gate.md"],
    ["report", "{run}", "--out", "{blocked}/report"],
    ["plot", "--storage", "{storage}", "--out", "{blocked}/plots"],
])
def test_an_output_that_cannot_be_written_is_exit_code_4_in_one_line(tmp_path, capsys, argv):
    ids = save_runs(tmp_path / "history", [600.0, 601.0, 599.0, 600.0])
    blocked = tmp_path / "a-file"
    blocked.write_text("a file where a folder would have to be")
    values = {"run": tmp_path / "history" / "Linux-CPython-3.12-64bit" / f"{ids[-1]}.json",
              "storage": tmp_path / "history", "blocked": blocked}
    code, _, err = run_cli(capsys, *[a.format(**values) for a in argv])
    assert code == cli.UNWRITABLE
    assert err.startswith("error: cannot write") and str(blocked) in err and len(err.splitlines()) == 1


def test_every_argument_has_help_and_tables_take_the_same_formats():
    def parsers(parser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from parsers(sub)

    for parser in parsers(cli.build_parser()):
        for action in parser._actions:
            if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                assert action.help, f"{parser.prog} {action.dest}"
            if "--format" in action.option_strings and parser.prog.split()[-1] != "plot":
                assert set(cli.FORMATS) <= set(action.choices), parser.prog


def test_version_and_a_top_level_description(capsys):
    assert cli.main(["--version"]) == 0 and capsys.readouterr().out.strip() == f"pytest-gpucolloc {__version__}"
    text = cli.build_parser().format_help()
    assert "console command" not in text and "exit codes" in text and "docs/cli.md" in text


@pytest.mark.parametrize("argv, code, message", [
    (["mig", "profiles", "--table", "h100"], 2, "unknown MIG table 'h100'; known: a100-40gb, a100-80gb, h100-80gb, h200"),
    (["mig", "plan", "--table", "h100", "3g"], 2, "unknown MIG table 'h100'"),
    (["mig", "plan", "--table", "h200", "3g,zz"], 2, "invalid MIG layout item 'zz'"),
    (["mig", "plan", "--table", "h200", "7g*3"], 1, None),
    (["table", "{missing}"], 2, "cannot read"),
    (["table", "{empty}"], 3, "holds no pytest-gpucolloc scenarios"),
    (["gate", "{empty}"], 3, "holds no pytest-gpucolloc scenarios"),
    (["advise", str(ADVISE_RUN), "--jobs", "nosuch*2"], 2, "unknown workload 'nosuch'"),
])
def test_bad_input_is_one_line_and_its_exit_code(tmp_path, capsys, argv, code, message):
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"benchmarks": []}))
    got, out, err = run_cli(capsys, *[a.format(missing=tmp_path / "nope.json", empty=empty) for a in argv])
    assert got == code
    if message:
        assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("fmt", cli.FORMATS)
def test_table_formats_read_back(capsys, fmt):
    run = DATA / "mixes-run.json"
    code, out, _ = run_cli(capsys, "table", run, "--format", fmt)
    assert code == 0
    if fmt == "json":
        rows = json.loads(out)
        assert rows and rows[0]["scenario"] and "aggregate_samples_per_s" in rows[0]
    elif fmt == "csv":
        assert out.splitlines()[0].startswith("scenario,")
    else:
        assert "scenario" in out.splitlines()[0]
        assert "CPU smoke" not in out  # an H200's runs
    if fmt == "table":  # CPU runs' numbers are said to be what they are
        assert run_cli(capsys, "table", DATA / "serving-cpu-run.json")[1].splitlines()[-1] == cli.common.CPU_SMOKE


def test_table_json_holds_the_saved_numbers_as_numbers(capsys):
    """Data for jq or pandas: each number as saved, its unit in the key, a share a fraction, null where not measured
    (it held the terminal's strings: "19,414", "5.8%", "1.86x")."""
    saved = json.loads((DATA / "mixes-run.json").read_text())["benchmarks"]
    code, out, _ = run_cli(capsys, "table", DATA / "mixes-run.json", "--format", "json")
    rows = json.loads(out)
    assert code == 0 and [row["scenario"] for row in rows] == [bench["name"] for bench in saved]
    for row, bench in zip(rows, saved):
        info = bench["extra_info"]
        assert row["run"] == "data/mixes-run.json" and row["gpu"] == info["gpu"]["uuid"]
        assert row["aggregate_samples_per_s"] == pytest.approx(info["aggregate_throughput"])
        assert row["per_worker_samples_per_s"] == [w["throughput"] for w in info["workers"]]
        assert row["memory_per_worker_gb"] == [w["device_memory_bytes"] / 1e9 for w in info["workers"]]
        assert [row[key] for key in ("speedup", "cv", "samples_per_joule", "rounds", "start_up_s")] == [
            info["speedup_vs_sequential"], info["aggregate_cv"], info["samples_per_joule"],
            info["measurement"]["rounds"], info["measurement"]["fixed_cost_s"]]
        assert row["efficiency"] is None and row["data_wait_share"] == [None, None] and row["throttled"] is False
    code, out, _ = run_cli(capsys, "table", DATA / "serving-cpu-run.json", "--format", "json")
    alone = json.loads(out)[0]  # the measurement alone, recorded again: no start-up of its own
    assert (alone["start_up_s"], alone["measurement_same_as"], alone["gpu"]) == (None, "alone", None)


def test_advise_takes_workload_names_as_workload_does(capsys):
    code, by_name, _ = run_cli(capsys, "advise", ADVISE_RUN, "--jobs", "resnet26/bs128*7", "--format", "json")
    _, by_label, _ = run_cli(capsys, "advise", ADVISE_RUN, "--jobs", "resnet26-cifar10/bs128*7", "--format", "json")
    assert code == 0 and json.loads(by_name) == json.loads(by_label)
    code, out, err = run_cli(capsys, "advise", ADVISE_RUN, "--jobs", "resnet26*2")  # bs32: its default batch size
    assert code in (0, 3) and "not LABEL" not in err
    code, out, _ = run_cli(capsys, "advise", ADVISE_RUN, "--jobs", "resnet26/bs128*7", "--format", "markdown")
    assert code == 0 and "| way" in out


def test_a_reader_that_stops_early_ends_the_command_quietly():
    runs = [DATA / "advise-run.json"] * 40  # over a pipe's 64 KB
    process = subprocess.Popen([sys.executable, "-m", "pytest_gpucolloc.cli", "table", *map(str, runs), "--format",
                                "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.readline().strip() == b"["
    process.stdout.close()  # as `| head -1` does
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == cli.PIPE_CLOSED
    assert stderr == ""


def test_every_command_names_runs_alike_and_defaults_to_the_latest(tmp_path, capsys, monkeypatch):
    """A run is a file, its id or NNNN number in --storage, or a storage folder (its latest), for gate, table and
    advise alike; none named: the storage's latest run. compare --commits takes git revisions. table prints a table, as every command does."""
    storage = tmp_path / "storage"
    ids = save_runs(storage, [1000.0] * 4)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "gate", "0004", "--storage", storage)
    assert code == 0 and out.startswith(f"gate: {ids[3]}"), out + err
    assert run_cli(capsys, "gate", "--storage", storage)[1].startswith(f"gate: {ids[3]}")  # the latest
    assert run_cli(capsys, "gate", "4", "--storage", storage)[1].startswith(f"gate: {ids[3]}")  # 4 is 0004
    assert run_cli(capsys, "gate", "--storage", storage, "0009")[0] == 2
    # a storage folder named as the run: its latest, judged against that folder's history
    code, out, err = run_cli(capsys, "gate", storage)
    assert code == 0 and out.startswith(f"gate: {ids[3]}") and "no baseline" not in out, out + err
    code, by_folder, _ = run_cli(capsys, "table", storage, "--format", "json")
    code, out, err = run_cli(capsys, "table", "0002", "--storage", storage)
    assert code == 0 and out.splitlines()[1].startswith("----"), out  # a plain table, not Markdown
    code, out, err = run_cli(capsys, "table", "0002", "0004", "--storage", storage)  # each row's run, by its number
    assert code == 0 and [line.split()[:2] for line in out.splitlines()[2:4]] == [["0002", "on"], ["0004", "on"]], out
    code, out, err = run_cli(capsys, "table", "0002", "0004", "--storage", storage, "--format", "json")
    assert json.loads(out)[0]["run"] == f"Linux-CPython-3.12-64bit/{ids[1]}.json"  # data: the file
    code, latest, _ = run_cli(capsys, "table", "--storage", storage, "--format", "json")
    code, by_file, _ = run_cli(capsys, "table", storage / "Linux-CPython-3.12-64bit" / f"{ids[3]}.json",
                               "--format", "json")
    assert code == 0 and json.loads(latest) == json.loads(by_file) == json.loads(by_folder)
    # commits as git names them: the saved runs' commit ids are the repository's
    git = ["git", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    shas = []
    for message in ("one", "two"):
        subprocess.run([*git, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q",
                        "--allow-empty", "-m", message], check=True)
        shas.append(subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip())
    for path, sha in zip(sorted(storage.rglob("*.json")), [shas[0]] * 2 + [shas[1]] * 2):
        data = json.loads(path.read_text())
        data["commit_info"]["id"] = sha
        path.write_text(json.dumps(data))
    code, out, err = run_cli(capsys, "compare", "--commits", "HEAD~1", "HEAD", "--storage", storage)
    # said in the order given, as typed, with the commits they name
    assert code == 0 and out.startswith(f"compare HEAD~1 ({shas[0][:10]}) -> HEAD ({shas[1][:10]}) (2 runs -> 2 runs; "
                                        "a change is HEAD against HEAD~1)"), out + err
    code, out, err = run_cli(capsys, "compare", "--commits", "HEAD", "HEAD", "--storage", storage)
    assert code == 2 and "both sides hold the same run(s) (" in err, out + err  # it said +22% of a set and itself
    for named in (["--runs-ids", "0001", "0003"], ["0001", "0003"]):  # pytest-benchmark's spelling, or as gate's
        code, out, err = run_cli(capsys, "compare", *named, "--storage", storage)
        assert code == 0 and out.startswith("compare 0001 -> 0003 (1 run -> 1 run; a change is 0003 against 0001)"), out
        assert "test_resnet152_imagenet[naive-1-32]" in out and "benchmarks/test_paper.py::" not in out, out  # as gate
    code, out, err = run_cli(capsys, "compare", "0001", "--storage", storage)
    assert code == 2 and "compare takes two runs, before then after" in err, out + err


def test_a_gate_table_fits_a_terminal_and_takes_columns(tmp_path, capsys):
    """Long reasons are numbered in the terminal's table and said in full below it (Markdown keeps them in the
    cell); --columns picks the columns as pytest-benchmark's --benchmark-columns does."""
    storage = tmp_path / "storage"
    ids = save_runs(storage, [1000.0] * 5 + [900.0])
    run = storage / "Linux-CPython-3.12-64bit" / f"{ids[-1]}.json"
    code, out, err = run_cli(capsys, "gate", run, "--storage", storage)
    assert code == 1, out + err
    table = "\n".join(out.splitlines()[:4])
    assert max(map(len, table.splitlines())) <= 170, out  # was 320 columns: every reason in its cell
    assert "[1]" in table and "beyond the baseline's run-to-run spread" not in table
    assert "regressed: why: " in out and "beyond the baseline's run-to-run spread" in out
    code, out, err = run_cli(capsys, "gate", run, "--storage", storage, "--columns", "scenario,verdict,change")
    assert out.splitlines()[1].split() == ["scenario", "verdict", "change"], out
    assert "[1]" not in out, out  # no footnote of a hidden column
    code, out, err = run_cli(capsys, "gate", run, "--storage", storage, "--format", "markdown")
    assert "[1]" not in out and "beyond the baseline's run-to-run spread" in out
    code, out, err = run_cli(capsys, "gate", run, "--storage", storage, "--columns", "scenario,nope")
    assert code == 2 and "--columns takes names among scenario,verdict," in err


def test_a_summary_table_shortens_many_workers_and_takes_columns(capsys, monkeypatch):
    run = DATA / "gpu-tests-h200-a" / "paper.json"  # seven workers of one job in a row
    monkeypatch.setenv("COLUMNS", "300")  # a terminal wide enough for every column
    code, out, _ = run_cli(capsys, "table", run)
    assert "left out" not in out
    row = next(line for line in out.splitlines() if line.startswith("test_resnet26_cifar10[mps-7-32]"))
    assert " .. " in row and "(7)" in row, row  # the per-worker range, not seven numbers
    code, out, _ = run_cli(capsys, "table", run, "--format", "json")
    row = next(r for r in json.loads(out) if r["scenario"] == "test_resnet26_cifar10[mps-7-32]")
    assert len(row["per_worker_samples_per_s"]) == 7  # JSON keeps every value
    code, out, _ = run_cli(capsys, "table", run, "--columns", "scenario,speedup,flags")
    assert out.splitlines()[0].split() == ["scenario", "speedup", "flags"] and max(map(len, out.splitlines())) < 80
    assert run_cli(capsys, "table", run, "--columns", "bogus")[0] == 2


@pytest.mark.parametrize("command", ["table", "gate"])
def test_a_table_fits_the_terminal_leaving_out_what_matters_least_and_says_how_to_show_it(command, tmp_path, capsys,
                                                                                          monkeypatch):
    """Wider than the terminal (COLUMNS, else its width, else 120 in a CI log), a table leaves out its least important
    columns, named in a line with the option that shows them; columns asked for are never left out."""
    storage = tmp_path / "storage"
    save_runs(storage, [1000.0] * 5 + [900.0])
    run = DATA / "gpu-tests-h200-a" / "paper.json" if command == "table" else "0006"
    monkeypatch.setenv("COLUMNS", "90")
    code, out, _ = run_cli(capsys, command, run, "--storage", storage)
    # was 245 (table) and 185 (gate) characters wide; only an option that cannot be broken may pass the width
    assert max(len(line) for line in out.splitlines() if " " in line.strip()) <= 90, out
    lines = out.replace("\n  ", " ").splitlines()  # the notes below the table wrap; read as one line each
    said = next(i for i, line in enumerate(lines) if line.startswith("left out to fit 90 characters: "))
    header = lines[1 if command == "gate" else 0].split()  # the gate's title first
    kept = ["scenario", "verdict", "change", "why"] if command == "gate" else ["scenario", "aggregate", "speedup"]
    assert all(name in header for name in kept), out  # what matters most stays
    dropped = lines[said].removeprefix("left out to fit 90 characters: ")
    ask = lines[said + 1].removeprefix("show them with --columns=")
    assert set(dropped.split(", ")) < set(ask.split(",")) and set(kept) < set(ask.split(",")), lines[said + 1]
    assert ("lever" if command == "gate" else "start-up") in dropped  # the least important went first
    code, out, _ = run_cli(capsys, command, run, "--storage", storage, "--columns", ask)  # as the line says
    assert "left out" not in out and len(out.splitlines()[1 if command == "gate" else 0].split()) >= len(ask.split(","))
    monkeypatch.setenv("COLUMNS", "400")
    assert "left out" not in run_cli(capsys, command, run, "--storage", storage)[1]


def test_prose_wraps_but_a_command_to_copy_never_breaks():
    from pytest_gpucolloc.table_fit import wrapped

    prose = "a regressed run stays out of later baselines until accepted: " * 3
    assert max(map(len, wrapped(prose, 60).splitlines())) <= 60 and wrapped(prose, 60).split() == prose.split()
    command = "  pytest-gpucolloc gate 0004 --columns=scenario,verdict,baseline,current,change,interval,why"
    assert wrapped(command, 60) == command and wrapped(prose, None) == prose
    indented = "  /a/path/that/is/longer/than/the/width/of/forty/characters and more words"
    assert wrapped(indented, 40).startswith("  /a/path") and wrapped(prose + "\n", 60).endswith("\n")


def test_without_a_terminal_a_table_fits_a_ci_log(monkeypatch):
    from pytest_gpucolloc import table_fit

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr("os.get_terminal_size", lambda *fd: (_ for _ in ()).throw(OSError("not a terminal")))
    assert table_fit.terminal_width() == table_fit.LOG_WIDTH == 120
    monkeypatch.setenv("COLUMNS", "77")
    assert table_fit.terminal_width() == 77


@pytest.mark.parametrize("argv, said", [
    (["gaet"], "invalid choice: 'gaet', did you mean 'gate'? (choose from"),
    (["table", "--format", "tabel"], "invalid choice: 'tabel', did you mean 'table'? (choose from"),
    (["mig", "plna", "3g"], "invalid choice: 'plna', did you mean 'plan'? (choose from"),
])
def test_a_mistyped_command_or_choice_is_answered_with_the_nearest_one(capsys, argv, said):
    assert cli.main(argv) == 2
    assert said in capsys.readouterr().err


def test_a_command_like_no_other_is_not_guessed(capsys):
    assert cli.main(["zzzz"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'zzzz' (choose from" in err and "did you mean" not in err
