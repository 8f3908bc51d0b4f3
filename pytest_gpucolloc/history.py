"""Saved runs, read from pytest-benchmark's file storage (``.benchmarks/<machine>/NNNN_*.json``).

Read-only: saved files are never modified. A file that cannot be read, or a scenario in it that is not a readable
record (``record.read``), is reported by name and skipped. A storage of ``INDEX_FROM`` files or more keeps what
was read of each in an index beside them (``index.py``): what the gate and the change points judge (each scenario's
samples) comes from it, and a run's full records are read from its file only when a table or figure shows them.
History holds runs, not experiments: an A/B arm's run (``experiment``) and a run the user set aside (``forget.py``)
are left out of it, and named.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from . import forget, index, record, record_checks
from .samples import latency_sample_of, sample_of
from .verdict import RunSample

# What a scenario is judged and followed by: its throughput and, with a serving job, that job's latency at p50 and p99
# beside its neighbours and alone at the same rate (its own yardstick); p90 is followed, not gated.
LATENCY = ("p50", "p99", "alone p50", "alone p99")
METRICS = ("throughput", "p50", "p90", "p99", "alone p50", "alone p99")
MACHINE_FOLDER = re.compile(r"[^-/]+-[^-/]+-\d+\.\d+-\d+bit")  # pytest-benchmark's machine id: system, Python, bits
# The gate judges a scenario against its newest saved runs, this many times its baseline's runs at most
# (gate.Policy.runs: 300 by default): its current level and the level shift that started it are found among them,
# and the gate's cost stays the same however long the history grows.
GATE_WINDOW = 10


def run_number(run_id: str) -> str:
    """A saved run's NNNN number: the start of its id (pytest-benchmark's ``0006_commit_date``)."""
    return run_id.split("_")[0]


def numbered(run_ids: list[str], whole: list[str] | None = None) -> list[str]:
    """How a terminal names each run: its number where that names it alone among ``run_ids``, else ``whole``."""
    numbers = [run_number(run_id) for run_id in run_ids]
    return [number if numbers.count(number) == 1 else name for number, name in zip(numbers, whole or run_ids)]


@dataclass
class SavedRun:
    path: Path
    run_id: str  # the file's name without .json
    datetime: str
    commit: str | None
    machine: dict  # machine_info["gpucolloc"]
    scenarios: Mapping[str, record.ScenarioRecord]  # benchmark fullname -> this plugin's record
    problems: list[str] = field(default_factory=list)  # scenarios skipped, and why
    # (fullname, metric) -> the sample the gate judges, and fullname -> its series' GPU: made from the record when
    # first asked, or from what the index kept (``stored``, read when first asked)
    samples: dict[tuple[str, str], RunSample | None] = field(default_factory=dict, repr=False, compare=False)
    gpus: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    levels: dict[tuple[str, str], float | None] = field(default_factory=dict, repr=False, compare=False)
    stored: str | None = field(default=None, repr=False, compare=False)

    def matches(self, wanted: str) -> bool:
        """The run's id, or its NNNN number (``0006``, or ``6``)."""
        number = run_number(self.run_id)
        return self.run_id == wanted or number == wanted or (wanted.isdigit() and number.isdigit()
                                                             and int(wanted) == int(number))

    def sample(self, fullname: str, metric: str = "throughput") -> RunSample | None:
        """The scenario as the gate judges ``metric`` (None: not in this run, or no serving job for a latency)."""
        key = (fullname, metric)
        if self.stored is not None:
            try:
                self.samples.update({(name, each): _stored_sample(self, saved)
                                     for name, kept in json.loads(self.stored).items()
                                     for each, saved in zip(METRICS, kept, strict=True)})
            except (ValueError, TypeError, KeyError, AttributeError):  # a row of another shape: never trusted
                self.samples.clear()  # made from the records instead
            self.stored = None
        if key not in self.samples:
            if fullname not in self.scenarios:
                return None
            own = (self.scenarios[fullname], self.run_id, self.machine, self.datetime, self.commit)
            self.samples[key] = sample_of(*own) if metric == "throughput" else latency_sample_of(*own, metric)
        return self.samples[key]

    def level(self, fullname: str, metric: str = "throughput") -> float | None:
        """The scenario's level in its series (log throughput, or log ms of a latency), None where it is not part of
        one (not in this run, or not comparable)."""
        key = (fullname, metric)
        if key not in self.levels:
            sample = self.sample(fullname, metric)
            self.levels[key] = None if sample is None or sample.throttled or sample.contaminated or sample.saturated \
                else -sample.log_mean if sample.latency else sample.log_mean  # a latency's holds 1/latency
        return self.levels[key]

    def gpu(self, fullname: str) -> str:
        """The physical GPU the scenario ran on (its history is kept per GPU), or "CPU smoke"."""
        if fullname not in self.gpus:
            scenario = self.scenarios[fullname]
            uuid = (scenario.gpu or {}).get("uuid") or self.machine.get("gpu_uuid")
            self.gpus[fullname] = uuid or ("CPU smoke" if scenario.device == "cpu" else "unknown GPU")
        return self.gpus[fullname]


