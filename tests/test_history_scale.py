"""History at scale: the storage walked without recursion and within limits, the index beside the saved files
(used, noticed stale, rebuilt, shared by concurrent writers), change points as before, and the recent window."""
import json
import math
import random
import shutil
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from pytest_gpucolloc import changepoints, cli, gate, history, history_shifts, index
from test_cli import run_cli
from test_plugin import FAST, SCENARIOS, TINY

DATA = Path(__file__).resolve().parent / "data"  # cut from real runs: data/README.md
TEMPLATE = next((DATA / "aa-history").rglob("0001_*.json"))
RUNS = history.INDEX_FROM + 6  # enough for the index to be kept


def save_runs(root: Path, count: int = RUNS, seed: int = 5) -> list[Path]:
    """``count`` saved runs of the real template's scenarios, rounds 0.3% apart, a run-to-run spread of 1% and a
    level shift of -5% two thirds in; one file each, in pytest-benchmark's layout."""
    rng = random.Random(seed)
    folder = root / "Linux-CPython-3.12-64bit"
    folder.mkdir(parents=True, exist_ok=True)
    template = json.loads(TEMPLATE.read_text())
    paths = []
    for i in range(count):
        data = json.loads(json.dumps(template))
        data["datetime"] = f"2026-11-{1 + i // 24:02d}T{i % 24:02d}:00:00"
        data["commit_info"]["id"] = f"{i:04d}abcdef"
        level = 600.0 * (0.95 if i >= 2 * count // 3 else 1.0) * math.exp(rng.gauss(0, 0.01))
        for bench in data["benchmarks"]:
            bench["extra_info"]["aggregate_round_throughputs"] = [level * math.exp(rng.gauss(0, 0.003))
                                                                  for _ in range(6)]
            bench["extra_info"].pop("repeats", None)
        paths.append(folder / f"{i + 1:04d}_run.json")
        paths[-1].write_text(json.dumps(data))
    return paths


def answers(loaded: history.History) -> dict:
    """What the commands say of a history: its change points, and the gate's verdict on each run."""
    points, looked = history_shifts.find(loaded)
    verdicts = {}
    for run in loaded.runs:
        before = {r.path for r in loaded.runs if r.datetime >= run.datetime}
        for name in run.scenarios:
            verdicts[(run.run_id, name)] = gate.decide(run.sample(name), loaded.samples(name, exclude=before)).to_dict()
    return {"points": [p.to_dict() | {"run": None} for p in points], "looked": looked, "verdicts": verdicts,
            "runs": [(r.run_id, r.datetime, r.commit, r.machine, list(r.scenarios)) for r in loaded.runs]}


# --- the storage walk -------------------------------------------------------------------------------------------


@pytest.fixture
def deep_storage(tmp_path):
    """A storage with one saved run, and beside it a folder tree 1,100 levels deep (deeper than Python's recursion
    limit), removed afterwards bottom up (shutil.rmtree recurses too)."""
    storage = tmp_path / "storage"
    save_runs(storage, count=2)
    folders = [storage / "deep"]
    folders[0].mkdir()
    for _ in range(1100):
        folders.append(folders[-1] / "d")
        folders[-1].mkdir()
    (folders[-1] / "0099_lost.json").write_text(TEMPLATE.read_text())
    yield storage
    (folders[-1] / "0099_lost.json").unlink()
    for folder in reversed(folders):
        folder.rmdir()


def test_a_storage_tree_deeper_than_the_recursion_limit_is_walked_and_what_lies_too_deep_is_named(deep_storage):
    loaded = history.load(deep_storage)
    assert [run.run_id for run in loaded.runs] == ["0001_run", "0002_run"]
    skipped = [p for p in loaded.problems if "levels below" in p]
    assert len(skipped) == 1 and f"more than {index.MAX_DEPTH} levels below {deep_storage}" in skipped[0]


def test_the_history_command_reads_a_storage_with_a_tree_too_deep(deep_storage, capsys):
    assert cli.main(["history", "--storage", str(deep_storage)]) == 0
    out, err = capsys.readouterr()
    assert "1 series" in out and "levels below" in err and "Traceback" not in err


def test_a_gated_run_beside_a_tree_too_deep_is_measured_judged_and_saved(deep_storage, pytester):
    pytester.makepyfile(tiny_workload=TINY, test_scenarios=SCENARIOS.format(sleep=0.001))
    result = pytester.runpytest_subprocess("--gpu-mode=naive", "--colloc-device=cpu", "--benchmark-autosave",
                                           f"--benchmark-storage=file://{deep_storage}", "--colloc-gate", "-k",
                                           "naive-1", *FAST, timeout=240)
    assert result.ret == 0 and "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines([f"*history: 1 folder(s) more than {index.MAX_DEPTH} levels below*skipped*"])
    saved = [path for path in deep_storage.glob("*/*.json") if path.parent.name.startswith("Linux")]
    assert len(saved) == 3  # the two saved before, and this run
    judged = [json.loads(path.read_text()) for path in saved if "unversioned" in path.name]
    assert judged[0]["benchmarks"][0]["extra_info"]["gate"]["verdict"] == "no baseline"


def test_the_walk_stops_at_its_file_limit_and_says_so(tmp_path, monkeypatch):
    save_runs(tmp_path, count=5)
    monkeypatch.setattr(index, "MAX_FILES", 3)
    found, skipped = index.walk(tmp_path)
    assert len(found) == 3 and skipped == [f"{tmp_path}: more than 3 saved files; the rest skipped"]


def test_a_link_back_to_a_folder_walked_is_not_walked_again(tmp_path):
    save_runs(tmp_path / "storage", count=2)
    (tmp_path / "storage" / "loop").symlink_to(tmp_path / "storage")  # walked into, it would never end
    found, skipped = index.walk(tmp_path / "storage")
    assert [f.key for f in found] == ["Linux-CPython-3.12-64bit/0001_run.json", "Linux-CPython-3.12-64bit/0002_run.json"]
    assert skipped == []


def test_a_machine_folder_linked_into_the_storage_is_read_through_the_link(tmp_path, capsys):
    """A machine folder kept elsewhere and linked in (pytest-benchmark saves through the link): it was skipped, and
    the gate said the storage held no runs."""
    real = shutil.copytree(DATA / "gpu-bound-history", tmp_path / "elsewhere") / "Linux-CPython-3.12-64bit"
    storage = tmp_path / "storage"
    storage.mkdir()
    (storage / real.name).symlink_to(real)
    (real / "up").symlink_to(storage)  # a loop through the link: each run is still read once
    code, out, err = run_cli(capsys, "gate", "--storage", storage, "--format", "json")
    assert code == cli.NEGATIVE and [row["verdict"] for row in json.loads(out)] == ["regressed"], out + err
    code, out, err = run_cli(capsys, "history", "--storage", storage, "--format", "json")
    assert [series["runs"] for series in json.loads(out)["series"]] == [7], out + err
    # set aside through the link, by its path in the storage: left out (its key is the link's path)
    assert run_cli(capsys, "forget", storage / real.name / next(real.glob("0007_*")).name, "--storage", storage)[0] == 0
    assert run_cli(capsys, "gate", "--storage", storage)[1].startswith("gate: 0006_")


# --- the index ----------------------------------------------------------------------------------------------------


def test_an_indexed_history_says_what_the_saved_files_say(tmp_path):
    save_runs(tmp_path)
    direct = answers(history.load(tmp_path, use_index=False))
    assert not (tmp_path / index.NAME).exists()
    assert answers(history.load(tmp_path)) == direct  # builds the index
    assert (tmp_path / index.NAME).exists()
    again = history.load(tmp_path)
    assert all(isinstance(run.scenarios, history._Scenarios) for run in again.runs)  # from the index this time
    assert answers(again) == direct
    assert len(direct["points"]) == 1 and direct["points"][0]["run_id"] == f"{2 * RUNS // 3 + 1:04d}_run"


def test_a_small_storage_keeps_no_index(tmp_path):
    save_runs(tmp_path, count=history.INDEX_FROM - 1)
    history.load(tmp_path)
    assert not (tmp_path / index.NAME).exists()


def test_a_changed_or_removed_file_is_noticed(tmp_path):
    paths = save_runs(tmp_path)
    history.load(tmp_path)
    data = json.loads(paths[-1].read_text())
    for bench in data["benchmarks"]:
        bench["extra_info"]["aggregate_round_throughputs"] = [100.0] * 6
    paths[-1].write_text(json.dumps(data))  # another size and time
    paths[0].unlink()
    loaded = history.load(tmp_path)
    assert len(loaded.runs) == RUNS - 1 and loaded.runs[0].run_id == "0002_run"
    name = next(iter(loaded.runs[-1].scenarios))
    assert loaded.runs[-1].sample(name).rounds == (100.0,) * 6
    with sqlite3.connect(tmp_path / index.NAME) as kept:
        assert kept.execute("SELECT COUNT(*) FROM files").fetchone()[0] == RUNS - 1


@pytest.mark.parametrize("damage", ["garbage", "truncated", "another shape"])
def test_a_damaged_index_is_rebuilt_never_trusted(tmp_path, damage):
    save_runs(tmp_path)
    direct = answers(history.load(tmp_path, use_index=False))
    history.load(tmp_path)
    kept = tmp_path / index.NAME
    if damage == "garbage":
        kept.write_bytes(b"not a database" * 1000)
    elif damage == "truncated":
        kept.write_bytes(kept.read_bytes()[:3000])
    else:  # an SQLite file whose rows are not what the index keeps
        with sqlite3.connect(kept) as connection:
            connection.execute("UPDATE files SET run = '{\"scenarios\": 3}', samples = '[]'")
    assert answers(history.load(tmp_path)) == direct
    with sqlite3.connect(kept) as connection:  # a sound index again
        rows = connection.execute("SELECT run FROM files").fetchall()
    assert len(rows) == RUNS and all(json.loads(run)[0].endswith("_run") for (run,) in rows)


def test_concurrent_jobs_reading_one_storage_share_its_index(tmp_path):
    """Four processes load a storage at once, as CI jobs sharing it would: each reads every run, and the index they
    leave holds every file once."""
    save_runs(tmp_path)
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})\n"
            "from pathlib import Path\nfrom pytest_gpucolloc import history\n"
            f"loaded = history.load(Path({str(tmp_path)!r}))\n"
            "print(len(loaded.runs), [p for p in loaded.problems])")
    jobs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    said = [job.communicate(timeout=120)[0].strip() for job in jobs]
    assert said == [f"{RUNS} []"] * 4 and all(job.returncode == 0 for job in jobs)
    with sqlite3.connect(tmp_path / index.NAME) as kept:
        assert kept.execute("SELECT COUNT(*), COUNT(DISTINCT path) FROM files").fetchone() == (RUNS, RUNS)


