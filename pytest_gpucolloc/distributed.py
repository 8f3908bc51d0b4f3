"""pytest-xdist: one xdist worker per GPU. pytest-benchmark is off under xdist, so each worker's scenarios go back
to the controller (xdist's ``workeroutput``) and are added to its pytest-benchmark session, where saving, comparing
and the gate see them as in a single-process run. ("Worker" here is an xdist worker, not ``pool.py``'s.)"""
from __future__ import annotations

import json

from . import nvml

OUTPUT_KEY = "gpucolloc"


def xdist_index(config) -> int | None:
    """0 for xdist worker gw0, ...; None in the controller or without xdist."""
    workerinput = getattr(config, "workerinput", None)
    return int(str(workerinput["workerid"]).removeprefix("gw")) if workerinput else None


def is_controller_of_workers(config) -> bool:
    return getattr(config, "workerinput", None) is None and config.getoption("dist", "no") != "no"


def check_workers_per_gpu(n_workers: int, gpus: list[nvml.GpuInfo]) -> None:
    """Never two xdist workers on one GPU (none selected: CPU smoke mode, nothing to share)."""
    if gpus and n_workers > len(gpus):
        raise ValueError(
            f"-n {n_workers} asks for {n_workers} xdist workers but {len(gpus)} GPU(s) are selected "
            f"({', '.join(str(g.index) for g in gpus)}); each worker needs a GPU of its own: use -n {len(gpus)}"
            + (" or run without -n" if len(gpus) == 1 else ""))


def forwarded_entry(benchmark, seconds_per_sample: list[float]) -> dict:
    """What a worker sends for one scenario: enough to rebuild pytest-benchmark's record."""
    return {"name": benchmark.name, "fullname": benchmark.fullname, "group": benchmark.group,
            "param": benchmark.param, "params": json.loads(json.dumps(benchmark.params, default=repr)),
            "extra_info": benchmark.extra_info, "data": seconds_per_sample}


def publish(config, entries: list[dict]) -> None:
    if getattr(config, "workeroutput", None) is not None:
        config.workeroutput[OUTPUT_KEY] = json.dumps(entries)


def receive(node) -> list[dict]:
    return json.loads(getattr(node, "workeroutput", {}).get(OUTPUT_KEY, "[]"))