AB_SAVE_TAG = "ab-"  # the save name ``pytest-gpucolloc ab`` gave its arms: NNNN_ab-<time>-<arm>.json


def experiment(run: SavedRun) -> str | None:
    """Why ``run`` is an experiment, not a run of the history (None: it is an ordinary run). An A/B arm's
    windows are measured in turns with the other arm (its workers idle half the time): neither a baseline nor a
    comparison of ordinary runs. Its run says so since 2026-12-03; older arms are known by their save name."""
    if kind := run.machine.get("experiment"):
        return f"an experiment ({kind}), not a run of the history"
    if run.run_id.partition("_")[2].startswith(AB_SAVE_TAG):
        return "an A/B arm's run (saved as ab-...), not a run of the history"
    return None


def short_name(fullname: str) -> str:
    """The test's name as pytest-benchmark shows it: ``test_x[naive-2]`` of ``benchmarks/f.py::test_x[naive-2]``."""
    return fullname.split("::")[-1]


@dataclass
class History:
    runs: list[SavedRun] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "path: why it was skipped"
    left_out: list[tuple[SavedRun, str]] = field(default_factory=list)  # experiments, forgotten runs, copies; why
    empty: list[SavedRun] = field(default_factory=list)  # saved files holding no scenario of this plugin
    unreadable: list[Path] = field(default_factory=list)  # saved files skipped as unreadable (in ``problems``)
    accepted: dict[Path, str] = field(default_factory=dict)  # run's file (not id: folders share ids) -> when accepted
    copies: dict[Path, SavedRun] = field(default_factory=dict)  # a copy's file -> the run counted in its place

    def samples(self, fullname: str, exclude: Collection[Path] = frozenset(), metric: str = "throughput",
                last: int | None = None) -> list[RunSample]:
        """The scenario's samples, oldest first, but for the runs saved at ``exclude``; ``last``: only the newest this
        many (the newer runs alone are read)."""
        found = ((run.path, sample) for run in reversed(self.runs)
                 if run.path not in exclude and (sample := run.sample(fullname, metric)) is not None)
        return self._with_acceptance(list(itertools.islice(found, last))[::-1])

    def _with_acceptance(self, paths_and_samples: list[tuple[Path, RunSample]]) -> list[RunSample]:
        """The newest accepted run starts the level; runs after it judged regressed before it was accepted are of it."""
        found = [sample for _, sample in paths_and_samples]
        newest = max((i for i, (path, _) in enumerate(paths_and_samples) if path in self.accepted), default=None)
        if newest is None:
            return found
        when = self.accepted[paths_and_samples[newest][0]][:19]
        return [*found[:newest], dataclasses.replace(found[newest], accepted=True),
                *(dataclasses.replace(s, regressed=False) if s.regressed and s.datetime[:19] <= when else s
                  for s in found[newest + 1:])]

    def recent(self, last: int | None = None, since: str | None = None) -> list[SavedRun]:
        """The newest ``last`` runs (None or 0: all) saved at or after ``since`` (ISO date or time, UTC)."""
        runs = [run for run in self.runs if since is None or run.datetime >= since]
        return runs[-last:] if last else runs

    def named(self, wanted: str) -> list[SavedRun]:
        """The runs ``wanted`` names (a run id or its NNNN number), those left out included where it names no run of
        the history: named, they are asked for (but ``0002`` never adds an A/B arm's 0002 to an ordinary 0002)."""
        return [run for run in self.runs if run.matches(wanted)] \
            or [run for run, _ in self.left_out if run.matches(wanted)]


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
    if (size := path.stat().st_size) > MAX_FILE_BYTES:
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
            scenarios[record_checks.text(name, "the benchmark's name")] = record.read(info)
        except record.RecordError as error:
            problems.append(f"{path}: scenario {name[:200] if isinstance(name, str) else '?'} skipped ({error})")
    when, commit, identity = record.read_run_fields(data)  # RecordError is a ValueError: the file is skipped
    return SavedRun(path, path.stem, when, commit, identity, scenarios, problems)


