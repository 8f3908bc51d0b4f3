"""The package passes its linters: ruff (style, likely bugs) and mypy (the types the seams are written with).

Both read their settings from pyproject.toml; a failure prints the tools' own report.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(tool: str, args: list[str]) -> subprocess.CompletedProcess:
    beside = Path(sys.executable).parent / tool  # the environment's own copy first, then PATH
    exe = str(beside) if beside.exists() else shutil.which(tool)
    if exe is None:
        pytest.skip(f"{tool} is not installed (pip install -e '.[test]')")
    return subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing():
    done = _run("ruff", ["check", "--no-cache", "pytest_gpucolloc", "tests"])
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_nothing(request):
    cache = getattr(request.config, "cache", None)  # pytest's cache keeps mypy's: a warm run takes seconds
    cache = cache.mkdir("mypy") if cache else None
    done = _run("mypy", ["pytest_gpucolloc", *(["--cache-dir", str(cache)] if cache else [])])
    assert done.returncode == 0, done.stdout + done.stderr
