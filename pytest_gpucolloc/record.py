"""The saved-run record: what one scenario leaves in pytest-benchmark's ``extra_info``. This module alone
writes it (``write``) and reads it (``read``); the summary, the gate, ``compare``, ``table`` and the plots
read only the ``ScenarioRecord`` it returns.

The fields, version by version: docs/records.md (a change to them changes that page).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from . import record_checks as check
from .machine import BOUNDING
from .mig.planner import why_it_cannot_exist
from .record_checks import MAX_DEPTH, RecordError, too_deep
from .telemetry import ABNORMAL_REASONS, throttled_why
from .verdict import Verdict
from .workloads import autotunes_convolutions

VERSION = 2
MARKER = "gpucolloc"  # the extra_info key holding the version: a scenario of this plugin
# Below this SM activity a job leaves the GPU mostly idle (on the H200 a lone eager ResNet26 job: 5-12%; a GPU-bound
# ResNet152 pair: 95%).
LAUNCH_BOUND_SM_ACTIVITY = 50.0

# every field a writer writes (version 1 kept mode facts beside them): the checked ones and those never read
_WORKER_FIELDS = ("workload", *check.WORKER, "gpm_of_its_mig_instance")
_SCENARIO_FIELDS = ("mode", "workloads", "aggregate_round_throughputs", "repeats", "workers", *check.SCENARIO)


@dataclass(frozen=True)
class WorkerRecord:
    workload: str
    throughput: float
    round_throughputs: tuple[float, ...] = ()
    params: dict = field(default_factory=dict)
    cv: float | None = None
    device_memory_bytes: int | None = None
    peak_memory_bytes: int | None = None
    startup_s: float | None = None
    alone_throughput: float | None = None  # the same job alone in the same session (absent before 2026-12-01)
    tokens_per_s: float | None = None  # language models
    data_wait_share: float | None = None  # data-loader jobs
    mode_facts: dict = field(default_factory=dict)
    other: dict = field(default_factory=dict)  # the remaining saved fields, as saved


@dataclass(frozen=True)
class ScenarioRecord:
    version: int
    mode: str
    device: str
    workloads: tuple[str, ...]
    rounds: tuple[float, ...]  # aggregate throughput per round
    workers: tuple[WorkerRecord, ...]
    gpu: dict | None = None  # index, uuid, name
    cv: float | None = None
    speedup: float | None = None
    ideal_throughput: float | None = None
    efficiency: float | None = None
    samples_per_joule: float | None = None
    throttled: bool | None = None
    foreign_pids: tuple[int, ...] = ()
    telemetry: tuple[dict, ...] = ()
    cpu_affinity: str = ""
    gate: dict | None = None
    mode_facts: dict = field(default_factory=dict)
    repeats: tuple[tuple[float, ...], ...] = ()  # rounds of each fresh-process repeat; one entry without repeats
    measurement: dict = field(default_factory=dict)  # fixed_cost_s, rounds, stopped (absent before 2026-12-01)
    warnings: tuple[str, ...] = ()  # what makes its numbers doubtful (absent before 2026-12-03)
    serving: dict | None = None  # a serving job's latencies beside training neighbours (absent before 2026-12-03)
    gate_by: str | None = None  # "ab": judged by paired A/B, never against history

    @property
    def verdict(self) -> str | None:
        """The gate's verdict on the run, None when it was not gated: ``regressed`` when either its throughput or,
        for a serving scenario, a latency of its serving job regressed."""
        if not self.gate or not self.gate.get("verdict"):
            return None
        latency = [*(self.gate.get("latency") or {}).values(), self.gate.get("p99") or {}]
        return "regressed" if any(v.get("verdict") == "regressed" for v in latency) else self.gate["verdict"]

    @property
    def config(self) -> dict:
        """The configuration that bounds performance, as recorded with the scenario (version 2)."""
        return {k: v for k, v in (self.gpu or {}).items() if k not in ("index", "uuid", "name")}

    @property
    def mig_cannot_exist(self) -> str | None:
        """Why one MIG instance of each job's ``mig`` size cannot exist on this scenario's GPU model (the planner
        on its profile table); None when it fits, or when the jobs name no sizes."""
        return why_it_cannot_exist((self.gpu or {}).get("name"), [w.params.get("mig") for w in self.workers])

    @property
    def sm_activity(self) -> float | None:
        """Mean GPM SM activity (percent) over its phases, where measured."""
        values = [t["sm_activity_pct"] for t in self.telemetry if isinstance(t.get("sm_activity_pct"), (int, float))]
        return sum(values) / len(values) if values else None

    @property
    def eager_on_gpu(self) -> bool:
        """Ran on a GPU without CUDA graphs and left its SMs mostly idle (or unmeasured): bound by the CPU
        issuing kernels, so cuda_graph=True is a way to remove its launch noise."""
        launch_bound = self.sm_activity is None or self.sm_activity < LAUNCH_BOUND_SM_ACTIVITY
        return self.device == "cuda" and launch_bound and not all(w.params.get("cuda_graph") for w in self.workers)

    @property
    def autotuned_on_gpu(self) -> bool:
        """Ran on a GPU with convolutions whose algorithms cuDNN timed in each process: options={"cudnn_autotune":
        False} is a way to remove the noise of processes choosing differently."""
        return self.device == "cuda" and any(autotunes_convolutions(w.params) for w in self.workers)

    def alone_of(self, index: int) -> float | None:
        """Worker ``index``'s job alone in the same session: recorded per worker since 2026-12-01; before, for
        identical jobs, the aggregate divided by the speedup."""
        recorded = self.workers[index].alone_throughput
        if recorded or not (self.homogeneous and self.speedup):
            return recorded
        return self.throughput / self.speedup

    @property
    def throughput(self) -> float:
        """Aggregate samples/s: the mean of the rounds."""
        return sum(self.rounds) / len(self.rounds)

    @property
    def n_workers(self) -> int:
        return len(self.workloads)

    @property
    def homogeneous(self) -> bool:
        return len(set(self.workloads)) == 1

    @property
    def gpu_uuid(self) -> str | None:
        return (self.gpu or {}).get("uuid")


def describe_workers(labels: list[str]) -> str:
    return " + ".join(f"{n}x {label}" if n > 1 else label for label, n in Counter(labels).items())


def jobs(scenario: ScenarioRecord) -> str:
    """What ran together: the workload (several copies of it are counted by ``n``) or the mix, its jobs in one order
    whatever order a test started them in."""
    return scenario.workloads[0] if scenario.homogeneous else describe_workers(sorted(scenario.workloads))


def sm_reserved(scenario: ScenarioRecord) -> float | None:
    """The share of the SMs (percent) the sharing mode gave a service beside training jobs (mps-partitioned: its MPS
    limit, the training jobs sharing the rest); None where it was not limited."""
    service = next((w for w in scenario.workers if w.params.get("rate") is not None), None)
    limit = service.mode_facts.get("sm_percent") if service is not None else None
    return float(limit) if isinstance(limit, (int, float)) and limit < 100 else None


def write(result, gate: Verdict | dict | None = None) -> dict[str, Any]:
    """The extra_info of a ``scenario.ScenarioResult`` (JSON-able), with the gate's verdict if it was gated."""
    info = {
        MARKER: VERSION,
        "mode": result.mode,
        "device": result.device,
        "gpu": result.gpu,
        "n_workers": len(result.workloads),
        "workloads": [w.label for w in result.workloads],
        "aggregate_throughput": result.aggregate_throughput,
        "aggregate_round_throughputs": list(result.aggregate_rounds),
        "repeats": [list(r) for r in result.repeats] or [list(result.aggregate_rounds)],
        "aggregate_cv": result.cv,
        "speedup_vs_sequential": result.speedup,
        "ideal_throughput": result.ideal_throughput,
        "efficiency": result.efficiency,
        "cpu_affinity": result.cpu_note,
        "samples_per_joule": result.samples_per_joule,
        "throttled": result.throttled,
        "foreign_pids": result.foreign_pids,
        "telemetry": result.telemetry,
        "mode_facts": dict(result.mode_facts),
        "measurement": dict(result.measurement),
        "warnings": list(result.warnings),
        "workers": [{**_write_worker(w), "alone_throughput": alone} for w, alone in
                    zip(result.workers, result.alone_throughputs or [None] * len(result.workers))],
        "serving": result.serving,
    }
    if gate is not None:
        info["gate"] = gate if isinstance(gate, dict) else gate.to_dict()  # a dict: a saved verdict, written again
    return info


