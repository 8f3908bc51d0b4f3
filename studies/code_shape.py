"""How easy the code is to enter, measured as a reader meets it: the package files one scenario's path runs
through in the pytest process (traced during a real CPU smoke scenario), the modules that import each other
(a path that runs back up), the longest functions, and the README's length.
    python studies/code_shape.py [--json FILE]"""
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

    @pytest.mark.gpucolloc_quick
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


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    """A top-level module is its own unit; a subpackage (mig, modes) is one unit."""
    parts = module.split(".")
    return ".".join(parts[:2])


def import_cycles() -> dict:
    """Imports that run back up: units (top-level modules and subpackages) that import each other, directly or
    through others (lazy imports inside functions included): the strongly connected components of the import
    graph between units."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                # "from .. import nvml" imports the submodule, not (for this purpose) the package itself
                candidates = ([target] if node.module else []) + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                candidates = [a.name for a in node.names]
            else:
                continue
            edges.update(c for c in candidates if c.startswith(PACKAGE.name) and c != name)
    units: dict[str, set[str]] = {}
    for m, edges in graph.items():
        units.setdefault(_unit(m), set()).update(_unit(e) for e in edges if e in graph)
    graph = {u: edges - {u} for u, edges in units.items()}
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(m):  # Tarjan
        index[m] = low[m] = len(index)
        stack.append(m)
        on_stack.add(m)
        for n in graph[m]:
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in on_stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while True:
                n = stack.pop()
                on_stack.discard(n)
                component.append(n)
                if n == m:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return {"modules_in_cycles": sum(map(len, components)), "cycles": components}


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
    result = {"scenario_path": scenario_path(), "import_cycles": import_cycles(),
              "longest_functions": longest_functions(),
              "readme_lines": len((ROOT / "README.md").read_text().splitlines()),
              "package_modules": len(list(PACKAGE.rglob("*.py")))}
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