INDEX_FROM = 64  # saved files: fewer are read in well under a second, and leave no index in small storages


def load(root: Path, use_index: bool | None = None) -> History:
    """Every saved run under ``root``, oldest first. ``use_index``: keep and use the storage's index (default:
    when it holds ``INDEX_FROM`` files or more)."""
    history = History()
    if not root.exists():
        return history
    found, history.problems = index.walk(root)
    forgotten, accepted = forget.read_beside(root), forget.read_beside(root, forget.ACCEPTED)
    readable: list[tuple[index.Found, SavedRun]] = []  # runs with scenarios, as found
    with index.opened(root, len(found) >= INDEX_FROM if use_index is None else use_index) as kept:
        fresh, keep = {}, set()
        shared: dict = {}  # what runs of one machine and suite share: read once
        for file in found:
            row = kept.known.get(file.key)
            run = _indexed(file, row, shared) if row is not None else None
            if run is None:
                try:
                    run = read_run(file.path)
                except (OSError, ValueError) as error:  # JSONDecodeError is a ValueError
                    history.problems.append(f"{file.path}: skipped ({type(error).__name__}: {str(error)[:120]})")
                    history.unreadable.append(file.path)
                    continue
                if kept.connection is not None:
                    fresh[file.key] = (file.size, file.mtime_ns, *_summary(run))
            keep.add(file.key)
            history.problems += run.problems
            if not run.scenarios:
                history.empty.append(run)
            else:
                readable.append((file, run))
        kept.update(fresh, keep)
        if kept.problem:
            history.problems.append(kept.problem)
    copies = _copies(readable)
    history.left_out += [(copy, f"a copy of {original.path} (one run saved twice): counted once")
                         for copy, original in copies]
    history.copies = {copy.path: original for copy, original in copies}
    files: dict[int, list[Path]] = {}  # the run counted -> its files: a list names the run by any of them
    for copy, original in copies:
        files.setdefault(id(original), [original.path]).append(copy.path)
    for _, run in readable:
        if run.path in history.copies:
            continue
        paths = files.get(id(run), [run.path])
        if why := experiment(run) or next(filter(None, (forget.why(forgotten, root, p) for p in paths)), None):
            history.left_out.append((run, why))
        else:
            history.runs.append(run)
            if (entry := next(filter(None, (forget.entry(accepted, root, p) for p in paths)), None)) is not None:
                history.accepted[run.path] = entry[0]
    history.runs = in_saved_order(history.runs)
    return history


def _copies(readable: list[tuple[index.Found, SavedRun]]) -> list[tuple[SavedRun, SavedRun]]:
    """Each run that another file holds too (an ``archive/`` folder, a link to a run), with the one kept: the oldest
    file (a copy is written later), of one time (``cp -a``) a file before a link and one in a folder pytest-benchmark
    names (``Linux-CPython-3.12-64bit``) before another, else the first found; counted twice, a run would weigh twice
    in a baseline."""
    def rank(file: index.Found) -> tuple:
        return file.mtime_ns, file.path.is_symlink(), not MACHINE_FOLDER.fullmatch(file.path.parent.name)

    kept: dict[tuple, tuple[index.Found, SavedRun]] = {}
    copies: list[tuple[SavedRun, tuple]] = []
    for file, run in readable:
        key = (run.datetime, run.commit, tuple((name, run.level(name)) for name in run.scenarios))
        seen = kept.setdefault(key, (file, run))
        if seen[1] is not run:
            if rank(file) < rank(seen[0]):
                kept[key], (file, run) = (file, run), seen
            copies.append((run, key))
    return [(copy, kept[key][1]) for copy, key in copies]