def _write_worker(worker) -> dict[str, Any]:
    ready, result = worker.ready, worker.result
    tokens = worker.workload.tokens_per_sample
    return {
        "workload": worker.workload.label,
        "params": worker.workload.to_dict(),
        **worker.stats.summary(),  # throughput, round_throughputs, cv, step_time_median_s, step_time_cv, measured_s
        "tokens_per_s": worker.stats.throughput * tokens if tokens else None,
        "data_wait_share": worker.data_wait_share,
        "peak_memory_bytes": result.peak_memory_bytes,
        "reserved_memory_bytes": result.reserved_memory_bytes,
        "device_memory_bytes": worker.device_memory_bytes,  # as NVML saw the process
        "cpus": list(worker.cpus) if worker.cpus else None,
        "pid": ready.pid,
        "startup_s": ready.since_spawn_s,
        "startup_phases_s": ready.startup_phases_s,
        "cuda_visible_devices": ready.cuda_visible_devices,
        "device_uuid_seen": ready.device_uuid,
        "gpm_of_its_mig_instance": worker.instance_metrics,
        "mode_facts": dict(worker.mode_facts),
        "serving": worker.serving,
    }


def service_as_asked(serving: dict) -> str:
    """A serving job's label (a record's ``serving``) with its rate as asked (``.../serve-80%``) rather than the
    requests/s that came to in its session: each session measures the job's capacity anew, so that number differs
    from run to run while the service is the same (``rate_asked`` reads "80% of 152.3/s alone back to back")."""
    label, asked = serving.get("workload") or "service", serving.get("rate_asked")
    if not asked or "/serve-" not in label:
        return label
    return f"{label.rsplit('/serve-', 1)[0]}/serve-{asked.split(' of ', 1)[0]}"


