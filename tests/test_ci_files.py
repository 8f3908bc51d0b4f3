"""The CI files parse, reference what exists, and ci/gate.sh keeps its documented exit codes."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_github_workflows_are_valid(path):
    data = yaml.safe_load(path.read_text())
    assert data["name"] and data["jobs"]
    assert True in data or "on" in data  # YAML 1.1 reads the key `on` as True
    for name, job in data["jobs"].items():
        assert "runs-on" in job and job["steps"], name
        for step in job["steps"]:
            assert ("run" in step) != ("uses" in step), (name, step)
            for script in ("ci/gate.sh", "ci/gpu-check"):
                if script in step.get("run", ""):
                    assert (ROOT / script).exists()


def test_gitlab_pipeline_is_valid():
    data = yaml.safe_load((ROOT / ".gitlab-ci.yml").read_text())
    assert data["gpu-benchmarks"]["script"] and data["gpu-benchmarks"]["tags"] == ["gpu"]


@pytest.mark.parametrize("script", ["ci/gate.sh", "ci/gpu-check", "ci/paper-table", ".ci/run"])
def test_shell_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(ROOT / script)]).returncode == 0
    assert os.access(ROOT / script, os.X_OK)


def test_gate_script_exit_codes(tmp_path):
    usage = subprocess.run(["bash", str(ROOT / "ci" / "gate.sh")], cwd=ROOT, capture_output=True, text=True)
    assert usage.returncode != 0 and "usage" in usage.stderr
    nothing = subprocess.run(["bash", str(ROOT / "ci" / "gate.sh"), str(tmp_path / "h"), str(tmp_path / "o"),
                              "-k", "no_such_scenario_anywhere", "--colloc-device=cpu"],
                             cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable})
    assert nothing.returncode == 3, nothing.stdout[-2000:]
    assert "no benchmark collected" in nothing.stderr
    assert "deselected" in (tmp_path / "o" / "pytest.log").read_text()


def test_launch_probe_measures_each_mode_in_a_fresh_process(tmp_path):
    out = tmp_path / "probe.json"
    run = subprocess.run([sys.executable, str(ROOT / "ci" / "launch_probe.py"), "--modes", "naive,sequential",
                          "--device", "cpu", "--repeats", "1", "--json", str(out)],
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
    run = subprocess.run([sys.executable, str(ROOT / "ci" / "mode_ab.py"), "--modes", "naive,sequential",
                          "--device", "cpu", "--repeats", "2", "--rounds", "1", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(out.read_text())
    assert [len(summary["runs"][m]) for m in ("naive", "sequential")] == [2, 2]
    assert summary["sm_activity_pct"]["naive"] == [None, None]  # no GPU: no telemetry, never a fake zero
    assert 0 <= summary["mann_whitney_p"] <= 1
    assert summary["machine"]["device"] == "cpu"
    wrong = subprocess.run([sys.executable, str(ROOT / "ci" / "mode_ab.py"), "--modes", "naive"],
                           cwd=ROOT, capture_output=True, text=True)
    assert wrong.returncode == 2 and "exactly two modes" in wrong.stderr
    no_gpu = subprocess.run([sys.executable, str(ROOT / "ci" / "mode_ab.py"), "--modes", "naive,mps", "--device", "cpu"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert no_gpu.returncode == 1 and "mps cannot run here: MPS needs an NVIDIA GPU" in no_gpu.stderr
