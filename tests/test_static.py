"""The package passes its linters: ruff (style, likely bugs), mypy (the types the seams are written with) and
import-linter (imports point down the package's layers, never in a circle).

Each reads its settings from pyproject.toml; a failure prints the tool's own report.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(tool: str, args: list[str], cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    beside = Path(sys.executable).parent / tool  # the environment's own copy first, then PATH
    exe = str(beside) if beside.exists() else shutil.which(tool)
    if exe is None:
        pytest.skip(f"{tool} is not installed (pip install -e '.[test]')")
    return subprocess.run([exe, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing():
    done = _run("ruff", ["check", "--no-cache", "pytest_gpucolloc", "tests"])
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_nothing(request):
    cache = getattr(request.config, "cache", None)  # pytest's cache keeps mypy's: a warm run takes seconds
    cache = cache.mkdir("mypy") if cache else None
    done = _run("mypy", ["pytest_gpucolloc", *(["--cache-dir", str(cache)] if cache else [])])
    assert done.returncode == 0, done.stdout + done.stderr


def test_imports_point_down_the_layers():
    done = _run("lint-imports", ["--no-cache"])
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("module, added, broken", [
    ("gate.py", "from . import history", "pytest_gpucolloc.gate -> pytest_gpucolloc.history"),  # base -> storage
    ("machine.py", "from . import gate", "No cycles are allowed in pytest_gpucolloc."),  # a circle within a layer
])
def test_an_upward_import_or_a_circle_fails_the_layer_check(tmp_path, module, added, broken):
    shutil.copytree(ROOT / "pytest_gpucolloc", tmp_path / "pytest_gpucolloc",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with open(tmp_path / "pytest_gpucolloc" / module, "a") as code:
        code.write(f"\n{added}  # noqa\n")
    done = _run("lint-imports", ["--no-cache"], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "BROKEN" in done.stdout and broken in done.stdout, done.stdout
