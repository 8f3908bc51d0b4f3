"""Saved runs, read from pytest-benchmark's file storage (``.benchmarks/<machine>/NNNN_*.json``).

Read-only: files are never modified. A file that cannot be read, or a scenario in it that is not a readable
record (``record.read``), is reported by name and skipped. History holds runs, not experiments: an A/B arm's run
(``experiment``) and a run the user set aside (``forget.py``) are left out of it, and named.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from . import forget, machine, record
from .gate import RunSample, power_cap_share

# What a scenario is judged and followed by: its throughput and, with a serving job, that job's latency at p50 and p99
# beside its neighbours and alone at the same rate (its own yardstick); p90 is followed, not gated.
LATENCY = ("p50", "p99", "alone p50", "alone p99")
METRICS = ("throughput", "p50", "p90", "p99", "alone p50", "alone p99")


@dataclass
class SavedRun:
    path: Path
    run_id: str  # the file's name without .json
    datetime: str
    commit: str | None
    machine: dict  # machine_info["gpucolloc"]
    scenarios: dict[str, record.ScenarioRecord]  # benchmark fullname -> this plugin's record
    problems: list[str] = field(default_factory=list)  # scenarios skipped, and why

    def matches(self, wanted: str) -> bool:
        """The run's id, or its NNNN number."""
        return self.run_id == wanted or self.run_id.split("_")[0] == wanted

    def sample(self, fullname: str, metric: str = "throughput") -> RunSample | None:
        """The scenario as the gate judges ``metric`` (None: not in this run, or no serving job for a latency)."""
        scenario = self.scenarios.get(fullname)
        if scenario is None:
            return None
        if metric == "throughput":
            return sample_of(scenario, self.run_id, self.machine, self.datetime, self.commit)
        return latency_sample_of(scenario, self.run_id, self.machine, self.datetime, self.commit, metric)


AB_SAVE_TAG = "ab-"  # the save name ``pytest-gpucolloc ab`` gave its arms: NNNN_ab-<time>-<arm>.json


def experiment(run: SavedRun) -> str | None:
    """Why ``run`` is an experiment, not a run of the history (None: it is an ordinary run). An A/B arm's
    windows are measured in turns with the other arm (its workers idle half the time): neither a baseline nor a
    comparison of ordinary runs. Its run says so since 2026-12-03; older arms are known by their save name."""
    kind = run.machine.get("experiment")
    if kind:
        return f"an experiment ({kind}), not a run of the history"
    if run.run_id.partition("_")[2].startswith(AB_SAVE_TAG):
        return "an A/B arm's run (saved as ab-...), not a run of the history"
    return None


def why_left_out(root: Path, run: SavedRun, forgotten: dict | None = None) -> str | None:
    """Why the saved ``run`` under the storage ``root`` is not a run of its history (None: it is): an experiment,
    or a run the user set aside. ``forgotten``: ``forget.read(root)``, when already read."""
    return experiment(run) or forget.why(forget.read(root) if forgotten is None else forgotten, root, run.path)


def sample_of(scenario: record.ScenarioRecord, run_id: str, run_machine: dict | None = None, datetime: str = "",
              commit: str | None = None) -> RunSample:
    """What the gate needs of a saved scenario. Version-1 runs kept the GPU and its configuration only for the
    whole run (``run_machine``); version 2 keeps them per scenario (xdist runs use several GPUs)."""
    run_machine = run_machine or {}
    gpu = scenario.gpu or {}
    config = scenario.config or {k: run_machine[k] for k in machine.BOUNDING if k in run_machine}
    return RunSample(run_id, scenario.rounds, gpu_name=gpu.get("name", run_machine.get("gpu_name")),
                     gpu_uuid=gpu.get("uuid", run_machine.get("gpu_uuid")), throttled=scenario.throttled,
                     datetime=datetime, commit=commit, contaminated=bool(scenario.foreign_pids), config=config,
                     repeats=scenario.repeats, eager=scenario.eager_on_gpu, autotuned=scenario.autotuned_on_gpu,
                     jobs=_jobs(scenario), power_capped_share=power_cap_share(scenario.telemetry))


def _jobs(scenario: record.ScenarioRecord) -> tuple[str, ...]:
    """The workers' labels, sorted, a serving job's with its rate as asked (``record.service_as_asked``)."""
    serving = scenario.serving or {}
    labels, label = list(scenario.workloads), serving.get("workload")
    if label in labels:
        labels[labels.index(label)] = record.service_as_asked(serving)
    return tuple(sorted(labels))