def test_a_locked_index_is_not_waited_for_forever(tmp_path, monkeypatch):
    save_runs(tmp_path)
    history.load(tmp_path)
    monkeypatch.setattr(index, "BUSY_S", 0.1)
    with sqlite3.connect(tmp_path / index.NAME, isolation_level=None) as other:
        other.execute("BEGIN EXCLUSIVE")  # another job writing it
        loaded = history.load(tmp_path)
        other.execute("ROLLBACK")
    assert len(loaded.runs) == RUNS and any("not used" in p and "locked" in p for p in loaded.problems)


# --- change points: the answers of before ----------------------------------------------------------------------


def _pelt_in_python(values: list[float], min_runs: int) -> list[int]:
    """The candidates as they were found before: ruptures' Pelt with its Python L2 cost."""
    import statistics

    import ruptures

    diffs = [b - a for a, b in zip(values, values[1:])]
    centre = statistics.median(diffs)
    noise = max(1.4826 * statistics.median(abs(d - centre) for d in diffs) / math.sqrt(2), 1e-6)
    signal = np.asarray(values).reshape(-1, 1) / noise
    return ruptures.Pelt(model="l2", min_size=min_runs, jump=1).fit(signal).predict(pen=2 * math.log(len(values)))[:-1]


def _robust_p_one_by_one(before: list[float], after: list[float]) -> float:
    """The robust p as it was computed before: a Welch test per run left out."""
    import statistics

    from scipy import stats

    def welch(b, a):
        if statistics.pvariance(b) == 0 and statistics.pvariance(a) == 0:
            return 0.0 if b[0] != a[0] else 1.0
        with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a side of one run, nearly equal runs
            return float(stats.ttest_ind(b, a, equal_var=False).pvalue)

    ps = [welch(before, after)]
    ps += [welch(before[:i] + before[i + 1:], after) for i in range(len(before))]
    ps += [welch(before, after[:i] + after[i + 1:]) for i in range(len(after))]
    return max(ps)


