"""Terminal summary of the scenarios measured in this run."""
from __future__ import annotations

from collections import Counter

from tabulate import tabulate

from .scenario import ScenarioResult

HEADERS = ["scenario", "mode", "workers", "per-worker samples/s", "aggregate samples/s", "CV",
           "speedup", "efficiency"]


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def describe_workers(result: ScenarioResult) -> str:
    counts = Counter(w.label for w in result.workloads)
    return " + ".join(f"{n}x {label}" if n > 1 else label for label, n in counts.items())


def rows(results: list[tuple[str, ScenarioResult]]) -> list[list[str]]:
    table = []
    for name, result in results:
        per_worker = ", ".join(_num(w.stats.throughput) for w in result.workers)
        table.append([
            name, result.mode, describe_workers(result), per_worker,
            _num(result.aggregate_throughput), _pct(result.cv),
            "-" if result.speedup is None else f"{result.speedup:.2f}x",
            _pct(result.efficiency),
        ])
    return table


def summary_table(results: list[tuple[str, ScenarioResult]]) -> str:
    return tabulate(rows(results), headers=HEADERS, tablefmt="simple", disable_numparse=True)