def latency_sample_of(scenario: record.ScenarioRecord, run_id: str, run_machine: dict | None = None,
                      datetime: str = "", commit: str | None = None, metric: str = "p99") -> RunSample | None:
    """A serving job's latency (``metric``: "p50", "p90", "p99", or "alone p50"/"alone p99": the job alone at the same
    rate) as the gate judges it: each round's 1/latency (1/ms), higher is better as throughput is, grouped by
    fresh-process repeat as the throughput's rounds are (``gate.decide`` says it in ms again). None without a serving
    job or rounds of that percentile (saved before they were kept). A saturated service carries why (not judged)."""
    serving = scenario.serving
    if not serving:
        return None
    alone = metric.startswith("alone ")
    rounds = serving.get(f"{'alone_' if alone else ''}round_{metric.split()[-1]}_ms") or []
    sizes = [len(r) for r in scenario.repeats]
    if not alone and sum(sizes) == len(rounds) and len(sizes) > 1:
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        sets = [rounds[start:start + size] for start, size in zip(starts, sizes)]
    else:
        sets = [rounds]
    inverse = [kept for part in sets if (kept := tuple(1 / ms for ms in part if ms is not None and ms > 0))]
    if not inverse:
        return None
    saturated = (serving.get("why") or "its queue grew") if serving.get("saturated") and not alone \
        else "its queue grew, alone at the same rate" if alone and serving.get("alone_saturated") else None
    return dataclasses.replace(sample_of(scenario, run_id, run_machine, datetime, commit),
                               rounds=tuple(x for part in inverse for x in part),
                               repeats=tuple(inverse) if len(inverse) > 1 else (), latency=metric, saturated=saturated)


def series_gpu(run: SavedRun, scenario: record.ScenarioRecord) -> str:
    """The physical GPU a saved scenario ran on (its history is kept per GPU), or "CPU smoke"."""
    uuid = (scenario.gpu or {}).get("uuid") or run.machine.get("gpu_uuid")
    return uuid or ("CPU smoke" if scenario.device == "cpu" else "unknown GPU")


def short_name(fullname: str) -> str:
    """The test's name as pytest-benchmark shows it: ``test_x[naive-2]`` of ``benchmarks/f.py::test_x[naive-2]``."""
    return fullname.split("::")[-1]


@dataclass
class History:
    runs: list[SavedRun] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "path: why it was skipped"
    left_out: list[tuple[SavedRun, str]] = field(default_factory=list)  # experiments and forgotten runs, and why

    def samples(self, fullname: str, exclude: Collection[str] = frozenset(), metric: str = "throughput"
                ) -> list[RunSample]:
        found = (run.sample(fullname, metric) for run in self.runs if run.run_id not in exclude)
        return [s for s in found if s is not None]

    def find(self, wanted: str) -> SavedRun | None:
        return next((run for run in self.runs if run.matches(wanted)), None)

    def named(self, wanted: str) -> list[SavedRun]:
        """The runs ``wanted`` names (a run id or its NNNN number), those left out included: named, they are asked
        for."""
        return [run for run in self.runs + [r for r, _ in self.left_out] if run.matches(wanted)]


MAX_FILE_BYTES = 256 * 2**20  # a saved run of a few hundred scenarios is a few MB


def read_run(path: Path) -> SavedRun:
    """One saved file; ValueError (or OSError) when it is not a pytest-benchmark file at all, or its own fields
    are not what one holds. Whatever sits in the storage, reading it is bounded: only regular files of a sane size
    are opened (a FIFO would block), and no nesting is too deep to read."""
    path = Path(path)
    if not path.exists():
        raise ValueError("no such file")
    if not path.is_file():
        raise ValueError("not a regular file")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ValueError(f"{size:,} bytes, more than a saved run can be ({MAX_FILE_BYTES:,})")
    try:
        data = json.loads(path.read_bytes())
    except RecursionError:  # the parser's own limit, far below what fills a file
        raise ValueError("nested too deep to be a saved run") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise ValueError("not a pytest-benchmark file (no benchmarks list)")
    scenarios, problems = {}, []
    for bench in data["benchmarks"]:
        info = bench.get("extra_info") if isinstance(bench, dict) else None
        if not record.is_record(info):
            continue  # another plugin's benchmark
        name = bench.get("fullname") or bench.get("name")
        try:
            scenarios[record.read_name(name)] = record.read(info)
        except record.RecordError as error:
            problems.append(f"{path}: scenario {name[:200] if isinstance(name, str) else '?'} skipped ({error})")
    when, commit, identity = record.read_run_fields(data)  # RecordError is a ValueError: the file is skipped
    return SavedRun(path, path.stem, when, commit, identity, scenarios, problems)


def load(root: Path) -> History:
    history = History()
    if not root.exists():
        return history
    forgotten = forget.read(root)
    for path in sorted(root.rglob("*.json")):
        try:
            run = read_run(path)
        except (OSError, ValueError) as error:  # JSONDecodeError is a ValueError
            history.problems.append(f"{path}: skipped ({type(error).__name__}: {str(error)[:120]})")
            continue
        history.problems += run.problems
        why = why_left_out(root, run, forgotten)
        if run.scenarios and why:
            history.left_out.append((run, why))
        elif run.scenarios:
            history.runs.append(run)
    history.runs.sort(key=lambda r: r.datetime)
    return history
