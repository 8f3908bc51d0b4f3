"""Tables of measured scenarios (the terminal summary, ``pytest-gpucolloc table``), and the
report's summary (per workload and mode, the best way to share and the answer it gives), from saved records
(``record.ScenarioRecord``)."""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from statistics import median

from .record import ScenarioRecord, describe_workers, jobs, sm_reserved
from .table_fit import fitted_table
from .verdict import percent
from .words import count

HEADERS = ["scenario", "mode", "workers", "per-worker samples/s", "aggregate samples/s", "CV",
           "speedup", "efficiency", "SM activity", "mem/worker GB", "data wait", "samples/J", "rounds", "start-up s",
           "flags"]


def cell(value: float | None, spec: str, unit: str = "") -> str:
    """A number in a table, "-" where there is none."""
    return "-" if value is None else f"{value:{spec}}{unit}"


def interval(ci: tuple[float, float] | None, digits: int = 1) -> str:
    """A change's interval; a bound beyond +1000% says nothing more than 'unbounded', so it is said as such."""
    if not ci:
        return "-"
    return "[" + ", ".join(percent(bound, f"+.{digits}%") for bound in ci) + "]"


def change(value: float | None, digits: int = 1) -> str:
    """A change in a table, "-" where there is none."""
    return "-" if value is None else percent(value, f"+.{digits}%")


def rate(value: float | None) -> str:
    """A throughput: whole numbers with separators, but at least two significant digits (0.42, not 0)."""
    if value is None or value == 0 or not math.isfinite(value) or abs(value) >= 10:
        return cell(value, ",.0f")
    return f"{value:.{1 - math.floor(math.log10(abs(value)))}f}"


def _flags(scenario: ScenarioRecord) -> str:
    """What makes a result incomparable (throttling, other processes on the GPU), and the power cap, which
    does not: it is how a GPU-bound job normally runs."""
    flags = ["THROTTLED"] if scenario.throttled else []
    if scenario.foreign_pids:
        flags.append("FOREIGN PIDS " + ",".join(map(str, scenario.foreign_pids)))
    capped = max((float(t["power_capped_share"]) for t in scenario.telemetry if t.get("power_capped_share")), default=0)
    if capped >= 0.1:
        flags.append(f"power cap {capped:.0%}")
    return "; ".join(flags) or ("-" if scenario.throttled is None else "ok")


def _tokens_per_s(scenario: ScenarioRecord) -> float | None:
    """Language models: the aggregate in tokens/s as well."""
    tokens = [w.tokens_per_s or 0.0 for w in scenario.workers]
    if not tokens or not all(tokens) or (scenario.mode == "sequential" and not scenario.homogeneous):
        return None  # one after another, different sequence lengths do not add up
    per_sample = tokens[0] / scenario.workers[0].throughput
    return scenario.throughput * per_sample if scenario.homogeneous else sum(tokens)


def _tokens(scenario: ScenarioRecord) -> str:
    total = _tokens_per_s(scenario)
    return "" if total is None else f" ({total / 1e6:,.2f}M tokens/s)"


def rows(entries: Iterable[tuple[str, ScenarioRecord]]) -> list[list[str]]:
    """One row per scenario from (test name, record) pairs, in HEADERS' order."""
    found = []
    for name, scenario in entries:
        workers, measured = scenario.workers, scenario.measurement
        activity = [phase.get("sm_activity_pct") for phase in scenario.telemetry]
        waits = [w.data_wait_share for w in workers]  # the share of its time a worker waited for its data loader
        found.append([
            name, scenario.mode, describe_workers(list(scenario.workloads)),
            ", ".join(rate(w.throughput) for w in workers), rate(scenario.throughput) + _tokens(scenario),
            cell(scenario.cv, ".1%"), cell(scenario.speedup, ".2f", "x"), cell(scenario.efficiency, ".1%"),
            ", ".join(f"{v:.0f}%" for v in activity) if activity and all(isinstance(v, (int, float)) for v in activity)
            else "-",
            ", ".join("-" if w.device_memory_bytes is None else f"{w.device_memory_bytes / 1e9:.1f}" for w in workers),
            "-" if all(v is None for v in waits) else ", ".join(cell(v, ".1%") for v in waits),
            cell(scenario.samples_per_joule, ",.1f"), str(measured.get("rounds", len(scenario.rounds))),
            # spawn to every worker warm; "= alone" or "= mps" where the scenario records a measurement taken once
            f"= {measured['same_as']}" if measured.get("same_as") else cell(measured.get("fixed_cost_s"), ",.1f"),
            _flags(scenario)])
    return found