def _series() -> list[list[float]]:
    """Every real series of the saved H200 histories in tests/data, and longer ones with shifts."""
    found = [[p.log_level for p in points] for folder in sorted(DATA.iterdir()) if folder.is_dir()
             for points in history_shifts.series(history.load(folder)).values()]
    rng = random.Random(11)
    for runs in (40, 120, 300):
        levels = [rng.choice([1.0, 0.97, 1.04]) for _ in range(6)]
        found.append([math.log(levels[i * 6 // runs]) + rng.gauss(0, 0.01) for i in range(runs)])
    return found


def test_change_point_candidates_are_those_of_the_python_pelt():
    for values in _series():
        for min_runs in (2, 3):
            if changepoints.can_hold_a_shift(len(values), min_runs):
                assert changepoints._candidates(values, min_runs) == _pelt_in_python(values, min_runs)


@pytest.mark.parametrize("starts", [[750, 1250, 2600], [500, 1000, 1499, 2990]])
def test_a_long_series_searched_in_blocks_finds_each_shift_where_it_starts(starts):
    """Past ``BLOCK`` runs the series is searched in overlapping blocks: shifts at the edges of the blocks' kept
    halves, of the blocks themselves and at the series' end are found where they start, and nothing else."""
    rng = random.Random(4)
    level, values = 0.0, []
    for i in range(3000):
        level += 0.03 * (i in starts) * (1 if len(values) % 2 else -1)
        values.append(level + rng.gauss(0, 0.005))
    assert changepoints.shifts(values) == starts


def test_the_robust_p_is_that_of_a_welch_test_per_run_left_out():
    rng = random.Random(2)
    pairs = [(values[:k], values[k:]) for values in _series() if 4 <= len(values) <= 40  # a Welch test per run: slow
             for k in sorted({2, len(values) // 3, len(values) // 2, len(values) - 2})]
    pairs += [([1.0, 1.0, 1.0], [2.0, 2.0, 2.0]), ([1.0, 1.0, 1.0], [1.0, 1.0, 1.0]), ([1.0, 1.0, 3.0], [2.0, 2.0]),
              ([1.0, 1.1], [1.2, 1.3, 1.25]), ([5.0, 5.0, 5.0, 5.2], [5.1, 5.1, 5.1])]
    pairs += [([rng.gauss(0, 1) for _ in range(rng.randint(2, 9))], [rng.gauss(1, 2) for _ in range(rng.randint(2, 9))])
              for _ in range(60)]
    for before, after in pairs:
        assert changepoints.robust_p(before, after) == pytest.approx(_robust_p_one_by_one(before, after),
                                                                      rel=1e-9, abs=1e-300)


# --- the gate reads the newest runs; the commands show the recent window ---------------------------------------


def test_the_gate_reads_only_the_newest_runs_it_judges_by(tmp_path):
    save_runs(tmp_path)
    history.load(tmp_path)  # builds the index
    loaded = history.load(tmp_path)
    name = next(iter(loaded.runs[0].scenarios))
    newest = loaded.samples(name, exclude={loaded.runs[-1].path}, last=10)
    assert [s.run_id for s in newest] == [r.run_id for r in loaded.runs[-11:-1]]
    assert all(r.stored is not None for r in loaded.runs[:-12])  # the older runs' samples were never read


def test_history_shows_the_recent_runs_and_sums_up_older_shifts(tmp_path, capsys, monkeypatch):
    save_runs(tmp_path)
    assert cli.main(["history", "--storage", str(tmp_path), "--last", "10"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"0 level shift(s) in the last 10 of {RUNS} runs in 1 series")
    assert f"1 older level shift(s), before the 10 runs shown of {RUNS}" in out
    assert f"at {2 * RUNS // 3 + 1:04d} (2026-11-" in out
    monkeypatch.setenv("COLUMNS", "100")  # a terminal: the shift's table fits it, its run named by number
    assert cli.main(["history", "--storage", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = lines[lines.index(next(line for line in lines if line.startswith("scenario "))):]
    assert max(map(len, table[:3])) <= 100 and table[2].split()[1].isdigit(), "\n".join(lines)  # 0047, not a path
    assert any(line.startswith("left out to fit 100 characters: ") for line in table)
    assert cli.main(["history", "--storage", str(tmp_path), "--since", "2026-11-02", "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["runs_shown"] == RUNS - 24 and len(shown["change_points"]) == 1 and shown["older_change_points"] == []
    assert cli.main(["history", "--storage", str(tmp_path), "--since", "yesterday"]) == 2
    assert "is not a date" in capsys.readouterr().err


def test_the_history_figures_draw_the_recent_runs_and_name_the_older(tmp_path, capsys):
    save_runs(tmp_path)
    note = f"{RUNS - 20} older run(s) not drawn (--last, --since): level shifts -"
    assert cli.main(["report", "--storage", str(tmp_path), "--last", "20", "--out", str(tmp_path / "report")]) == 0
    page = (tmp_path / "report" / "index.html").read_text()
    assert page.count(note) == 1
    assert "<p class=answer>" in page and "<h2>Scaling" in page  # the storage's latest run, as every command takes it
    assert cli.main(["plot", "--storage", str(tmp_path), "--last", "20", "--out", str(tmp_path / "plots")]) == 0
    assert capsys.readouterr().out.count(note) == 1
    assert cli.main(["plot", "--storage", str(tmp_path), "--last", "0", "--out", str(tmp_path / "all")]) == 0
    assert "not drawn" not in capsys.readouterr().out
