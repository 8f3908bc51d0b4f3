"""Tables of measured scenarios: the terminal summary, and the same from saved benchmark JSON."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Iterable

from tabulate import tabulate

HEADERS = ["scenario", "mode", "workers", "per-worker samples/s", "aggregate samples/s", "CV",
           "speedup", "efficiency", "SM activity", "mem/worker GB", "samples/J", "flags"]


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _bound(value: float) -> str:
    """An interval bound; beyond +1000% the number says nothing more than 'unbounded'."""
    return ">+1000%" if value > 10 else f"{value:+.1%}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _gb(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e9:.1f}"


def _sm_activity(phases: list[dict]) -> str:
    values = [p.get("sm_activity_pct") for p in phases]
    if not values or not all(isinstance(v, (int, float)) for v in values):
        return "-"
    return ", ".join(f"{v:.0f}%" for v in values)


def _flags(info: dict) -> str:
    """What makes a result incomparable: throttling, other processes on the GPU."""
    flags = []
    if info.get("throttled"):
        flags.append("THROTTLED")
    if info.get("foreign_pids"):
        flags.append("FOREIGN PIDS " + ",".join(map(str, info["foreign_pids"])))
    if not flags:
        return "-" if info.get("throttled") is None else "ok"
    return "; ".join(flags)


def describe_workers(labels: list[str]) -> str:
    counts = Counter(labels)
    return " + ".join(f"{n}x {label}" if n > 1 else label for label, n in counts.items())


def rows(entries: Iterable[tuple[str, dict]]) -> list[list[str]]:
    """One row per scenario from (test name, extra_info) pairs."""
    table = []
    for name, info in entries:
        speedup = info.get("speedup_vs_sequential")
        table.append([
            name, info["mode"], describe_workers(info["workloads"]),
            ", ".join(_num(w["throughput"]) for w in info["workers"]),
            _num(info["aggregate_throughput"]), _pct(info.get("aggregate_cv")),
            "-" if speedup is None else f"{speedup:.2f}x",
            _pct(info.get("efficiency")),
            _sm_activity(info.get("telemetry") or []),
            ", ".join(_gb(w.get("device_memory_bytes")) for w in info["workers"]),
            _num(info.get("samples_per_joule"), 1),
            _flags(info),
        ])
    return table


def table(entries: Iterable[tuple[str, dict]], fmt: str = "simple", sources: list[str] | None = None) -> str:
    """The summary table; ``sources`` (one per entry) adds a first column saying which run each row is from."""
    body, headers = rows(entries), HEADERS
    if sources is not None:
        body, headers = [[source, *row] for source, row in zip(sources, body)], ["run", *HEADERS]
    return tabulate(body, headers=headers, tablefmt=fmt, disable_numparse=True)


def entries_from_json(path: Path) -> list[tuple[str, dict]]:
    """Scenarios recorded by this plugin in a pytest-benchmark JSON file (others are ignored)."""
    data = json.loads(Path(path).read_text())
    return [(b["name"], b["extra_info"]) for b in data.get("benchmarks", [])
            if b.get("extra_info", {}).get("gpucolloc")]


GATE_HEADERS = ["scenario", "verdict", "baseline samples/s", "current samples/s", "change", "interval",
                "detectable drop", "baseline runs", "why"]


def gate_rows(verdicts: Iterable[tuple[str, dict]]) -> list[list[str]]:
    table = []
    for name, v in verdicts:
        change = "-" if v.get("change") is None else f"{v['change']:+.1%}"
        interval = "-" if not v.get("ci") else f"[{_bound(v['ci'][0])}, {_bound(v['ci'][1])}]"
        mde = "-" if v.get("mde") is None else f"{v['mde']:.1%}"
        why = "; ".join([v.get("reason", "")] + list(v.get("notes", [])))
        table.append([name, v["verdict"], _num(v.get("baseline")), _num(v.get("current")), change, interval, mde,
                      str(len(v.get("baseline_runs", []))), why])
    return table


def gate_table(verdicts: Iterable[tuple[str, dict]], fmt: str = "simple") -> str:
    return tabulate(gate_rows(verdicts), headers=GATE_HEADERS, tablefmt=fmt, disable_numparse=True)
