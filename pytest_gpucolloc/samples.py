"""What the gate judges of a saved scenario: its throughput's rounds, or a serving job's latency, as a ``RunSample``
with what makes runs comparable (the jobs, the GPU and its configuration) and what disturbed the run."""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math

from . import machine, record
from .baseline import power_cap_share
from .verdict import RunSample
from .workloads import NAMED_WORKLOADS


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
                     jobs=_jobs(scenario), power_capped_share=power_cap_share(scenario.telemetry),
                     regressed=scenario.verdict == "regressed", slowed=bool(run_machine.get("slowed")))


def _jobs(scenario: record.ScenarioRecord) -> tuple[str, ...]:
    """The workers' labels, sorted, a serving job's with its rate as asked (``record.service_as_asked``), a user
    factory's with the options it was called with: they are part of what the job computes, as its batch size is."""
    serving = scenario.serving or {}
    labels, label = list(scenario.workloads), serving.get("workload")
    if label in labels:
        labels[labels.index(label)] = record.service_as_asked(serving)
    return tuple(sorted(label + _options(worker.params) for label, worker in zip(labels, scenario.workers)))


def _options(params: dict) -> str:
    """A user factory's options as they name its job; none for a built-in workload (its label shows them) and never
    the gate's own slowdown (``--colloc-extra-step-every``: judged against the same job's runs)."""
    options = params.get("options") if params.get("model") not in NAMED_WORKLOADS else None
    shown = {k: v for k, v in options.items() if k != "extra_step_every"} if isinstance(options, dict) else {}
    text = json.dumps(shown, sort_keys=True, separators=(",", ":"))
    if len(text) > 80:  # a note names it in a line: long options by their digest
        text = f"{{options sha1 {hashlib.sha1(text.encode()).hexdigest()[:12]}}}"
    return f" {text}" if shown else ""


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
    prefix = "alone_" if alone else ""
    rounds = serving.get(f"{prefix}round_{metric.split()[-1]}_ms") or []
    whole = serving.get(f"{prefix}{metric.split()[-1]}_ms")
    ends = list(itertools.accumulate(len(r) for r in scenario.repeats))
    if alone or ends[-1:] != [len(rounds)] or len(ends) < 2:
        ends = [len(rounds)]
    sets = [rounds[start:end] for start, end in zip([0, *ends], ends)]
    inverse = [kept for part in sets if (kept := tuple(1 / ms for ms in part if ms is not None and ms > 0))]
    if not inverse:
        return None
    saturated = (serving.get("why") or "its queue grew") if serving.get("saturated") and not alone \
        else "its queue grew, alone at the same rate" if alone and serving.get("alone_saturated") else None
    return dataclasses.replace(sample_of(scenario, run_id, run_machine, datetime, commit),
                               rounds=tuple(x for part in inverse for x in part),
                               repeats=tuple(inverse) if len(inverse) > 1 else (), latency=metric, saturated=saturated,
                               level=-math.log(whole) if whole and whole > 0 else None)
