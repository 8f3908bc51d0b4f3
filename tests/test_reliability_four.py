"""Reliability, round four: what an independent fault probe broke, each checked from outside the code under test."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_gpucolloc import cli, record
from test_gate_serving import write_run
from test_plugin import FAST, SCENARIOS, TINY

# --- extreme latencies in a saved serving run -------------------------------------------------------------


def with_latency(path: Path, round_p99: list[float], field: str = "round_p99_ms") -> Path:
    """The saved run with its serving job's ``round_p99`` (or ``field`` set to its first), as given."""
    data = json.loads(path.read_text())
    data["benchmarks"][0]["extra_info"]["serving"][field] = round_p99 if field == "round_p99_ms" else round_p99[0]
    path.write_text(json.dumps(data))
    return path


def serving_history(root: Path, round_p99: list[float], field: str = "round_p99_ms") -> Path:
    """Six steady runs at 10 ms and a seventh to gate; run 3 carries ``round_p99`` (or ``field`` set to its first)."""
    for number in range(1, 7):
        write_run(root, number, 10.0)
    with_latency(root / "0003_run.json", round_p99, field)
    return write_run(root, 7, 10.0)


@pytest.mark.parametrize("field", ["round_p99_ms", "p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms", "alone_p99_ms"])
@pytest.mark.parametrize("value", [5e-324, 1e-300, 1e-9, 1e308, 1e12])
def test_a_saved_run_with_an_impossible_latency_is_named_and_the_gate_still_decides(tmp_path, capsys, field, value):
    current = serving_history(tmp_path, [value] * 6, field)
    code = cli.main(["gate", str(current), "--storage", str(tmp_path)])
    said = capsys.readouterr()
    assert code == 0, said.out + said.err
    assert f"0003_run.json: scenario benchmarks/test_serving.py::test_service_beside_training[mps-rate80] skipped " \
           f"({'an item of ' if field == 'round_p99_ms' else ''}serving.{field} must be a latency" in said.err


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.floats(*record.LATENCY_MS), min_size=1, max_size=6), st.floats(*record.LATENCY_MS))
def test_the_gate_decides_over_any_latency_the_reader_lets_through(tmp_path_factory, rounds, current_p99):
    root = tmp_path_factory.mktemp("history")
    current = with_latency(serving_history(root, rounds), [current_p99] * 6)
    record.read(json.loads(current.read_text())["benchmarks"][0]["extra_info"])  # the reader lets it through
    assert cli.main(["gate", str(current), "--storage", str(root), "--format", "json"]) in (0, 1)


# --- stdout that cannot be written -------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


@pytest.mark.parametrize("argv", [["check"], ["table", str(DATA / "default-run.json")],
                                  ["history", "--storage", str(DATA / "aa-history")]])
@pytest.mark.parametrize("stdout", ["/dev/full", "closed"])
def test_a_command_whose_stdout_cannot_be_written_exits_4_in_one_line(argv, stdout):
    redirect = ">/dev/full" if stdout == "/dev/full" else ">&-"
    done = subprocess.run(["bash", "-c", f'exec "$@" {redirect}', "-", sys.executable, "-m", "pytest_gpucolloc.cli",
                           *argv], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 4, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.strip().startswith("error: cannot write the output")


# --- a storage or report under a read-only pseudo file system ------------------------------------------------

@pytest.mark.parametrize("option", ["--benchmark-storage=file:///proc/gpucolloc-history",
                                    "--colloc-gate-report=/proc/gpucolloc-gate.md"])
def test_a_storage_or_report_where_no_file_can_be_created_is_a_usage_error_before_anything_runs(pytester, option):
    """As root, /proc passes every permission check: a file created (and removed) there is what tells."""
    pytester.makepyfile(tiny_workload=TINY)
    pytester.makepyfile(test_scenarios=SCENARIOS.format(sleep=0.001))
    done = pytester.runpytest("--gpu-mode=naive", "--colloc-device=cpu", "--colloc-gate", "--benchmark-autosave",
                              "-k", "naive-1", *FAST, option)
    assert done.ret == pytest.ExitCode.USAGE_ERROR
    done.stderr.fnmatch_lines(["*/proc* is not writable, so nothing measured could be saved*"])
    assert not list(Path("/tmp").glob(f"gc-*/{pytester.path.name}*"))


def test_an_output_folder_where_no_file_can_be_created_exits_4(capsys):
    assert cli.main(["plot", "--storage", str(DATA / "aa-history"), "--out", "/proc"]) == 4
    assert "cannot write into /proc" in capsys.readouterr().err