def in_saved_order(runs: list[SavedRun]) -> list[SavedRun]:
    """Oldest first: by the datetimes they record, except that within a machine folder pytest-benchmark's NNNN
    numbers order its runs (a machine's clock may be wrong, its counter is not); a run not so named keeps its place."""
    runs = sorted(runs, key=lambda r: r.datetime)
    places: dict[Path, list[int]] = {}
    for i, run in enumerate(runs):
        if run_number(run.run_id).isdigit():
            places.setdefault(run.path.parent, []).append(i)
    ordered = list(runs)
    for folder in places.values():
        numbered = sorted((runs[i] for i in folder), key=lambda r: (int(run_number(r.run_id)), r.datetime))
        for i, run in zip(folder, numbered):
            ordered[i] = run
    return ordered


OWN = ("run_id", "datetime", "commit")  # a sample's fields that are its run's: kept once, with the run


def _summary(run: SavedRun) -> tuple[str, str, str]:
    """What the index keeps of a run (JSON texts): its own fields and each scenario's series levels; what runs of
    one machine and suite share (the machine, the scenarios and their GPUs, read once for them all); its samples."""
    def saved(sample: RunSample | None) -> dict | None:
        if sample is None:
            return None
        fields = {k: v for k, v in dataclasses.asdict(sample).items() if k not in OWN}
        if len(sample.repeats) <= 1:
            fields["repeats"] = []  # one set: the rounds themselves
        return fields

    text = functools.partial(json.dumps, separators=(",", ":"))
    levels = [[run.level(name, metric) for metric in METRICS] for name in run.scenarios]
    shared = {"machine": run.machine, "gpus": {name: run.gpu(name) for name in run.scenarios}}
    samples = {name: [saved(run.sample(name, metric)) for metric in METRICS] for name in run.scenarios}
    return text([run.run_id, run.datetime, run.commit, run.problems, levels]), text(shared), text(samples)


def _stored_sample(run: SavedRun, saved: dict | None) -> RunSample | None:
    if saved is None:
        return None
    values = {**saved, "rounds": tuple(saved["rounds"]), "repeats": tuple(tuple(r) for r in saved["repeats"]),
              "jobs": tuple(saved["jobs"]), "config": dict(saved["config"]), "run_id": run.run_id,
              "datetime": run.datetime, "commit": run.commit}
    sample = RunSample(**values)
    numbers = [*sample.rounds, *(x for r in sample.repeats for x in r)]
    if not sample.rounds or not all(type(x) is float and math.isfinite(x) and x > 0 for x in numbers):
        raise ValueError("rounds of another shape")
    return sample


def _indexed(file: index.Found, row: index.Row, shared: dict[str, tuple[dict, list[str], dict[str, str]]]
             ) -> SavedRun | None:
    """A run as the index kept it (its samples are read when first asked, its records from the file); None when
    the file changed since, or the row is not what the index keeps (never trusted: the file is read instead).
    ``shared``: what runs share, read once."""
    size, mtime_ns, own, common, samples = row
    if (size, mtime_ns) != (file.size, file.mtime_ns):
        return None
    try:
        if common not in shared:
            kept = json.loads(common)
            run_machine, gpus = kept["machine"], kept["gpus"]
            if not isinstance(run_machine, dict) or not all(isinstance(g, str) for g in gpus.values()):
                raise ValueError("a machine of another shape")
            shared[common] = (run_machine, list(gpus), gpus)
        run_machine, names, gpus = shared[common]
        run_id, when, commit, problems, levels = json.loads(own)
        found = {(name, metric): level for name, kept in zip(names, levels, strict=True)
                 for metric, level in zip(METRICS, kept, strict=True)}
        if not all(level is None or (type(level) is float and math.isfinite(level)) for level in found.values()) \
                or not all(isinstance(p, str) for p in problems) or not isinstance(commit, (str, type(None))):
            raise ValueError("a run of another shape")
        return SavedRun(file.path, str(run_id), str(when), commit, run_machine, _Scenarios(file.path, names),
                        list(problems), gpus=dict(gpus), levels=found, stored=samples)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


class _Scenarios(Mapping):
    """An indexed run's scenarios: their names known, their records read from the file when first asked."""

    def __init__(self, path: Path, names: list[str]):
        self.path, self.names = path, names

    @functools.cached_property
    def records(self) -> Mapping[str, record.ScenarioRecord]:
        try:
            return read_run(self.path).scenarios
        except (OSError, ValueError):  # removed or changed since the index was read: nothing to show
            return {}

    def __getitem__(self, name: str) -> record.ScenarioRecord:
        return self.records[name]

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)