def is_record(info: Any) -> bool:
    return isinstance(info, dict) and bool(info.get(MARKER))


def read_run_fields(data: dict) -> tuple[str, str | None, dict]:
    """A saved file's own fields that readers use, checked: its datetime, commit and machine identity."""
    when = check.text(data.get("datetime") or "", "datetime")
    commit_info = data["commit_info"] if isinstance(data.get("commit_info"), dict) else {}
    commit = None if commit_info.get("id") is None else check.text(commit_info["id"], "commit_info.id")
    machine_info = data["machine_info"] if isinstance(data.get("machine_info"), dict) else {}
    identity = machine_info.get("gpucolloc") if isinstance(machine_info.get("gpucolloc"), dict) else {}
    if too_deep(identity):
        raise RecordError(f"machine_info is nested more than {MAX_DEPTH} lists or objects deep")
    checks = {"gpu_name": check.text, "gpu_uuid": check.text, "driver_version": check.text, "device": check.text,
              "experiment": check.text, "gpu_memory_total_bytes": check.count,
              **{key: check.scalar for key in BOUNDING}}
    return when, commit, check.object_of(checks)(identity, "machine_info.gpucolloc")


def _throttled(saved: bool | None, telemetry: list[dict]) -> bool | None:
    """Today's rule on what a run kept: an abnormal reason held for THROTTLED_SHARE of a window, or the SM clock
    fell below the floor (only recorded since version 2); the power cap never counts."""
    verdicts = []
    for phase in telemetry:
        if "throttled_why" in phase:  # judged when it was measured
            verdicts.append(bool(phase.get("throttled")))
        elif phase.get("throttle_share") is not None:  # shares kept, the clock not judged then
            verdicts.append(bool(throttled_why(phase["throttle_share"], None, None)))
        elif phase.get("throttle_reasons") is not None:  # early runs: which reasons, not how long
            verdicts.append(any(name in ABNORMAL_REASONS for name in phase["throttle_reasons"]))
    return any(verdicts) if verdicts else saved


