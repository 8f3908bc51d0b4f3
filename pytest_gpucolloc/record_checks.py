"""The checks a saved record's every field passes before anything reads it: each either has the type and range its
readers assume, or the scenario is refused with ``RecordError`` naming the field. ``record.read`` applies them."""
from __future__ import annotations

import math
from typing import Any


class RecordError(ValueError):
    """extra_info that claims to be a record of this plugin but is not a readable one."""


MAX_DEPTH = 32  # lists and objects nested in a record (ours nest about 6 deep); deeper is refused before reading
MAX_ITEMS = 100_000  # rounds, workers, telemetry phases, ...: far more than any run takes
MAX_TEXT = 10_000  # characters of a label, name or note


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Lists and objects nested more than ``limit`` deep (walked without recursion, so any depth is safe)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list, tuple)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return False


def short(value: Any) -> str:
    return repr(value)[:40] if not isinstance(value, (dict, list)) else type(value).__name__


def finite(value: Any, what: str, positive: bool = False, low: float | None = 0.0) -> float:
    """A finite number (not a bool, not a string of digits), at least ``low``; positive: above 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or (low is not None and value < low) or (positive and value <= 0):
        kind = "positive" if positive else "non-negative" if low == 0 else "any"
        raise RecordError(f"{what} must be a finite {kind} number, got {short(value)}")
    return float(value)


def positive_finite(value: Any, what: str) -> float:
    return finite(value, what, positive=True)


# A latency the plugin can have measured: its histograms hold 1 us to 1 hour (serving.LOWEST_US, HIGHEST_US), and a
# percentile may read up to one bucket above that; anything else in a record (5e-324, 1e308) is not a latency.
LATENCY_MS = (0.001, 7_200_000.0)


def latency(value: Any, what: str) -> float:
    ms = finite(value, what)
    if not LATENCY_MS[0] <= ms <= LATENCY_MS[1]:
        raise RecordError(f"{what} must be a latency from {LATENCY_MS[0]:g} to {LATENCY_MS[1]:,.0f} ms, got {ms:g}")
    return ms


# A throughput a job can have (per second): from a step in 11 days to beyond any GPU's tokens; 1e-300 or 1e300 in a
# record is no measurement, and a baseline of such runs would overflow the gate's arithmetic. A speedup: likewise.
THROUGHPUT = (1e-6, 1e13)
MAX_SPEEDUP = 1e6


def throughput(value: Any, what: str) -> float:
    rate = finite(value, what, positive=True)
    if not THROUGHPUT[0] <= rate <= THROUGHPUT[1]:
        raise RecordError(f"{what} must be a throughput from {THROUGHPUT[0]:g} to {THROUGHPUT[1]:g} per second, "
                          f"got {rate:g}")
    return rate


def speedup(value: Any, what: str) -> float:
    ratio = finite(value, what)
    if ratio > MAX_SPEEDUP:
        raise RecordError(f"{what} must be at most {MAX_SPEEDUP:g}, got {ratio:g}")
    return ratio


def real(value: Any, what: str) -> float:  # a change or an interval bound: negative too
    return finite(value, what, low=None)


def count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise RecordError(f"{what} must be a whole number from 0 to 2**63, got {short(value)}")
    return value


def text(value: Any, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise RecordError(f"{what} must be a text of at most {MAX_TEXT:,} characters, got {short(value)}")
    return value


def flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise RecordError(f"{what} must be true or false, got {short(value)}")
    return value


def scalar(value: Any, what: str) -> Any:
    """A configuration value: compared and printed, never computed with."""
    if isinstance(value, str):
        return text(value, what)
    if value is None or isinstance(value, bool):
        return value
    return real(value, what)


def optional(check):
    return lambda value, what: None if value is None else check(value, what)


def list_of(check, nonempty: bool = False):
    def checked(value: Any, what: str) -> list:
        if not isinstance(value, (list, tuple)) or len(value) > MAX_ITEMS or (nonempty and not value):
            raise RecordError(f"{what} must be a {'non-empty ' if nonempty else ''}list of at most {MAX_ITEMS:,} "
                              f"items, got {short(value)}")
        return [check(item, f"an item of {what}") for item in value]
    return checked


def object_of(known: dict | None = None, values=None):
    """An object with text keys; ``known`` keys checked where present (None is absent), other keys' values by
    ``values`` when given, else kept as saved (only displayed, or not read at all)."""
    known = known or {}

    def checked(value: Any, what: str) -> dict:
        if not isinstance(value, dict) or len(value) > MAX_ITEMS:
            raise RecordError(f"{what} must be an object, got {short(value)}")
        out = {}
        for key, item in value.items():
            if key in known:
                out[key] = None if item is None else known[key](item, f"{what}.{key}")
            else:
                out[key] = item if values is None else values(item, f"{what}.{key}")
        return out
    return checked


GPU = object_of({"index": count, "uuid": text, "name": text}, values=scalar)
PHASE = object_of({"sm_activity_pct": finite, "power_capped_share": finite, "throttled": flag,
                  "throttle_share": object_of(values=finite), "throttle_reasons": list_of(text),
                  "foreign_pids": list_of(count)})
MEASUREMENT = object_of({"fixed_cost_s": finite, "wall_s": finite, "rounds": count, "same_as": text,
                        "stopped": text})
VERDICT = {"verdict": text, "reason": text, "baseline": finite, "current": finite, "change": real,
            "ci": list_of(real), "mde": finite, "mde_noise": finite, "threshold": finite,
            "baseline_runs": list_of(text), "notes": list_of(text), "metric": text,
            "noise": object_of({"shares": object_of(values=optional(finite)), "dominant": text, "lever": text})}
# a serving scenario's latency judgements inside its verdict ("p99" alone: saved before p50 was judged too)
GATE = object_of({**VERDICT, "latency": object_of(values=object_of(VERDICT)), "p99": object_of(VERDICT)})
MODE_FACTS = object_of({"mig_layout": list_of(object_of())})
PARAMS = object_of({"model": text, "options": object_of(), "mig": text, "cuda_graph": flag, "batch_size": count})
SERVING = object_of({  # a serving job's numbers (serving.summary; fixture._serving adds the rest)
    "rate": scalar, "offered_rps": finite, "achieved_rps": finite, "requests": count, "p50_ms": latency,
    "p90_ms": latency, "p99_ms": latency, "p999_ms": latency, "max_ms": latency,
    "round_p50_ms": list_of(optional(latency)), "round_p90_ms": list_of(optional(latency)),
    "round_p99_ms": list_of(optional(latency)), "backlog": list_of(count), "unserved": count, "saturated": flag,
    "why": text, "histogram": text, "workload": text, "rate_asked": text, "alone_p50_ms": latency,
    "alone_p99_ms": latency, "alone_round_p50_ms": list_of(optional(latency)),
    "alone_round_p99_ms": list_of(optional(latency)), "alone_saturated": flag, "p99_vs_alone": finite,
    "training_jobs": count, "training_throughput": finite, "training_kept": finite})
WORKER = {  # field -> check, for the fields a reader uses (None: absent)
    "params": PARAMS, "throughput": throughput,
    "round_throughputs": list_of(finite), "cv": finite, "step_time_median_s": finite, "step_time_cv": finite,
    "measured_s": finite, "peak_memory_bytes": count, "reserved_memory_bytes": count,
    "device_memory_bytes": count, "cpus": list_of(count), "pid": count, "startup_s": finite,
    "startup_phases_s": object_of(values=finite), "cuda_visible_devices": text, "device_uuid_seen": text,
    "alone_throughput": finite, "tokens_per_s": finite, "data_wait_share": finite, "serving": SERVING,
}
SCENARIO = {
    "gpu": GPU, "device": text, "n_workers": count, "aggregate_throughput": throughput, "aggregate_cv": finite,
    "speedup_vs_sequential": speedup, "ideal_throughput": finite, "efficiency": finite,
    "samples_per_joule": finite, "throttled": flag, "foreign_pids": list_of(count), "telemetry": list_of(PHASE),
    "cpu_affinity": text, "cpu_placement": text, "gate": GATE, "gate_by": text, "measurement": MEASUREMENT,
    "warnings": list_of(text), "serving": SERVING,
}


def fields_of(data: dict, checks: dict, prefix: str) -> dict:
    """The checked value of each field in ``checks`` (None where absent or null)."""
    return {name: None if data.get(name) is None else check(data[name], prefix + name)
            for name, check in checks.items()}
