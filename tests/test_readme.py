"""What the README shows works as shown: its scenario example runs on a CPU, and the quick start's benchmark run
saves what the commands after it read."""
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAST = ["--colloc-device=cpu", "--colloc-rounds=2", "--colloc-round-seconds=0.2", "--colloc-warmup-seconds=0.1",
        "--colloc-warmup-steps=1", "-p", "no:cacheprovider"]


def readme_example() -> str:
    section = (ROOT / "README.md").read_text().split("## Writing a scenario", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_scenario_example_runs_as_shown_on_a_cpu(pytester):
    pytester.makepyfile(test_example=readme_example())
    # n = 1 and 2 (3 and 7 run the same code with more workers: minutes on a 2-core CI machine)
    result = pytester.runpytest_subprocess(*FAST, "-k", "not 3 and not 7")
    result.assert_outcomes(passed=2, deselected=2)


def test_the_benchmark_suite_saves_every_run(pytester):
    (pytester.path / "benchmarks").mkdir()
    shutil.copy(ROOT / "benchmarks" / "conftest.py", pytester.path / "benchmarks" / "conftest.py")
    (pytester.path / "benchmarks" / "test_tiny.py").write_text(
        "def test_tiny(benchmark):\n    benchmark(sum, range(10))\n")
    pytester.runpytest_subprocess("benchmarks/", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    (saved,) = (pytester.path / ".benchmarks").rglob("0001_*.json")
    assert saved.name != "0001_True.json"  # named as --benchmark-autosave names it (commit or time)
    named = pytester.runpytest_subprocess("benchmarks/", "--benchmark-save=mine", "-p", "no:cacheprovider")
    named.assert_outcomes(passed=1)  # a run that names its save is saved under that name only
    assert [p.name for p in (pytester.path / ".benchmarks").rglob("0002_*.json")] == ["0002_mine.json"]
