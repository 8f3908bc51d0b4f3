"""Run one collocation scenario: provision the mode, run its phases of workers, measure, compute."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from . import forkserver, machine, measure, phases, protocol
from .cpu_affinity import CpuPolicy, assign_cpus
from .interleave import Link
from .modes.base import SharingMode, Target, WorkerCheckFailed
from .modes.sequential import SequentialMode
from .pool import ScenarioTimeout, WorkerFailed, WorkerPool, WorkerSlot
from .workloads import SMOKE_SEQ_LEN, ModelShape, Workload

START_LEAD_S = 0.5  # time for the measure command to reach every worker before the first boundary


@dataclass(frozen=True)
class Settings:
    rounds: int  # fewest rounds
    round_s: float
    warmup_s: float  # longest warm-up (it ends earlier once the step time stops improving)
    warmup_steps: int  # fewest warm-up steps
    timeout_s: float
    max_rounds: int = 0  # rounds are added until the mean is known within ``precision``; 0: ``rounds``
    precision: float = 0.0  # fraction: half-width of the mean's 95% confidence interval
    cpu_policy: CpuPolicy = CpuPolicy()
    image_size: int | None = None  # CPU smoke mode shrinks inputs
    batch_cap: int | None = None  # CPU smoke mode caps batch sizes
    extra_step_every: int | None = None  # injected slowdown (checking a regression gate)
    spawn: str = "forkserver"  # forked by the session's fork server (forkserver.py), or fresh interpreters
    cudnn: str = "autotune"  # how named convolutional workloads whose options do not say choose their algorithms

    def adapt(self, workload: Workload) -> Workload:
        options = dict(workload.options)
        if self.batch_cap and (workload.tokens_per_sample or 0) > SMOKE_SEQ_LEN:  # CPU smoke mode
            options["seq_len"] = SMOKE_SEQ_LEN
        if self.cudnn == "heuristics" and isinstance(workload.shape, ModelShape):
            options.setdefault("cudnn_autotune", False)
        if self.extra_step_every:  # a user's factory too (models.Slowed): never passed to it
            options["extra_step_every"] = self.extra_step_every
        if self.batch_cap and workload.batch_size > self.batch_cap:
            workload = workload.with_batch_size(self.batch_cap)
        return workload if options == workload.options else dataclasses.replace(workload, options=options)


@dataclass
class MeasuredWorker:
    """One training process of a scenario as measured: what it said (``protocol``) and what was seen of it."""

    workload: Workload
    stats: measure.WorkerStats
    ready: protocol.Ready
    result: protocol.Result
    cpus: tuple[int, ...] | None
    mode_facts: dict  # the mode's limits and checks for this worker (MPS share, MIG instance, ...)
    phase_telemetry: dict = field(default_factory=dict)  # of the phase this worker ran in

    @property
    def device_memory_bytes(self) -> int | None:
        """Device memory NVML saw this process use (MPS clients included)."""
        return self.phase_telemetry.get("memory_bytes_by_pid", {}).get(str(self.ready.pid))

    @property
    def data_wait_share(self) -> float | None:
        """Share of the measured time this worker waited for its data loader (None: no loader)."""
        waits = self.result.data_wait_s
        return None if waits is None else sum(waits) / sum(seconds for seconds, _ in self.result.rounds)

    @property
    def serving(self) -> dict | None:
        """A serving job's latencies and rates (``serving.summary``); None for a training job."""
        if not self.workload.serves or self.result.latency is None:
            return None
        from . import serving  # hdrhistogram only where a scenario has a service

        rate = self.workload.rate
        assert rate is not None
        return serving.summary(rate, rate if isinstance(rate, (int, float)) else None, self.result.rounds,
                               self.result.latency, self.ready.samples_per_step)

    @property
    def instance_metrics(self) -> dict | None:
        """GPM metrics of this worker's own MIG instance."""
        gi = self.mode_facts.get("gpu_instance_id")
        return self.phase_telemetry.get("per_gpu_instance", {}).get(str(gi)) if gi is not None else None


