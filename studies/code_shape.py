"""How easy the code is to enter, measured as a reader meets it: the package files one scenario's path runs
through in the pytest process (traced during a real CPU smoke scenario), the longest functions, and the
README's length.   python studies/code_shape.py [--json FILE]"""
from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pytest_gpucolloc"

SCENARIO = textwrap.dedent('''
    import pytest
    from pytest_gpucolloc import Workload

    @pytest.mark.quick
    def test_two(collocate):
        collocate([Workload("resnet26-cifar10", batch_size=4)] * 2)
''')


class PathTracer:
    """Records, during the test call, which package files run, in the order the stack moves between them."""

    def __init__(self):
        self.visits: list[str] = []

    def _profile(self, frame, event, arg):
        if event == "call":
            name = frame.f_code.co_filename
            if name.startswith(str(PACKAGE)):
                short = str(Path(name).relative_to(PACKAGE))
                if not self.visits or self.visits[-1] != short:
                    self.visits.append(short)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        sys.setprofile(self._profile)
        try:
            return (yield)
        finally:
            sys.setprofile(None)


def scenario_path() -> dict:
    tracer = PathTracer()
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "test_shape.py").write_text(SCENARIO)
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            code = pytest.main(["-q", "-p", "no:cacheprovider", "--colloc-device=cpu", "--gpu-mode=naive",
                                "--colloc-rounds=2", "--colloc-round-seconds=0.2", "--colloc-warmup-seconds=0.1",
                                "test_shape.py"], plugins=[tracer])
        finally:
            os.chdir(cwd)
    files = list(dict.fromkeys(tracer.visits))
    # "back up": the stack returns to a file it had already entered
    returns = sum(1 for i, f in enumerate(tracer.visits) if f in tracer.visits[:i])
    return {"exit_code": int(code), "files": files, "file_count": len(files), "switches": len(tracer.visits) - 1,
            "returns_to_an_earlier_file": returns}


def longest_functions(top: int = 5) -> list[dict]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append({"function": f"{path.relative_to(PACKAGE)}:{node.name}",
                              "lines": node.end_lineno - node.lineno + 1})
    return sorted(found, key=lambda f: -f["lines"])[:top]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json")
    args = parser.parse_args()
    result = {"scenario_path": scenario_path(), "longest_functions": longest_functions(),
              "readme_lines": len((ROOT / "README.md").read_text().splitlines()),
              "package_modules": len(list(PACKAGE.rglob("*.py")))}
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
