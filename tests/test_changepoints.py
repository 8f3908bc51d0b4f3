"""Level shifts in saved history (``pytest-gpucolloc history``): found where a level moved and stayed, per
physical GPU; never for one odd run."""
import json
import math
import random
from pathlib import Path

import pytest

from pytest_gpucolloc import cli, history_shifts
from pytest_gpucolloc.history import SavedRun, load

DATA = Path(__file__).resolve().parent / "data"  # cut from real runs: data/README.md
TEMPLATE = next((DATA / "aa-history").rglob("0001_*.json"))


def points(levels, noise=0.005, seed=3):
    rng = random.Random(seed)
    return [history_shifts.Point(SavedRun(Path(f"{i:04d}.json"), f"{i:04d}_run", f"2026-11-{i + 1:02d}", f"c{i:03d}",
                                        {"driver_version": "580"}, {}), math.log(level) + rng.gauss(0, noise))
            for i, level in enumerate(levels)]


def test_a_level_shift_is_found_where_it_starts_with_its_size():
    found = history_shifts.detect(points([1000] * 7 + [950] * 6), "s", "GPU-a")
    assert len(found) == 1
    shift = found[0]
    assert shift.run_id == "0007_run" and shift.commit == "c007" and shift.driver == "580"
    assert shift.change == pytest.approx(-0.05, abs=0.01) and shift.p_value < 0.01
    assert (shift.runs_before, shift.runs_after) == (7, 6)


@pytest.mark.parametrize("levels", [[1000] * 13, [1000] * 6 + [850] + [1000] * 6, [1000] * 12 + [850]],
                         ids=["steady", "one-outlier-in-the-middle", "one-outlier-at-the-end"])
def test_no_shift_without_a_new_level(levels):
    assert history_shifts.detect(points(levels), "s", "GPU-a") == []


def test_two_shifts_and_a_short_series():
    found = history_shifts.detect(points([1000] * 5 + [900] * 5 + [1000] * 5), "s", "GPU-a")
    assert [p.run_id for p in found] == ["0005_run", "0010_run"]
    assert history_shifts.detect(points([1000] * 3 + [500] * 2), "s", "GPU-a") == []  # too few runs to tell


@pytest.fixture
def storage(tmp_path):
    """Runs on two physical GPUs: GPU-b's level drops after its 6th run (a driver change), GPU-a's does not."""
    template = json.loads(TEMPLATE.read_text())
    root = tmp_path / ".benchmarks" / "Linux"
    root.mkdir(parents=True)
    rng = random.Random(11)
    for i in range(12):
        for gpu in ("GPU-a", "GPU-b"):
            data = json.loads(json.dumps(template))
            data["datetime"] = f"2026-11-{i + 1:02d}T00:00:{0 if gpu == 'GPU-a' else 1:02d}"
            data["commit_info"]["id"] = f"{i:02d}abcdef"
            driver = "580.159" if gpu == "GPU-b" and i >= 6 else "570.86"
            data["machine_info"]["gpucolloc"].update(driver_version=driver, gpu_uuid=gpu)
            level = 540 if driver == "580.159" else 600
            for bench in data["benchmarks"]:
                info = bench["extra_info"]
                info["aggregate_round_throughputs"] = [level * math.exp(rng.gauss(0, 0.004)) for _ in range(10)]
                info.pop("repeats", None)
                if isinstance(info.get("gpu"), dict):
                    info["gpu"]["uuid"] = gpu
            (root / f"{2 * i + (gpu == 'GPU-b') + 1:04d}_run.json").write_text(json.dumps(data))
    return tmp_path / ".benchmarks"