def facts(entries: Iterable[tuple[str, ScenarioRecord]]) -> list[dict]:
    """One object per scenario, the numbers of ``rows`` as numbers (``--format json``): unrounded, the unit in the
    key, a share as a fraction (0.058, not 5.8%), null where not measured; a per-worker or per-phase key a list."""
    return [{
        "scenario": name, "mode": scenario.mode, "gpu": scenario.gpu_uuid,
        "workers": describe_workers(list(scenario.workloads)),
        "per_worker_samples_per_s": [w.throughput for w in scenario.workers],
        "aggregate_samples_per_s": scenario.throughput, "aggregate_tokens_per_s": _tokens_per_s(scenario),
        "cv": scenario.cv, "speedup": scenario.speedup, "efficiency": scenario.efficiency,
        "sm_activity_pct": [phase.get("sm_activity_pct") for phase in scenario.telemetry],
        "memory_per_worker_gb": [None if w.device_memory_bytes is None else w.device_memory_bytes / 1e9
                                 for w in scenario.workers],
        "data_wait_share": [w.data_wait_share for w in scenario.workers],
        "samples_per_joule": scenario.samples_per_joule,
        "rounds": scenario.measurement.get("rounds", len(scenario.rounds)),
        # a measurement taken once (alone, or of another mode) and recorded again: its start-up is not this one's
        "start_up_s": None if scenario.measurement.get("same_as") else scenario.measurement.get("fixed_cost_s"),
        "measurement_same_as": scenario.measurement.get("same_as"),
        "throttled": scenario.throttled, "foreign_pids": list(scenario.foreign_pids),
        "power_capped_share": max((float(t["power_capped_share"]) for t in scenario.telemetry
                                   if t.get("power_capped_share") is not None), default=None),
    } for name, scenario in entries]


def time_spent(records: Iterable[ScenarioRecord], round_s: float) -> str | None:
    """Where a run's time went, in a line; the first training step is where cuDNN autotunes."""
    records = list(records)
    taken = [r for r in records if "wall_s" in r.measurement and "same_as" not in r.measurement]
    if not taken:
        return None
    wall, start_up, rounds = (sum(r.measurement.get(key, 0) for r in taken) for key in ("wall_s", "fixed_cost_s",
                                                                                          "rounds"))
    reused = sum("same_as" in r.measurement for r in records)
    return (f"time: {count(len(taken), 'measurement')} took {duration(wall)}: start-up {duration(start_up)} "
            f"(first training steps {duration(sum(_first_step_s(r) for r in taken))}), "
            f"{rounds} rounds of {round_s:g} s, the rest (set-up, the first one's including the worker fork server's "
            f"start; tear-down; between rounds) "
            f"{duration(max(wall - start_up - rounds * round_s, 0.0))}"
            + (f"; {count(reused, 'scenario')} recorded a measurement taken once "
               "instead of a new one" if reused else ""))


def _first_step_s(scenario: ScenarioRecord) -> float:
    """The first training step of the worker that was warm last (the scenario's start-up waited for it)."""
    slowest = max(scenario.workers, key=lambda w: w.startup_s or 0.0, default=None)
    phases = slowest.other.get("startup_phases_s") if slowest else None
    return phases.get("first_step", 0.0) if isinstance(phases, dict) else 0.0


def duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


PER_WORKER = [HEADERS.index(name) for name in ("per-worker samples/s", "SM activity", "mem/worker GB", "data wait")]


def _span(cell: str) -> str:
    """A terminal's per-worker list of more than three values: its lowest and highest, and how many
    (``1,201 .. 1,250 (7)``); Markdown, CSV and JSON keep every value."""
    values = cell.split(", ")
    if len(values) <= 3:
        return cell
    try:
        ordered = sorted(values, key=lambda value: float(value.replace(",", "").rstrip("%")))
    except ValueError:  # "-" among them
        return cell
    return f"{ordered[0]} .. {ordered[-1]} ({len(values)})"


