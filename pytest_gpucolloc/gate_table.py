"""The gate's verdicts as a table (the pytest gate's summary, ``pytest-gpucolloc gate``, ``compare``): a row per
verdict and per judged latency, fitted to a terminal (short cells, long ones numbered below) or whole in Markdown,
CSV and JSON."""
from __future__ import annotations

import json
from collections.abc import Iterable

from .history import short_name
from .report import change, interval, ms, rate
from .table_fit import fitted_table, tabular, wrapped

# a regressed run is saved, but it is no baseline: a retry of the same commit would pass on it
ACCEPT_HINT = ("a regressed run stays out of later baselines until accepted: if the change is intended, "
               "`pytest-gpucolloc accept {run}` makes it the new level")
UNGATED_HINT = ("saved without a verdict of the gate (--colloc-gate), this run is part of later baselines: if the "
                "change is intended, `pytest-gpucolloc accept {run}` starts the level at it")
GATE_HEADERS = ["scenario", "verdict", "baseline samples/s", "current samples/s", "change", "interval",
                "detectable drop", "baseline runs", "noise (share of a run's variance)", "lever", "why"]


def _noise(noise: dict | None) -> str:
    """The dominant level of noise first, e.g. ``processes or runs 97%, rounds 3%``."""
    if not noise:
        return "-"
    shares = {level: share for level, share in noise["shares"].items() if share is not None}
    if noise["dominant"] == "processes or runs":
        shares = {"processes or runs": shares.pop("runs", 0.0), **shares}
    return ", ".join(f"{level} {share:.0%}" for level, share in sorted(shares.items(), key=lambda kv: -kv[1]))


def rows(verdicts: Iterable[tuple[str, dict]]) -> list[list[str]]:
    """A row per verdict (a saved ``Verdict.to_dict()``); below a serving scenario's, a row per latency (in
    ms; its change + is a higher latency, its detectable change a rise)."""
    out = []
    for name, v in verdicts:
        latency = v.get("metric", "throughput") != "throughput"
        mde = "-" if v.get("mde") is None else f"{'rise ' if latency else ''}{v['mde']:.1%}"
        if v.get("mde_noise") is not None and v["mde_noise"] < v["mde"]:  # the threshold binds, not the noise
            mde += f" (noise: {v['mde_noise']:.1%})"
        judged = v.get("latency") or ({"p99": v["p99"]} if isinstance(v.get("p99"), dict) else {})
        # a latency with a row of its own below is not said again in this row's notes
        notes = [n for n in v.get("notes", []) if not any(n.startswith(f"{metric} latency ") for metric in judged)]
        why = "; ".join([v.get("reason", "")] + notes)
        shown = (lambda value: "-" if value is None else f"{ms(value)} ms") if latency else rate
        out.append([name, v["verdict"], shown(v.get("baseline")), shown(v.get("current")),
                    change(v.get("change")), interval(v.get("ci")), mde, str(len(v.get("baseline_runs", []))),
                    _noise(v.get("noise")), (v.get("noise") or {}).get("lever") or "-", why])
        for metric, verdict in judged.items():
            out += rows([(f"{name} {metric} latency", verdict)])
    return out


def left_to_ab_line(nodeids: list[str], modes: Iterable[str]) -> str:
    """What a gate (pytest's or ``gate``) measured but left to paired A/B, and on a line of its own the command that
    judges it (a log's line stays short enough to read, the command whole to copy)."""
    names = ", ".join(nodeid.split("::")[-1] for nodeid in nodeids)
    tests = " ".join(dict.fromkeys(nodeid.split("[")[0] for nodeid in nodeids))
    mode = f" --gpu-mode={','.join(modes)}" if modes else ""
    return (f"left to paired A/B (gpucolloc_gate(by=\"ab\")), measured and saved but not judged against history: "
            f"{names} (marked too noisy between runs for a history gate)\n  judge a change from the rootdir with "
            f"`pytest-gpucolloc ab --baseline HEAD~1 --candidate HEAD -- {tests}{mode}`")


GATE_COLUMNS = ["scenario", "verdict", "baseline", "current", "change", "interval", "detectable", "runs", "noise",
                "lever", "why"]  # --columns' names of GATE_HEADERS, in order
TERMINAL_HEADERS = [n if n != "noise" else "noise (dominant)" for n in GATE_COLUMNS]  # throughput in samples/s
# left out first where a terminal is too narrow; never the scenario, its verdict, the change or why
GATE_DROP_ORDER = ["lever", "noise", "runs", "interval", "baseline", "current", "detectable"]


def table(verdicts: Iterable[tuple[str, dict]], fmt: str = "simple", columns: list[str] | None = None,
               width: int | None = None, ask: str = "--columns") -> str:
    """The verdicts' table, fitted (``table_fit.fitted_table``): in a terminal a long reason or lever is numbered and
    said in full below the table, with its scenario and verdict, and the noise is its dominant level."""
    body = rows(verdicts)
    if fmt == "simple":
        for row in body:
            row[GATE_COLUMNS.index("noise")] = row[GATE_COLUMNS.index("noise")].split(", ")[0]  # the dominant level
    return fitted_table(body, GATE_COLUMNS, GATE_HEADERS if fmt != "simple" else TERMINAL_HEADERS, GATE_DROP_ORDER,
                        fmt, width, ask, columns, ("lever", "why"),
                        lambda full, _, name: f"{full[0]} {full[1]}: {GATE_HEADERS[GATE_COLUMNS.index(name)]}")


def render(verdicts: list[tuple[str, dict]], fmt: str, title: str, columns: list[str] | None = None,
           width: int | None = None, about: dict | None = None) -> str:
    """The verdicts (saved ``Verdict.to_dict()``s) in a command's format under ``title``: JSON each verdict as saved,
    the latency ones inside it, each row with ``about`` (the judged run); a terminal's table names a scenario by its
    test's name."""
    if fmt == "json":
        return json.dumps([{**(about or {}), "scenario": name, **verdict} for name, verdict in verdicts], indent=2)
    if fmt == "csv":
        return tabular(rows(verdicts), GATE_HEADERS, fmt)
    if fmt == "markdown":
        return f"### {title}\n\n{table(verdicts, 'github', columns)}"
    return f"{wrapped(title, width)}\n{table([(short_name(n), v) for n, v in verdicts], 'simple', columns, width)}"