def _read_worker(data: Any, version: int, index: int) -> WorkerRecord:
    what = f"worker {index}"
    if not isinstance(data, dict):
        raise RecordError(f"{what} is not an object")
    workload = check.text(data.get("workload"), f"{what}'s workload label")
    checked = check.fields_of(data, check.WORKER, f"{what}'s ")
    facts = {k: v for k, v in data.items() if k not in _WORKER_FIELDS} if version == 1 \
        else check.object_of()(data.get("mode_facts") or {}, f"{what}'s mode_facts")  # version 1: beside the fields
    return WorkerRecord(
        workload=workload,
        throughput=check.throughput(data.get("throughput"), f"{what}'s throughput"),
        round_throughputs=tuple(checked["round_throughputs"] or ()),
        params=checked["params"] or {},
        mode_facts=facts,
        other={k: checked.get(k, data[k]) for k in _WORKER_FIELDS if k in data},
        **{k: checked[k] for k in ("cv", "device_memory_bytes", "peak_memory_bytes", "startup_s", "alone_throughput",
                                   "tokens_per_s", "data_wait_share")},
    )


def read(info: Any) -> ScenarioRecord:
    """A saved scenario, checked field by field: RecordError says what is wrong with it (the caller names the
    file). Nothing else is raised, whatever ``info`` holds."""
    if not is_record(info):
        raise RecordError("not a pytest-gpucolloc scenario")
    version = info[MARKER]
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise RecordError(f"record version {check.short(version)} is not a version number")
    if version not in (1, 2):
        raise RecordError(f"record version {version} is newer than this pytest-gpucolloc reads "
                          f"(1-{VERSION}); upgrade pytest-gpucolloc")
    if too_deep(info):
        raise RecordError(f"nested more than {MAX_DEPTH} lists or objects deep")
    positive = check.throughput
    rounds = tuple(check.list_of(lambda v, what: positive(v, "an aggregate round throughput"), nonempty=True)(
        info.get("aggregate_round_throughputs"), "aggregate_round_throughputs"))
    workloads = check.list_of(check.text, nonempty=True)(info.get("workloads"), "workloads")
    workers = info.get("workers")
    if not isinstance(workers, list) or not workers:
        raise RecordError("workers must be a non-empty list")
    if len(workers) != len(workloads):
        raise RecordError(f"{len(workers)} workers for {len(workloads)} workloads")
    mode = check.text(info.get("mode"), "mode")
    checked = check.fields_of(info, check.SCENARIO, "")
    repeats = info["repeats"] if version >= 2 and info.get("repeats") is not None else [list(rounds)]
    repeats = check.list_of(check.list_of(lambda v, what: positive(v, "a repeat's round throughput"), nonempty=True))(
        repeats, "repeats")
    if sorted(x for r in repeats for x in r) != sorted(rounds):
        raise RecordError("repeats must split aggregate_round_throughputs into non-empty lists")
    facts = {k: v for k, v in info.items() if k not in (*_SCENARIO_FIELDS, MARKER)} if version == 1 \
        else info.get("mode_facts") or {}
    telemetry = checked["telemetry"] or []
    gpu = checked["gpu"]
    return ScenarioRecord(
        version=version,
        mode=mode,
        device=checked["device"] or ("cuda" if gpu else "cpu"),
        workloads=tuple(workloads),
        rounds=rounds,
        repeats=tuple(tuple(r) for r in repeats),
        workers=tuple(_read_worker(w, version, i) for i, w in enumerate(workers)),
        gpu=gpu,
        cv=checked["aggregate_cv"],
        speedup=checked["speedup_vs_sequential"],
        throttled=_throttled(checked["throttled"], telemetry),
        foreign_pids=tuple(checked["foreign_pids"] or ()),
        telemetry=tuple(telemetry),
        cpu_affinity=checked["cpu_affinity"] or checked["cpu_placement"] or "",
        mode_facts=check.MODE_FACTS(facts, "mode_facts"),
        measurement=checked["measurement"] or {},
        warnings=tuple(checked["warnings"] or ()),
        **{name: checked[name] for name in ("ideal_throughput", "efficiency", "samples_per_joule", "gate", "serving",
                                            "gate_by")},
    )
