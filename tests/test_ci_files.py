"""The CI files parse, reference what exists, and ci/gate.sh keeps its documented exit codes."""
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


@pytest.mark.parametrize("script", ["ci/gate.sh", "ci/gpu-check", "research/fault-suite", ".ci/run"])
def test_shell_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(ROOT / script)]).returncode == 0
    assert os.access(ROOT / script, os.X_OK)


def test_gate_script_exit_codes(tmp_path):
    usage = subprocess.run(["bash", str(ROOT / "ci" / "gate.sh")], cwd=ROOT, capture_output=True, text=True)
    assert usage.returncode != 0 and "usage" in usage.stderr
    nothing = subprocess.run(["bash", str(ROOT / "ci" / "gate.sh"), str(tmp_path / "h"), str(tmp_path / "o"),
                              "-k", "no_such_scenario_anywhere", "--colloc-device=cpu"],
                             cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable})
    assert nothing.returncode == 5, nothing.stdout[-2000:]
    assert "no benchmark collected" in nothing.stderr
    assert "deselected" in (tmp_path / "o" / "pytest.log").read_text()


def test_every_gpu_gate_demands_the_gpu():
    """A runner whose GPU or driver broke must fail the gate, not skip every scenario and pass: each command that
    gates or benchmarks on a GPU runner says --colloc-device=cuda (ci/gate.sh for the workflows that call it)."""
    def pytest_commands(text: str) -> list[str]:
        joined = text.replace("\\\n", " ")
        return [line for line in joined.splitlines() if "-m pytest benchmarks/" in line or
                line.strip().startswith("pytest benchmarks/")]

    gate = pytest_commands((ROOT / "ci" / "gate.sh").read_text())
    assert gate and all("--colloc-device=cuda" in line for line in gate), gate
    for path in [*WORKFLOWS, ROOT / ".gitlab-ci.yml", *sorted((ROOT / "docs" / "recipes").glob("*.yml"))]:
        text = path.read_text()
        commands = pytest_commands(text)
        assert "ci/gate.sh" in text or commands, path
        assert all("--colloc-device=cuda" in line for line in commands), (path, commands)
    readme = (ROOT / "README.md").read_text()
    gated = [line for line in pytest_commands(readme) if "--colloc-gate" in line]
    assert gated and all("--colloc-device=cuda" in line for line in gated), gated


def test_gate_script_on_a_runner_without_a_gpu_fails_loudly(tmp_path):
    from pytest_gpucolloc import nvml

    if nvml.init() is None:
        pytest.skip("a GPU is here: the gate would run the benchmarks")
    done = subprocess.run(["bash", str(ROOT / "ci" / "gate.sh"), str(tmp_path / "h"), str(tmp_path / "o"),
                           "-m", "gpucolloc_quick"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 2, done.stdout[-2000:]
    assert "--colloc-device=cuda but no GPU is usable" in (tmp_path / "o" / "pytest.log").read_text()
