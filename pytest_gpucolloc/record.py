"""The saved-run record: what one scenario leaves in pytest-benchmark's ``extra_info``. This module alone
writes it (``write``) and reads it (``read``); the summary, the gate, ``compare``, ``table`` and the plots
read only the ``ScenarioRecord`` it returns.

``extra_info["gpucolloc"]`` is the record's version. Version 2 (current)::

    gpucolloc            2
    mode                 sharing mode: sequential, naive, mps, mps-partitioned, mig
    device               "cuda" or "cpu" (CPU smoke mode)
    gpu                  {index, uuid, name} of the GPU it ran on and the configuration that bounds its performance
                         (power_limit_w, application_sm_clock_mhz, max_sm_clock_mhz, mig_mode, ecc_mode), or null
    workloads            one label per worker, e.g. "resnet26-cifar10/bs128"
    n_workers            len(workloads)
    aggregate_round_throughputs   aggregate samples/s per measurement round (all workers' rounds share
                                  their boundaries; for sequential: equal work per job)
    repeats              aggregate_round_throughputs split by fresh-process repeat (--colloc-repeats): one list
                         per repeat, one list in all without repeats
    aggregate_throughput mean of the rounds; aggregate_cv: their coefficient of variation
    speedup_vs_sequential  sum over jobs of collocated / alone throughput, each over its whole measured window
                         (alone: same session and GPU)
    ideal_throughput, efficiency   one process training the summed batch, and aggregate / that
    cpu_affinity         how CPU cores were given to workers
    samples_per_joule, foreign_pids, telemetry (one dict per phase and repeat: power, clocks, power-cap share,
                         GPM, ...)
    throttled            an abnormal clock condition held (thermal, HW slowdown, power brake, or an SM clock below
                         75% of its maximum): the run is not comparable. The power cap is recorded, never this.
    mode_facts           what the sharing mode recorded (MPS daemon, MIG layout, ...)
    measurement          how it was measured: fixed_cost_s (spawn to every worker warm, all phases and repeats),
                         rounds, stopped (why no more rounds were taken: precision reached, out of reach, most rounds
                         reached), wall_s (the scenario from set-up to tear-down), same_as (a scenario made of a
                         measurement taken once in the session: "alone" for sequential scenarios and one job under
                         naive, "mps" for one mps-partitioned client; its fixed_cost_s and wall_s are 0)
    gate                 the gate's verdict when the run was gated, else absent
    workers              one dict per worker, in scenario order:
        workload, params (Workload.to_dict()), throughput, round_throughputs, cv, step_time_median_s,
        step_time_cv, measured_s, peak_memory_bytes, reserved_memory_bytes, device_memory_bytes, cpus, pid,
        startup_s, startup_phases_s, cuda_visible_devices, device_uuid_seen, gpm_of_its_mig_instance,
        mode_facts (the worker's limits and checks: sm_percent, sm_count_seen, MIG instance, ...),
        alone_throughput (the same job alone in the same session: the speedup's reference), tokens_per_s
        (language models: samples/s times the sequence length), data_wait_share (data-loader jobs: share of
        the measured time the training process waited for a batch)

Version 1 (sessions before 2026-12) had the same fields but ``repeats``, the mode's facts stood beside the
record's own keys (a fact could shadow a field), the CPU note was called ``cpu_placement``, and ``throttled``
counted the power cap; early version-1 runs lack ``gpu``, ``foreign_pids``, ``throttle_share`` and the start-up
fields. ``read`` accepts both and judges ``throttled`` by today's rule from the telemetry they kept.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

VERSION = 2
MARKER = "gpucolloc"  # the extra_info key holding the version: a scenario of this plugin
# Below this SM activity a job leaves the GPU mostly idle (on the H200 a lone eager ResNet26 job: 5-12%; a GPU-bound
# ResNet152 pair: 95%).
LAUNCH_BOUND_SM_ACTIVITY = 50.0

_WORKER_FIELDS = ("workload", "params", "throughput", "round_throughputs", "cv", "step_time_median_s",
                  "step_time_cv", "measured_s", "peak_memory_bytes", "reserved_memory_bytes", "device_memory_bytes",
                  "cpus", "pid", "startup_s", "startup_phases_s", "cuda_visible_devices", "device_uuid_seen",
                  "gpm_of_its_mig_instance", "alone_throughput", "tokens_per_s", "data_wait_share")
_SCENARIO_FIELDS = ("mode", "device", "gpu", "workloads", "n_workers", "aggregate_round_throughputs", "repeats",
                    "aggregate_throughput", "aggregate_cv", "speedup_vs_sequential", "ideal_throughput",
                    "efficiency", "cpu_affinity", "samples_per_joule", "throttled", "foreign_pids", "telemetry",
                    "gate", "workers", "measurement")


class RecordError(ValueError):
    """extra_info that claims to be a record of this plugin but is not a readable one."""


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

    @property
    def config(self) -> dict:
        """The configuration that bounds performance, as recorded with the scenario (version 2)."""
        return {k: v for k, v in (self.gpu or {}).items() if k not in ("index", "uuid", "name")}

    @property
    def mig_cannot_exist(self) -> str | None:
        """Why one MIG instance of each job's ``mig`` size cannot exist on this scenario's GPU model (the planner
        on its profile table); None when it fits, or when the jobs name no sizes."""
        from .mig.planner import why_it_cannot_exist

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
        from .workloads import autotunes_convolutions

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


def write(result, gate: dict | None = None) -> dict[str, Any]:
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
        "workers": [{**_write_worker(w), "alone_throughput": alone} for w, alone in
                    zip(result.workers, result.alone_throughputs or [None] * len(result.workers))],
    }
    if gate is not None:
        info["gate"] = gate
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
    }


def is_record(info: Any) -> bool:
    return isinstance(info, dict) and bool(info.get(MARKER))


def _finite(value: Any, what: str, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0):
        raise RecordError(f"{what} must be a finite {'positive' if positive else 'non-negative'} number, "
                          f"got {str(value)[:40]}")
    return float(value)


def _optional(value: Any, what: str) -> float | None:
    return None if value is None else _finite(value, what)


def _throttled(info: dict, telemetry: list[dict]) -> bool | None:
    """Today's rule on what a run kept: an abnormal reason held for THROTTLED_SHARE of a window, or the SM clock
    fell below the floor (only recorded since version 2); the power cap never counts."""
    from .telemetry import ABNORMAL_REASONS, throttled_why

    verdicts = []
    for phase in telemetry:
        if "throttled_why" in phase:  # judged when it was measured
            verdicts.append(bool(phase.get("throttled")))
        elif isinstance(phase.get("throttle_share"), dict):  # shares kept, the clock not judged then
            verdicts.append(bool(throttled_why(phase["throttle_share"], None, None)))
        elif isinstance(phase.get("throttle_reasons"), list):  # early runs: which reasons, not how long
            verdicts.append(any(name in ABNORMAL_REASONS for name in phase["throttle_reasons"]))
    if verdicts:
        return any(verdicts)
    return info.get("throttled") if isinstance(info.get("throttled"), bool) else None


def _read_worker(data: Any, version: int, index: int) -> WorkerRecord:
    if not isinstance(data, dict):
        raise RecordError(f"worker {index} is not an object")
    if version == 1:  # the mode's facts stood beside the fields
        facts = {k: v for k, v in data.items() if k not in _WORKER_FIELDS}
    else:
        facts = data.get("mode_facts") or {}
    if not isinstance(data.get("workload"), str):
        raise RecordError(f"worker {index} has no workload label")
    return WorkerRecord(
        workload=data["workload"],
        throughput=_finite(data.get("throughput"), f"worker {index}'s throughput"),
        round_throughputs=tuple(_finite(v, f"worker {index}'s round throughput")
                                for v in data.get("round_throughputs") or ()),
        params=data.get("params") if isinstance(data.get("params"), dict) else {},
        cv=_optional(data.get("cv"), f"worker {index}'s cv"),
        device_memory_bytes=data.get("device_memory_bytes") if isinstance(data.get("device_memory_bytes"), int) else None,
        peak_memory_bytes=data.get("peak_memory_bytes") if isinstance(data.get("peak_memory_bytes"), int) else None,
        startup_s=_optional(data.get("startup_s"), f"worker {index}'s start-up time"),
        alone_throughput=_optional(data.get("alone_throughput"), f"worker {index}'s alone throughput"),
        tokens_per_s=_optional(data.get("tokens_per_s"), f"worker {index}'s tokens/s"),
        data_wait_share=_optional(data.get("data_wait_share"), f"worker {index}'s data wait"),
        mode_facts=facts if isinstance(facts, dict) else {},
        other={k: data[k] for k in _WORKER_FIELDS if k in data},
    )


def read(info: Any) -> ScenarioRecord:
    """A saved scenario, checked: RecordError says what is wrong with it (the caller names the file)."""
    if not is_record(info):
        raise RecordError("not a pytest-gpucolloc scenario")
    version = info[MARKER]
    if version not in (1, 2):
        raise RecordError(f"record version {version!r} is newer than this pytest-gpucolloc reads "
                          f"(1-{VERSION}); upgrade pytest-gpucolloc")
    rounds = info.get("aggregate_round_throughputs")
    if not isinstance(rounds, list) or not rounds:
        raise RecordError("aggregate_round_throughputs must be a non-empty list")
    workloads = info.get("workloads")
    if not isinstance(workloads, list) or not workloads or not all(isinstance(w, str) for w in workloads):
        raise RecordError("workloads must be a non-empty list of labels")
    workers = info.get("workers")
    if not isinstance(workers, list) or not workers:
        raise RecordError("workers must be a non-empty list")
    if not isinstance(info.get("mode"), str):
        raise RecordError("mode must be a name")
    gpu = info.get("gpu")
    telemetry = info.get("telemetry") or []
    foreign = info.get("foreign_pids") or []
    if version == 1:
        facts = {k: v for k, v in info.items() if k not in _SCENARIO_FIELDS and k not in ("cpu_placement", MARKER)}
    else:
        facts = info.get("mode_facts") or {}
    gate = info.get("gate")
    telemetry = [t for t in telemetry if isinstance(t, dict)] if isinstance(telemetry, list) else []
    flat = tuple(_finite(v, "an aggregate round throughput", positive=True) for v in rounds)
    repeats = info.get("repeats") if version >= 2 else None
    if repeats is None:
        repeats = [rounds]
    if not isinstance(repeats, list) or not all(isinstance(r, list) and r for r in repeats) \
            or sorted(x for r in repeats for x in r) != sorted(rounds):
        raise RecordError("repeats must split aggregate_round_throughputs into non-empty lists")
    return ScenarioRecord(
        version=version,
        mode=info["mode"],
        device=str(info.get("device", "cuda" if gpu else "cpu")),
        workloads=tuple(workloads),
        rounds=flat,
        repeats=tuple(tuple(float(x) for x in r) for r in repeats),
        workers=tuple(_read_worker(w, version, i) for i, w in enumerate(workers)),
        gpu=gpu if isinstance(gpu, dict) else None,
        cv=_optional(info.get("aggregate_cv"), "aggregate_cv"),
        speedup=_optional(info.get("speedup_vs_sequential"), "speedup_vs_sequential"),
        ideal_throughput=_optional(info.get("ideal_throughput"), "ideal_throughput"),
        efficiency=_optional(info.get("efficiency"), "efficiency"),
        samples_per_joule=_optional(info.get("samples_per_joule"), "samples_per_joule"),
        throttled=_throttled(info, telemetry),
        foreign_pids=tuple(p for p in foreign if isinstance(p, int)) if isinstance(foreign, list) else (),
        telemetry=tuple(telemetry),
        cpu_affinity=str(info.get("cpu_affinity", info.get("cpu_placement", ""))),
        gate=gate if isinstance(gate, dict) else None,
        mode_facts=facts if isinstance(facts, dict) else {},
        measurement=info["measurement"] if isinstance(info.get("measurement"), dict) else {},
    )
