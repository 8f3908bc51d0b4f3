"""Hostile saved runs: the ways a file in a benchmark storage can hold something a record is not. Used by
tests/test_reliability.py and research/fault-suite (which counts them)."""
import copy
import json

from pytest_gpucolloc import record, record_checks

WRONG = {"string": "12", "number": 12345, "object": {"uuid": 12345, "name": 7}, "list": ["fast", 1.0],
         "bool": True, "nan": float("nan"), "inf": float("inf"), "negative": -1}
TOP = record._SCENARIO_FIELDS + ("gpucolloc", "mode_facts")
WORKER = record._WORKER_FIELDS + ("mode_facts",)
HUGE = 200_001  # items: above record_checks.MAX_ITEMS
DEEP = 100_000  # nested arrays: past the JSON parser's recursion limit


def variants(saved: dict) -> dict[str, str]:
    """File name stem -> text of a pytest-benchmark file: ``saved`` (a real saved run) with its first scenario's
    record, or the file's own fields, changed in one hostile way. json.dumps writes NaN and Infinity as Python's
    json (and pytest-benchmark) reads them."""
    out = {}

    def put(name, change):
        data = copy.deepcopy(saved)
        change(data, data["benchmarks"][0]["extra_info"])
        out[name] = json.dumps(data)

    def setter(field, value, worker=False):
        def change(data, info):
            (info["workers"][0] if worker else info)[field] = copy.deepcopy(value)
        return change

    for kind, value in WRONG.items():
        for field in TOP:
            put(f"top-{field}-{kind}", setter(field, value))
        for field in WORKER:
            put(f"worker-{field}-{kind}", setter(field, value, worker=True))
    info = saved["benchmarks"][0]["extra_info"]
    rounds = info["aggregate_round_throughputs"]
    put("issue-gpu-uuid-number", setter("gpu", {"uuid": 12345, "name": 7}))
    put("issue-repeats-mixed", setter("repeats", [[str(rounds[0]), *rounds[1:]]]))
    put("issue-round-throughputs-not-a-list", setter("round_throughputs", "fast", worker=True))
    put("strings-for-rounds", setter("aggregate_round_throughputs", [str(x) for x in rounds]))
    put("string-for-throughput", setter("throughput", str(info["workers"][0]["throughput"]), worker=True))
    put("strings-in-telemetry", setter("telemetry", [{"sm_activity_pct": "95", "throttle_share": {"hw_slowdown": "1"}}]))
    put("string-in-measurement", setter("measurement", {"wall_s": "10", "rounds": "5"}))
    put("gate-ci-strings", setter("gate", {"verdict": "regressed", "baseline": "1e3", "ci": ["a", "b"]}))
    put("nan-rounds", setter("aggregate_round_throughputs", [float("nan")] * len(rounds)))
    put("inf-speedup", setter("speedup_vs_sequential", float("inf")))
    put("huge-rounds", setter("aggregate_round_throughputs", [1.0] * HUGE))
    put("huge-workloads", setter("workloads", ["x"] * HUGE))
    put("huge-telemetry", setter("telemetry", [{}] * HUGE))
    put("huge-label", setter("workload", "x" * (record_checks.MAX_TEXT + 1), worker=True))
    for field in ("p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms", "alone_p99_ms", "round_p99_ms"):
        for name, value in (("tiny", 5e-324), ("huge", 1e308)):  # finite, not a latency: 1/p99 overflows
            latency = [value] * len(rounds) if field == "round_p99_ms" else value
            put(f"latency-{field}-{name}", setter("serving", {"workload": "x", field: latency}, worker=True))
    for name, value in (("tiny", 1e-300), ("huge", 1e300)):  # finite, not a throughput: the gate's logs overflow
        put(f"throughput-rounds-{name}", setter("aggregate_round_throughputs", [value] * len(rounds)))
        put(f"throughput-worker-{name}", setter("throughput", value, worker=True))
    put("huge-speedup", setter("speedup_vs_sequential", 1e300))
    put("workers-mismatch", setter("workers", info["workers"] * 2))
    put("nested-40-in-gpu", setter("gpu", json.loads("[" * 40 + "]" * 40)))
    put("nested-40-in-params", setter("params", {"options": json.loads("[" * 40 + "]" * 40)}, worker=True))
    put("name-number", lambda data, _: data["benchmarks"][0].update(fullname=12345, name=12345))
    put("datetime-number", lambda data, _: data.update(datetime=12345))
    put("commit-number", lambda data, _: data.update(commit_info={"id": 12345}))
    put("machine-gpu-name-number", lambda data, _: data.setdefault("machine_info", {}).update(
        gpucolloc={"gpu_name": 7, "gpu_memory_total_bytes": "80GB"}))
    text = out["top-gpu-object"]
    out["nested-100000-in-record"] = text.replace('"gpu": {"uuid": 12345, "name": 7}',
                                                  '"gpu": ' + "[" * DEEP + "]" * DEEP)
    out["nested-100000-file"] = "[" * DEEP + "]" * DEEP
    return out


def one_of_each(names) -> list[str]:
    """The variants that are a class of their own (every field's wrong types are one class each: objects in gpu)."""
    return [name for name in names if not name.startswith(("top-", "worker-")) or name == "top-gpu-object"]
