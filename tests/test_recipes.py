"""The pull-request comment recipes (docs/recipes/): valid workflow files, and the comment body they post,
rendered by their own shell from a real gated run on the CPU, is `pytest-gpucolloc gate --format markdown`'s."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pytest_gpucolloc import cli
from tiny_workload import SOURCE as TINY_SOURCE

RECIPES = Path(__file__).resolve().parent.parent / "docs" / "recipes"
MARKER = "<!-- pytest-gpucolloc -->"


def github():
    return yaml.safe_load((RECIPES / "github-pr-comment.yml").read_text())


def gitlab_job():
    return yaml.safe_load((RECIPES / "gitlab-mr-comment.yml").read_text())["gpu-benchmarks-mr-comment"]


def github_step(step_id):
    return next(step for step in github()["jobs"]["benchmark"]["steps"] if step.get("id") == step_id)


def test_the_github_recipe_comments_on_pull_requests_even_when_the_gate_fails():
    workflow = github()
    assert "pull_request" in workflow[True]  # YAML 1.1 reads the key `on` as true
    assert workflow["permissions"]["pull-requests"] == "write"
    steps = workflow["jobs"]["benchmark"]["steps"]
    names = [step.get("id") for step in steps]
    assert names.index("gate") < names.index("body")
    assert github_step("body")["if"] == "always()"
    post = next(step for step in steps if step.get("name") == "Post or update the comment")
    assert "steps.body.outcome == 'success'" in post["if"] and MARKER in post["run"]


def test_the_gitlab_recipe_notes_merge_requests_after_the_gate_whatever_it_said():
    job = gitlab_job()
    assert job["rules"] == [{"if": '$CI_PIPELINE_SOURCE == "merge_request_event"'}]
    assert any("ci/gate.sh" in line for line in job["script"])
    body, post = job["after_script"]  # after_script runs when the script failed too
    assert "out/comment.md" in body and "GITLAB_API_TOKEN" in post


def test_the_gitlab_recipe_finds_its_own_note_to_update():
    post = gitlab_job()["after_script"][1]
    finder = post.split("python3 -c '", 1)[1].split("')", 1)[0]
    notes = [{"id": 7, "body": "looks good"}, {"id": 9, "body": MARKER + "\n#### Collocation benchmarks: ..."}]
    found = subprocess.run([sys.executable, "-c", finder], input=json.dumps(notes), capture_output=True, text=True)
    assert found.stdout.strip() == "9"
    none = subprocess.run([sys.executable, "-c", finder], input=json.dumps(notes[:1]), capture_output=True, text=True)
    assert none.stdout.strip() == ""



SCENARIO = '''
import pytest
from pytest_gpucolloc import Workload

@pytest.mark.gpucolloc_quick
def test_alone(collocate):
    collocate([Workload("tiny_workload:factory", batch_size=4)])
'''


@pytest.fixture
def gated_run(pytester):
    """A real run gated on the CPU, saved to a history, its JSON in out/run.json (as ci/gate.sh leaves them)."""
    pytester.makepyfile(tiny_workload=TINY_SOURCE, test_alone=SCENARIO)
    (pytester.path / "out").mkdir()
    history = pytester.path / "history"
    result = pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", "--colloc-rounds=2",
                                "--colloc-round-seconds=0.2", "--colloc-warmup-seconds=0.1", "-p", "no:cacheprovider",
                                f"--benchmark-storage=file://{history}", "--benchmark-autosave", "--colloc-gate",
                                "--benchmark-json=out/run.json")
    result.assert_outcomes(passed=1)
    return pytester.path


def render(script: str, folder: Path, **env) -> str:
    """The recipe's own shell, run where the gated run left its files, with this environment's console command."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    done = subprocess.run(["bash", "-c", script], cwd=folder, env={**os.environ, "PATH": path, **env},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return (folder / "out" / "comment.md").read_text()


def test_both_recipes_post_the_gate_verdicts_of_a_real_run(gated_run, capsys):
    code = cli.main(["gate", str(gated_run / "out" / "run.json"), "--storage", str(gated_run / "history"),
                     "--format", "markdown"])
    verdicts = capsys.readouterr().out.rstrip("\n")
    assert code == 0 and "no baseline" in verdicts  # a first run: nothing to judge it against yet
    url = "https://ci.example/run/1"
    posted = render(github_step("body")["run"], gated_run, RUN_URL=url)
    assert posted == (f"{MARKER}\n#### Collocation benchmarks: no regression\n\n{verdicts}\n\n"
                      f"[the run, its log and plots]({url})\n")
    assert render(gitlab_job()["after_script"][0], gated_run, CI_JOB_URL=url) == posted
    # storage that holds nothing is said in the comment, not passed as green
    (gated_run / "empty").mkdir()
    broken = render(github_step("body")["run"].replace("--storage history", "--storage empty"), gated_run,
                    RUN_URL=url)
    assert "#### Collocation benchmarks: could not judge" in broken and "error: no saved" in broken