@dataclass
class ScenarioResult:
    """A measured scenario; ``record.write`` turns it into what is saved."""

    mode: str
    workloads: list[Workload]
    _: KW_ONLY  # the rest by name: many same-typed fields, a wrong position would pass silently
    workers: list[MeasuredWorker]  # one per workload, in scenario order
    aggregate_rounds: list[float]
    device: str
    cpu_note: str
    mode_facts: dict = field(default_factory=dict)  # what the mode recorded (MPS daemon, MIG layout)
    gpu: dict | None = None  # index, uuid, name of the GPU it ran on, and its configuration (machine.BOUNDING)
    speedup: float | None = None
    alone_throughputs: list[float | None] = field(default_factory=list)  # each worker's job alone, same session
    ideal_throughput: float | None = None
    repeats: list[list[float]] = field(default_factory=list)  # aggregate rounds of each fresh-process repeat
    measurement: dict = field(default_factory=dict)  # how it was measured: fixed cost, rounds, why it stopped
    extra_phases: list[dict] = field(default_factory=list)  # telemetry of the repeats after the first
    warnings: list[str] = field(default_factory=list)  # what makes its numbers doubtful (run_warnings.py)
    serving: dict | None = None  # the serving job's latencies, beside its numbers alone (fixture._serving)

    @property
    def aggregate_throughput(self) -> float:
        return sum(self.aggregate_rounds) / len(self.aggregate_rounds)

    @property
    def cv(self) -> float | None:
        return measure.coefficient_of_variation(self.aggregate_rounds)

    @property
    def efficiency(self) -> float | None:
        return self.aggregate_throughput / self.ideal_throughput if self.ideal_throughput else None

    @property
    def telemetry(self) -> list[dict]:
        """Telemetry of each phase (one for collocated modes, one per workload for sequential)."""
        phases = {id(w.phase_telemetry): w.phase_telemetry for w in self.workers if w.phase_telemetry}
        return list(phases.values()) + self.extra_phases

    @property
    def samples_per_joule(self) -> float | None:
        """Aggregate samples per joule of GPU energy; for sequential, equal work per job (like the
        aggregate): N samples cost sum(power_i / throughput_i) joules."""
        powers = [p for w in self.workers if (p := w.phase_telemetry.get("avg_power_w")) is not None and p > 0]
        if not powers or len(powers) < len(self.workers):
            return None
        if len(self.telemetry) - len(self.extra_phases) > 1:  # one phase per job (sequential)
            return len(self.workers) / sum(p / w.stats.throughput for p, w in zip(powers, self.workers))
        return self.aggregate_throughput / powers[0]

    @property
    def throttled(self) -> bool | None:
        flags = [t.get("throttled") for t in self.telemetry]
        return None if not flags else any(flags)

    @property
    def foreign_pids(self) -> list[int]:
        """Processes that were not ours but used the GPU during measurement (the result is contaminated)."""
        return sorted({pid for t in self.telemetry for pid in t.get("foreign_pids", [])})

    @property
    def homogeneous(self) -> bool:
        return len({w.key() for w in self.workloads}) == 1


def counted(workers: list[MeasuredWorker]) -> list[MeasuredWorker]:
    """The workers whose samples make a scenario's aggregate throughput: its training jobs (a serving job beside
    them is judged by its latency), or a serving job alone."""
    training = [w for w in workers if not w.workload.serves]
    return training or workers


def combine_repeats(results: list[ScenarioResult]) -> ScenarioResult:
    """One result of a scenario whose workers were started several times afresh: every repeat's rounds are
    kept (``repeats``); each worker's statistics cover all its repeats; start-up facts are the first repeat's."""
    first = results[0]
    if len(results) == 1:
        return first
    workers = [dataclasses.replace(
        worker, stats=measure.WorkerStats([r for result in results for r in result.workers[i].stats.rounds],
                                          worker.stats.samples_per_step),
        result=functools.reduce(protocol.joined, [result.workers[i].result for result in results]))
        for i, worker in enumerate(first.workers)]
    return dataclasses.replace(
        first, workers=workers, aggregate_rounds=[x for result in results for x in result.aggregate_rounds],
        repeats=[list(result.aggregate_rounds) for result in results],
        measurement={"fixed_cost_s": sum(r.measurement.get("fixed_cost_s", 0.0) for r in results),
                     "wall_s": sum(r.measurement.get("wall_s", 0.0) for r in results),
                     "rounds": sum(len(r.aggregate_rounds) for r in results),
                     "stopped": "; ".join(dict.fromkeys(r.measurement.get("stopped", "") for r in results))},
        extra_phases=[phase for result in results[1:] for phase in result.telemetry])


def taken_once(result: ScenarioResult, same_as: str, mode: str | None = None) -> ScenarioResult:
    """``result`` recorded again for another scenario (under ``mode``), saying whose it is, costing no time."""
    return dataclasses.replace(result, mode=mode or result.mode, measurement={
        **result.measurement, "fixed_cost_s": 0.0, "wall_s": 0.0, "same_as": same_as})