COLUMNS = ["scenario", "mode", "workers", "per-worker", "aggregate", "cv", "speedup", "efficiency", "sm", "memory",
           "data-wait", "energy", "rounds", "start-up", "flags"]  # --columns' names of HEADERS, in order
# left out first where a terminal is too narrow: what explains a number before the number; never the scenario, its
# aggregate throughput or its speedup
DROP_ORDER = ["start-up", "rounds", "data-wait", "energy", "memory", "sm", "efficiency", "cv", "per-worker", "workers",
              "mode", "flags"]


def columns(text: str, names: list[str], option: str = "--columns") -> list[str]:
    """``--columns`` as pytest-benchmark's ``--benchmark-columns`` takes it: names, comma-separated."""
    chosen = [name.strip() for name in text.split(",") if name.strip()]
    if not chosen or any(name not in names for name in chosen):
        raise ValueError(f"{option} takes names among {','.join(names)}, got {text!r}")
    return chosen


def table(entries: Iterable[tuple[str, ScenarioRecord]], fmt: str = "simple", sources: list[str] | None = None,
          shown: list[str] | None = None, width: int | None = None, ask: str = "--columns") -> str:
    """The summary table, fitted (``table_fit.fitted_table``; long flags numbered below); ``sources`` (one per entry)
    adds a first column saying which run each row is from; in a terminal per-worker lists are shortened (``_span``)."""
    body = rows(entries)
    if fmt == "simple":
        body = [[_span(cell) if index in PER_WORKER else cell for index, cell in enumerate(row)] for row in body]
    return fitted_table(body, COLUMNS, HEADERS, DROP_ORDER, fmt, width, ask, shown, ("flags",),
                        lambda _, row, __: f"{row[0]}: flags", None if sources is None else ("run", sources))


@dataclass
class Cell:
    """One mode's best count of copies for a workload (or its one mix): medians of the runs there."""
    n: int
    speedup: float
    throughput: float
    runs: int


@dataclass
class SummaryRow:
    jobs: str  # the workload, or the mix
    mixed: bool
    cells: dict[str, Cell]  # mode -> its best count
    verdicts: Counter  # the gate's verdicts over the row's scenarios

    @property
    def best(self) -> str:
        return max(self.cells, key=lambda mode: self.cells[mode].speedup)

    @property
    def margin(self) -> float | None:
        """How far the best mode is ahead of the next one (a fraction), None with one mode."""
        ranked = sorted((cell.speedup for cell in self.cells.values()), reverse=True)
        return ranked[0] / ranked[1] - 1 if len(ranked) > 1 else None


