"""The study scripts (studies/) run on the CPU: each measures what it says, in fresh processes, and refuses a
mode that cannot run here before starting anything."""
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_launch_probe_measures_each_mode_in_a_fresh_process(tmp_path):
    out = tmp_path / "probe.json"
    run = subprocess.run([sys.executable, str(ROOT / "studies" / "launch_probe.py"), "--modes", "naive,sequential",
                          "--device", "cpu", "--batch", "4", "--repeats", "1", "--seconds", "0.5", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(out.read_text())
    assert set(summary["runs"]) == {"naive", "sequential"}
    for result in (summary["runs"]["naive"][0], summary["runs"]["sequential"][0]):
        assert 0 < result["enqueue_us"] <= result["per_kernel_us"]
        assert 0 < result["step_s"] < 60
        # a synchronised step is the CPU issuing it plus the GPU's tail after the last launch
        assert result["step_issue_s"] + result["step_drain_s"] == pytest.approx(result["step_s"], rel=0.5)
        assert 0 < result["pipelined_step_s"] < 60
    assert summary["metrics"]["step_s"]["medians"]["naive"] == summary["runs"]["naive"][0]["step_s"]
    assert summary["machine"]["device"] == "cpu" and "torch" in summary["machine"]


def test_mode_ab_alternates_two_modes_and_compares_them(tmp_path):
    out = tmp_path / "ab.json"
    run = subprocess.run([sys.executable, str(ROOT / "studies" / "mode_ab.py"), "--modes", "naive,sequential",
                          "--device", "cpu", "--batch", "4", "--repeats", "2", "--rounds", "1",
                          "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(out.read_text())
    assert [len(summary["runs"][m]) for m in ("naive", "sequential")] == [2, 2]
    assert summary["sm_activity_pct"]["naive"] == [None, None]  # no GPU: no telemetry, never a fake zero
    assert 0 <= summary["mann_whitney_p"] <= 1
    assert summary["machine"]["device"] == "cpu"
    wrong = subprocess.run([sys.executable, str(ROOT / "studies" / "mode_ab.py"), "--modes", "naive"],
                           cwd=ROOT, capture_output=True, text=True)
    assert wrong.returncode == 2 and "exactly two modes" in wrong.stderr
    no_gpu = subprocess.run([sys.executable, str(ROOT / "studies" / "mode_ab.py"), "--modes", "naive,mps", "--device", "cpu"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert no_gpu.returncode == 1 and "mps cannot run here: MPS needs an NVIDIA GPU" in no_gpu.stderr


def test_gate_levels_judges_every_unchanged_run_and_the_slowed_one(tmp_path):
    template = json.loads(next((ROOT / "tests" / "data" / "aa-history").rglob("0001_*.json")).read_text())
    root = tmp_path / "history" / "Linux"
    root.mkdir(parents=True)
    rng = random.Random(3)
    for i in range(7):
        data = json.loads(json.dumps(template))
        data["datetime"] = f"2026-12-01T00:0{i}:00"
        slowed = i == 6
        for bench in data["benchmarks"]:
            level = 1000.0 * (0.97 if slowed else 1.0) * math.exp(rng.gauss(0, 0.001))
            bench["extra_info"]["aggregate_round_throughputs"] = [level * math.exp(rng.gauss(0, 0.002)) for _ in range(6)]
            if slowed:
                for worker in bench["extra_info"]["workers"]:
                    worker["params"]["options"] = {"extra_step_every": 33}
        (root / f"{i + 1:04d}_run.json").write_text(json.dumps(data))
    out = tmp_path / "levels.json"
    run = subprocess.run([sys.executable, str(ROOT / "studies" / "gate_levels.py"), "--storage", str(tmp_path / "history"),
                          "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert rows and all(len(r["aa_verdicts"]) == 6 and "regressed" not in r["aa_verdicts"] for r in rows)
    assert all(r["slowed_verdicts"][0][1]["verdict"] == "regressed" for r in rows)
    assert all(0 < r["detectable_drop"] < 0.03 for r in rows)


def test_stopping_replay_says_where_the_rule_would_stop_each_saved_scenario(tmp_path):
    steady = [100.0, 100.1, 99.9, 100.0, 100.05, 100.0, 99.95, 100.1, 100.0, 99.9]
    noisy = [100.0, 90.0, 110.0, 95.0, 105.0, 92.0, 108.0, 97.0, 103.0, 100.0]
    run = {"benchmarks": [{"name": name, "extra_info": {"aggregate_round_throughputs": rounds,
                                                        "measurement": {"stopped": "most rounds reached"}}}
                          for name, rounds in (("steady", steady), ("noisy", noisy))]}
    (tmp_path / "run.json").write_text(json.dumps(run))
    out = tmp_path / "replay.md"
    done = subprocess.run([sys.executable, str(ROOT / "studies" / "stopping_replay.py"), str(tmp_path / "run.json"),
                           "--markdown", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {line.split("|")[2].strip(): line for line in out.read_text().splitlines() if line.startswith("| run.json")}
    assert "| precision 0.50% reached" in rows["steady"] and "|            5 |" in rows["steady"]
    assert "out of reach (about" in rows["noisy"]
    assert "2 scenarios; 2 would take fewer rounds, 10 rounds fewer in all" in out.read_text()


def test_same_scenarios_matches_runs_by_mode_and_jobs_and_says_which_way_they_moved(tmp_path):
    def run(path, *scenarios):
        path.write_text(json.dumps({"benchmarks": [
            {"name": name, "extra_info": {"device": device, "mode": mode, "workloads": jobs, "aggregate_throughput": value,
                                          "aggregate_cv": 0.01, "measurement": {}}}
            for name, device, mode, jobs, value in scenarios]}))
        return str(path)

    two = ["resnet26-cifar10/bs128"] * 2
    earlier = [run(tmp_path / "a.json", ("test_x[mps-2]", "cuda", "mps", two, 100.0),
                   ("test_y", "cuda", "naive", ["resnet50-imagenet64/bs32"], 50.0)),
               run(tmp_path / "b.json", ("test_x[mps-n2]", "cuda", "mps", two, 121.0),
                   ("cpu smoke", "cpu", "naive", ["resnet152-imagenet/bs32"], 1.0))]
    later = run(tmp_path / "c.json", ("test_x[mps-n2-bs128]", "cuda", "mps", two, 99.0),
                ("test_z", "cuda", "naive", ["resnet152-imagenet/bs32"], 9.0))
    done = subprocess.run([sys.executable, str(ROOT / "studies" / "same_scenarios.py"), "--earlier", *earlier,
                           "--later", later], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| mps")]
    assert len(rows) == 1 and "2x resnet26-cifar10/bs128" in rows[0] and "100-121" in rows[0]
    assert "-10.0%" in rows[0]  # 99 against the geometric mean of 100 and 121 (110)
    assert "1 later measurements of 1 scenarios" in done.stdout and "0 higher, 1 lower" in done.stdout
    nothing = subprocess.run([sys.executable, str(ROOT / "studies" / "same_scenarios.py"), "--earlier", earlier[0],
                              "--later", run(tmp_path / "d.json", ("t", "cuda", "mps", ["gpt2-small/bs8"], 1.0))],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert nothing.returncode == 3 and "no scenario was measured by both" in nothing.stdout


def test_predict_held_out_leaves_each_mix_out_and_says_where_it_predicts_badly(tmp_path):
    out = tmp_path / "model.md"
    done = subprocess.run([sys.executable, str(ROOT / "studies" / "predict_held_out.py"), "--results",
                           str(ROOT / "tests" / "data" / "predict-runs"), "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text()
    assert "(4 files, " in text and "## 1. Leave one mix out" in text
    assert "Predicted badly (median error above 15%" in text and "graphed under naive" in text
    rows = [line for line in text.splitlines() if line.startswith("| 2x resnet26-cifar10/bs128 | launch-bound |")]
    assert [row.split(" | ")[2] for row in rows] == ["mps", "mps-partitioned", "naive"]


def test_predict_held_out_predicts_mixes_measured_on_another_gpu(tmp_path):
    """New runs of another GPU are predicted by the model fitted on the saved H200 runs, each mix left out of the fit
    (every mix here was also measured on the H200)."""
    new = tmp_path / "new"
    new.mkdir()
    text = (ROOT / "tests" / "data" / "predict-runs" / "mixes.json").read_text()
    (new / "mixes.json").write_text(text.replace("NVIDIA H200", "NVIDIA H100 80GB HBM3"))
    out = tmp_path / "model.md"
    done = subprocess.run([sys.executable, str(ROOT / "studies" / "predict_held_out.py"), "--results",
                           str(ROOT / "tests" / "data" / "predict-runs"), "--new", str(new), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    new_part = out.read_text().split("## 5. New mixes")[1].split("## Every held-out")[0]
    assert "NVIDIA H100 80GB HBM3" in new_part.splitlines()[0]
    assert "Not predicted (a job profiled nowhere): none." in new_part
    mix = "| 2x resnet26-cifar10/bs128 + resnet50-imagenet64/bs128 | launch-bound |"
    rows = [line.split(" | ") for line in new_part.splitlines() if line.startswith(mix)]
    assert [row[2] for row in rows] == ["mps", "mps-partitioned", "naive"], new_part
    # the same runs under another name: each mix left out of the fit, the predictions are section 1's to the digit
    held_out = [line.split(" | ") for line in out.read_text().split("## Every held-out")[1].splitlines()
                if line.startswith(mix)]
    assert [row[:4] for row in rows] == [row[:4] for row in held_out]


def test_ab_replay_judges_every_kept_ab_again_by_todays_rule(tmp_path):
    out = tmp_path / "replay.md"
    run = subprocess.run([sys.executable, str(ROOT / "studies" / "ab_replay.py"), "--markdown", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]): line for line in out.read_text().splitlines()
            if line.startswith("| 2026")}
    # a service 10% slower, its clients connecting in order: regressed on p50 at the first look that allows it
    slower = rows[("2026-12-06-h100-ordered-connection/ab-slower-aa-GPU-87162aae", "ab-slower")]
    assert "| regressed +10.2% (9) |" in slower
    # a rare 20 ms stall: the tail regressed, the median not
    stall = rows[("2026-12-04-h200-serving-noise-and-spin/decoder-ab-GPU-0b9318ac", "ab-stall")]
    assert "| inconclusive -1.7% (12) | regressed +62.6% (12) |" in stall