def sequential_of(alone: list[ScenarioResult]) -> ScenarioResult:
    """The ``sequential`` mode's scenario (the jobs one after another, each alone on the GPU), from each job's
    measurement alone: nothing is measured twice."""
    if len(alone) == 1:
        return taken_once(alone[0], "alone")
    workers = [result.workers[0] for result in alone]
    return ScenarioResult(
        SequentialMode.name, [w.workload for w in workers], workers=workers,
        aggregate_rounds=measure.sequential_aggregate([w.stats for w in counted(workers)]), device=alone[0].device,
        cpu_note="; ".join(dict.fromkeys(r.cpu_note for r in alone)), mode_facts=dict(alone[0].mode_facts),
        gpu=alone[0].gpu, extra_phases=[phase for r in alone for phase in r.extra_phases],
        measurement={"fixed_cost_s": 0.0, "wall_s": 0.0, "rounds": min(r.measurement.get("rounds", 0) for r in alone),
                     "stopped": "the jobs' alone measurements, taken once per session", "same_as": "alone"})


class ScenarioFailed(RuntimeError):
    def __init__(self, message: str, diagnostics: str = ""):
        super().__init__(message)
        self.diagnostics = diagnostics


def _explain(error: WorkerFailed, slot: WorkerSlot) -> str:
    """Make an out-of-memory read as what it is: the job does not fit its partition, or the GPU, with the
    numbers (what it tried to allocate, what was free)."""
    if error.error is None or error.error.type != "OutOfMemoryError":
        return str(error)
    details = error.error.details
    peak = details.get("max_memory_allocated_bytes")
    peak_text = f"; it had allocated {peak / 2**20:,.0f} MB at its peak" if peak else ""
    limit = slot.mode_facts.get("memory_limit_mb")
    if limit:
        return (f"{slot.workload.label} does not fit in its partition: pinned device memory limit "
                f"{limit} MB{peak_text}\n{error}")
    asked = re.search(r"Tried to allocate ([\d.]+ [KMGT]?i?B)", error.error.message)
    free, total = details.get("device_free_bytes"), details.get("device_total_bytes")
    room = f" with {free / 2**30:,.1f} GiB of {total / 2**30:,.1f} GiB free" if free is not None and total else ""
    return (f"{slot.workload.label} does not fit in the GPU's memory: it tried to allocate "
            f"{asked.group(1) if asked else 'more'}{room}{peak_text}\n{error}")


@dataclass(frozen=True)
class Pairing:
    """This scenario's block in an interleaved A/B (``interleave.py``): the other arm is measured in turns."""

    link: Link
    test: str
    block: int


def run_phase(slots: list[WorkerSlot], target: Target, settings: Settings, log_dir: Path,
              check: Callable[[list[WorkerSlot], list[protocol.Ready]], None], label_offset: int,
              sampler_factory: Callable | None = None, pairing: Pairing | None = None, phase: int = 0
              ) -> tuple[list[tuple[protocol.Ready, protocol.Result]], str, dict, dict]:
    """Start one phase's workers, wait until all are warm, measure them together (or in turns with the other arm
    of an A/B), stop them."""
    assignment = assign_cpus(len(slots), settings.cpu_policy, wants=[s.workload.cores_wanted for s in slots])
    for slot, cpus in zip(slots, assignment.cpus):
        slot.cpus = cpus
    telemetry: dict = {}
    server = forkserver.shared(exec_workers=settings.spawn == "fresh", vision=target.device != "cpu")
    paired = pairing if pairing is not None and pairing.link.start(pairing.test, pairing.block, phase) else None
    began = time.monotonic()
    pool = WorkerPool(slots, device=target.device, warmup_s=settings.warmup_s, warmup_steps=settings.warmup_steps,
                      log_dir=log_dir, image_size=settings.image_size, label_offset=label_offset, forkserver=server,
                      timeout_s=settings.timeout_s)
    phases.phase("start-up and warm-up", workers=len(slots))
    try:
        with pool:  # starting it may fail already: on a GPU each worker waits for the one before to connect
            ready = pool.wait_ready(settings.timeout_s)
            facts: dict[str, float | str] = {"fixed_cost_s": time.monotonic() - began}  # spawn to every worker warm
            check(slots, ready)
            if paired:
                phases.phase(f"ab block {paired.block + 1}: windows in turns with the other arm")
            served = paired.link.serve(paired.test, pool, settings.timeout_s) if paired else None
            if served is not None:
                results, facts["stopped"] = served
                return list(zip(ready, results)), assignment.note, telemetry, facts
            start = time.monotonic() + START_LEAD_S
            longest = max(settings.max_rounds, settings.rounds)
            window = (start, start + longest * (settings.round_s + START_LEAD_S))  # ends early when stopped
            sampler = sampler_factory(window, pool.pids, slots) if sampler_factory else contextlib.nullcontext()
            with sampler as sampling:
                results, facts["stopped"] = measure_until_precise(pool, start, settings,
                                                                  [slot.workload.serves for slot in slots])
            if sampling is not None:
                telemetry = sampling.summary()
    except WorkerFailed as error:
        slot = next((s for s, w in zip(slots, pool.workers) if w.label == error.label), slots[0])
        raise ScenarioFailed(_explain(error, slot)) from error
    except (ScenarioTimeout, WorkerCheckFailed) as error:
        raise ScenarioFailed(str(error)) from error
    return list(zip(ready, results)), assignment.note, telemetry, facts