def summary(entries: Iterable[tuple[str, ScenarioRecord]]) -> list[SummaryRow]:
    """Per workload (and per mix) and sharing mode: the count of copies with the best speedup, the median of the
    runs there. Only collocated scenarios (two or more jobs, not one after another) with a speedup count."""
    Key = tuple[str, bool]  # the jobs, and whether they are a mix
    runs: dict[Key, dict[str, dict[int, list]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    verdicts: dict[Key, Counter] = defaultdict(Counter)
    for _, scenario in entries:
        key = (jobs(scenario), not scenario.homogeneous)
        if scenario.verdict:
            verdicts[key][scenario.verdict] += 1
        if scenario.mode != "sequential" and scenario.n_workers > 1 and scenario.speedup:
            runs[key][scenario.mode][scenario.n_workers].append(scenario)
    found = []
    for (label, mixed), modes in runs.items():
        cells = {}
        for mode, counts in modes.items():
            medians = [Cell(n, median(s.speedup for s in found_runs), median(s.throughput for s in found_runs),
                            len(found_runs)) for n, found_runs in counts.items()]
            cells[mode] = max(medians, key=lambda cell: cell.speedup)
        found.append(SummaryRow(label, mixed, cells, verdicts[(label, mixed)]))
    return sorted(found, key=lambda row: (row.mixed, -row.cells[row.best].speedup))


def answer(rows: list[SummaryRow], cpu: bool = False) -> str:
    """The report's answer in one sentence, from the summary: the mode that shares best most often, with its
    largest gain, and the single largest gain where another mode made it. Of CPU smoke runs it says what they are,
    and of one measured mode that there was nothing to compare it with."""
    top = max(rows, key=lambda row: row.cells[row.best].speedup, default=None)
    modes = {mode for row in rows for mode in row.cells}
    if top is None:
        said = "No collocated scenario with a measured speedup in these runs: nothing to recommend yet."
    elif top.cells[top.best].speedup < 1.1:
        said = (f"Sharing does not pay here: no mode made more than {top.cells[top.best].speedup:.2f}x the jobs "
                "alone; run them one after another.")
    elif len(modes) == 1:
        said = (f"Only {top.best} was measured, so nothing to compare it with (measure other modes with --gpu-mode): "
                f"{_gain(top, top.best)}.")
    else:
        wins = Counter(row.best for row in rows)
        mode = max(wins, key=lambda m: (wins[m], max(r.cells[m].speedup for r in rows if m in r.cells)))
        example = max((row for row in rows if row.best == mode), key=lambda row: row.cells[mode].speedup)
        said = f"Use {mode}: it shares best in {wins[mode]} of {len(rows)} workloads and mixes; {_gain(example, mode)}"
        if top.best != mode:
            said += f" (the largest gain, under {top.best}: {_gain(top, top.best)})"
        said += "."
    if cpu:
        said = "CPU smoke mode (small jobs on the CPU: it checks the suite, not what a GPU does): " + said
    return said


def _gain(row: SummaryRow, mode: str) -> str:
    cell = row.cells[mode]
    if row.mixed:
        return f"{row.jobs} made {cell.speedup:.1f}x the progress of running them one after another"
    return f"{cell.n} {row.jobs} jobs made {cell.speedup:.1f}x the throughput of one alone"


SERVING_HEADERS = ["scenario", "mode", "offered req/s", "achieved req/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms",
                   "p99 vs alone", "training jobs", "SMs reserved", "training kept"]
SATURATED = "saturated"  # in place of the percentiles: they measure the queue, not the service


def ms(value: float | None) -> str:
    """A latency in milliseconds, three significant digits at most past the point (0.845, 12.3, 1,234)."""
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def serving_rows(entries: Iterable[tuple[str, ScenarioRecord]]) -> list[list[str]]:
    """A row per scenario with a serving job; a saturated one says so instead of its percentiles."""
    table = []
    for name, scenario in entries:
        facts = scenario.serving
        if not facts:
            continue
        saturated = bool(facts.get("saturated"))
        latencies = [SATURATED] * 4 if saturated else [ms(facts.get(k)) for k in ("p50_ms", "p99_ms", "p999_ms",
                                                                                   "max_ms")]
        versus = facts.get("p99_vs_alone")
        table.append([
            name, scenario.mode, "max" if facts.get("offered_rps") is None else rate(facts["offered_rps"]),
            rate(facts.get("achieved_rps")), *latencies,
            "-" if versus is None or saturated else f"{versus:.2f}x",
            str(facts.get("training_jobs", "-")), cell(sm_reserved(scenario), "g", "%"),
            cell(facts.get("training_kept"), ".1%"),
        ])
    return table


def saturated(entries: Iterable[tuple[str, ScenarioRecord]]) -> list[tuple[str, str]]:
    """(scenario, why) for each saturated service: the rate was more than it answers."""
    return [(name, s.serving.get("why") or "its queue grew") for name, s in entries
            if s.serving and s.serving.get("saturated")]


SERVING_DROP_ORDER = ["p99.9 ms", "max ms", "offered req/s", "SMs reserved", "training jobs", "mode", "achieved req/s"]


def serving_table(entries: Iterable[tuple[str, ScenarioRecord]], fmt: str = "simple", width: int | None = None,
                  ask: str = "pytest-gpucolloc report") -> str | None:
    """The serving table fitted to ``width`` (``ask``: where every column is shown), None without a serving job."""
    body = serving_rows(entries)
    return fitted_table(body, SERVING_HEADERS, SERVING_HEADERS, SERVING_DROP_ORDER, fmt, width, ask) if body else None