def test_history_command_lists_shifts_per_physical_gpu(storage, capsys):
    assert cli.main(["history", "--storage", str(storage), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    scenarios = {s["scenario"] for s in out["series"]}
    assert {s["gpu"] for s in out["series"]} == {"GPU-a", "GPU-b"}
    assert len(out["change_points"]) == len(scenarios)  # every scenario shifted on GPU-b, none on GPU-a
    for shift in out["change_points"]:
        assert shift["gpu"] == "GPU-b" and shift["driver"] == "580.159"
        assert shift["change"] == pytest.approx(-0.10, abs=0.01) and shift["p_value"] < 0.01
    assert cli.main(["history", "--storage", str(storage), "--gpu", "GPU-a"]) == 0
    assert capsys.readouterr().out.startswith("0 level shift(s)")
    assert cli.main(["history", "--storage", str(storage), "--scenario", "nothing-like-this"]) == 2
    assert "no saved scenario matches --scenario nothing-like-this" in capsys.readouterr().err
    assert cli.main(["history", "--storage", str(storage / "missing")]) == 3


def test_throttled_runs_are_not_part_of_a_level(storage):
    history = load(storage)
    for (name, _), series in history_shifts.series(history).items():
        assert all(not p.run.sample(name).throttled for p in series)


def test_the_history_plot_marks_level_shifts(storage, tmp_path):
    from pytest_gpucolloc import history_plot, plots

    written = plots.write(history_plot.figures(load(storage)), tmp_path, "svg")
    figures = {path.stem[-5:]: path.read_text() for _, path in written}
    assert "level shift -10" in figures["GPU-b"] and "level shift" not in figures["GPU-a"]  # a figure per GPU


def _copy(history: Path, into: Path) -> Path:
    import shutil

    return Path(shutil.copytree(history, into / history.name))


def test_a_known_step_in_an_h200_history_is_found_at_its_first_run(tmp_path):
    """Eight saved H200 runs of one graphed scenario, the last four with one extra training step every 33."""
    storage = _copy(DATA / "step-history", tmp_path)
    found, looked = history_shifts.find(load(storage))
    assert len(looked) == 1 and looked[0][2] == 8
    assert [p.run_id[:4] for p in found] == ["0005"]
    assert found[0].change == pytest.approx(-0.03, abs=0.005) and found[0].p_value < 0.01


@pytest.mark.parametrize("folder", ["cudnn-history", "gpu-bound-history"])
def test_no_shift_in_h200_histories_whose_last_run_alone_is_slower(folder, tmp_path):
    """Six unchanged runs, then one run slowed by 2.9%: one odd run is not a new level."""
    storage = DATA / folder
    found, looked = history_shifts.find(load(storage))
    assert looked and all(runs == 7 for _, _, runs in looked)
    assert found == []


def test_a_series_too_short_for_a_shift_is_named(tmp_path, capsys):
    """Four runs cannot hold two levels of three: '0 level shifts' must not pass for a steady history."""
    storage = _copy(DATA / "step-history", tmp_path)
    for saved in sorted(storage.rglob("*.json"))[4:]:
        saved.unlink()
    assert cli.main(["history", "--storage", str(storage)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("0 level shift(s) in 1 series")
    assert "1 of the series have fewer than 6 runs" in out and "(4 runs)" in out
    assert cli.main(["history", "--storage", str(storage), "--min-runs", "2"]) == 0
    assert "fewer than" not in capsys.readouterr().out


def test_history_without_its_change_point_library_says_so(storage, capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "ruptures", None)  # as if the install had left it out
    assert cli.main(["history", "--storage", str(storage)]) == 2
    assert "needs the ruptures package" in capsys.readouterr().err


def test_history_shows_each_series_newest_values_beside_the_gates_verdicts(capsys):
    """Seven saved H200 runs, the last two gated: a series' newest runs in samples/s, each with its verdict."""
    assert cli.main(["history", "--storage", str(DATA / "cudnn-history")]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("test_resnet26_cifar10_graphed_bs128[mps-n7-"))
    assert row.split("  ")[-1].strip() == "97,399; 97,248 unchanged; 94,360 regressed", row
    assert "newest runs, samples/s (the gate's verdict where gated)" in out
    assert cli.main(["history", "--storage", str(DATA / "cudnn-history"), "--format", "json"]) == 0
    (shown,) = [s["shown"] for s in json.loads(capsys.readouterr().out)["series"]
                if s["scenario"].endswith("test_resnet26_cifar10_graphed_bs128[mps-n7-heuristics]")]
    assert len(shown) == 7 and [s["verdict"] for s in shown][-3:] == [None, "unchanged", "regressed"]
    assert round(shown[-1]["value"]) == 94360