def measure_until_precise(pool: WorkerPool, start: float, settings: Settings, serves: list[bool] | None = None
                          ) -> tuple[list[protocol.Result], str]:
    """The fewest rounds, then as many more as the spread so far needs (``measure.enough_rounds``). The workers
    train on between batches, so every round is taken under the same load."""
    longest = max(settings.max_rounds, settings.rounds)
    batch = settings.rounds if settings.precision > 0 else longest
    merged: list[protocol.Result] = []
    while True:
        done = len(merged[0].rounds) if merged else 0
        phases.rounds(start, settings.round_s, done + 1, done + batch, longest)
        results = pool.measure(start, settings.round_s, batch, timeout_s=batch * settings.round_s + settings.timeout_s)
        merged = results if not merged else [protocol.joined(old, new) for old, new in zip(merged, results)]
        aggregate = measure.counted_aggregate([list(r.rounds) for r in merged], serves or [False] * len(merged))
        stopped, needed = measure.enough_rounds(aggregate, settings.precision, longest)
        if stopped:
            return merged, stopped
        batch = min(needed, longest) - len(aggregate)
        start = time.monotonic() + START_LEAD_S


def run_scenario(workloads: list[Workload], mode: SharingMode, target: Target, settings: Settings,
                 log_dir: Path, sampler_factory: Callable | None = None, pairing: Pairing | None = None
                 ) -> ScenarioResult:
    """Provision ``mode`` for the workloads, run its phases, and compute the scenario's numbers; every
    process and piece of mode state is gone when it returns or raises."""
    began = time.monotonic()
    workloads = [settings.adapt(w) for w in workloads]
    mode.validate(workloads, target)
    phases.stage(f"{mode.name}: {' + '.join(w.label for w in workloads)}")
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    by_key: dict[tuple, MeasuredWorker] = {}
    records: list[MeasuredWorker] = []
    notes: list[str] = []
    measured: list[dict] = []  # how each phase was measured
    with mode.provision(workloads, target) as prov:
        try:
            offset = 0
            for phase, slots in enumerate(prov.phases):
                outcomes, note, phase_telemetry, facts = run_phase(
                    slots, target, settings, log_dir, prov.check_workers, offset, sampler_factory, pairing, phase)
                offset += len(slots)
                notes.append(note)
                measured.append(facts)
                for slot, (ready, result) in zip(slots, outcomes):
                    stats = measure.WorkerStats(list(result.rounds), ready.samples_per_step)
                    record = MeasuredWorker(slot.workload, stats, ready, result, slot.cpus, dict(slot.mode_facts),
                                            phase_telemetry)
                    records.append(record)
                    by_key.setdefault(slot.workload.key(), record)
        except ScenarioFailed as failure:
            failure.diagnostics = prov.diagnostics()  # read before teardown removes the logs
            raise
        except Exception as exc:
            diagnostics = prov.diagnostics()
            if diagnostics:
                raise ScenarioFailed(f"{type(exc).__name__}: {exc}", diagnostics) from exc
            raise

    workers = [by_key[w.key()] for w in workloads] if prov.one_at_a_time else records
    aggregate_of = measure.sequential_aggregate if prov.one_at_a_time else measure.concurrent_aggregate
    aggregate = aggregate_of([r.stats for r in counted(workers)])
    gpu = {"index": target.gpu.index, "uuid": target.gpu.uuid, "name": target.gpu.name, "mig_mode": target.gpu.mig_mode,
           **{k: target.gpu.extra.get(k) for k in machine.BOUNDING if k != "mig_mode"}} if target.gpu else None
    measurement = {"fixed_cost_s": sum(p["fixed_cost_s"] for p in measured), "rounds": len(aggregate),
                   "stopped": "; ".join(dict.fromkeys(p["stopped"] for p in measured)),
                   "wall_s": time.monotonic() - began}
    return ScenarioResult(mode.name, workloads, workers=workers, aggregate_rounds=aggregate, device=target.device,
                          cpu_note="; ".join(dict.fromkeys(notes)), mode_facts=dict(prov.mode_facts), gpu=gpu,
                          measurement=measurement)
