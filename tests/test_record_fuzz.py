"""Whatever a saved file holds, reading it either gives records every reader can use or names what is wrong:
arbitrary JSON, and real records with any field replaced by anything, thrown at the reader (hypothesis)."""
import copy
import json
import math
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_gpucolloc import advisor, gate, history, record, report, samples
from test_record import EARLY_V1, LATE_V1, measured

FIELDS = record._SCENARIO_FIELDS + ("gpucolloc", "mode_facts", "cpu_placement")
WORKER_FIELDS = record._WORKER_FIELDS + ("mode_facts",)
DELETE = object()

scalars = (st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats()
           | st.text(max_size=12) | st.sampled_from(["12", "nan", "1e400", "", "cuda", "regressed"]))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8) | st.sampled_from(FIELDS + WORKER_FIELDS), inner,
                                             max_size=4), max_leaves=12)


def _real_records() -> list[dict]:
    """Records as this version writes them (gated), and as version 1 saved them, early and late."""
    found = [json.loads(json.dumps(record.write(measured(), {"verdict": "unchanged", "baseline": 3000.0,
                                                             "ci": [-0.01, 0.02], "notes": ["a note"]})))]
    for path in [*sorted(EARLY_V1.glob("*.json"))[:1], LATE_V1]:
        benches = json.loads(path.read_text())["benchmarks"]
        found += [b["extra_info"] for b in benches[:3]]
    return found


REAL = _real_records()


def _paths(value, here=()):
    """Every place in a JSON value, the value itself first."""
    yield here
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        yield from _paths(child, here + (key,))


@st.composite
def mutated_records(draw):
    info = copy.deepcopy(draw(st.sampled_from(REAL)))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(info))[1:]))
        parent = info
        for key in path[:-1]:
            parent = parent[key]
        replacement = draw(json_values | st.just(DELETE))
        if replacement is DELETE:
            del parent[path[-1]]
        else:
            parent[path[-1]] = replacement
    return info


records_of_arbitrary_fields = st.fixed_dictionaries(
    {"gpucolloc": st.sampled_from([1, 2]) | scalars},
    optional={name: json_values for name in FIELDS if name != "gpucolloc"}
    | {"workers": st.lists(st.fixed_dictionaries({}, optional={n: json_values for n in WORKER_FIELDS}), max_size=3)})


def use(scenario: record.ScenarioRecord) -> None:
    """What the summary, the gate, the report and the advisor do with a record they are given."""
    report.table([("t", scenario)])
    report.time_spent([scenario], 1.0)
    sample = samples.sample_of(scenario, "r")
    assert math.isfinite(sample.log_mean) and math.isfinite(sample.log_sd)
    gate.decide(sample, [sample] * 3, gate.Policy())
    assert isinstance(scenario.eager_on_gpu, bool) and isinstance(scenario.autotuned_on_gpu, bool)
    assert scenario.mig_cannot_exist is None or isinstance(scenario.mig_cannot_exist, str)
    run = history.SavedRun(Path("0001_x.json"), "0001_x", "", None, {}, {"t": scenario})
    advisor.option_of("t", run, scenario, advisor.alone_references([run]))
    advisor.rank(advisor.options_for(Counter(scenario.workloads), [run])[0])


def read_or_refuse(info) -> None:
    try:
        scenario = record.read(info)
    except record.RecordError as error:
        assert str(error)  # says why
        return
    use(scenario)


FUZZ = settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(mutated_records())
def test_a_real_record_with_any_field_replaced_is_read_or_refused_with_a_reason(info):
    read_or_refuse(info)


@FUZZ
@given(records_of_arbitrary_fields)
def test_a_record_of_arbitrary_fields_is_read_or_refused_with_a_reason(info):
    read_or_refuse(info)


@settings(max_examples=60, deadline=None, database=None)
@given(json_values | st.builds(lambda b: {"benchmarks": b}, st.lists(json_values, max_size=3))
       | st.builds(lambda info, extra: {**extra, "benchmarks": [{"fullname": "f.py::t", "extra_info": info}]},
                   mutated_records(), st.dictionaries(st.sampled_from(["datetime", "commit_info", "machine_info"]),
                                                      json_values)))
def test_any_saved_file_is_read_or_named_and_skipped(content):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "0001_x.json"
        path.write_text(json.dumps(content))
        try:
            run = history.read_run(path)
        except ValueError as error:  # the callers name the file with this reason
            assert str(error)
            return
        assert all(p.startswith(str(path)) and "skipped" in p for p in run.problems)
        for scenario in run.scenarios.values():
            use(scenario)
        loaded = history.load(Path(folder))
        assert all(str(path) in p for p in loaded.problems)


@pytest.mark.parametrize("where", ["file", "record", "machine"])
def test_a_file_nested_100000_deep_is_named_and_skipped(where, tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    text = {"file": deep,
            "record": json.dumps({"benchmarks": [{"fullname": "f.py::t", "extra_info": {**REAL[0], "gpu": 1}}]})
            .replace('"gpu": 1', '"gpu": ' + "[" * 40 + "]" * 40),
            "machine": '{"benchmarks": [], "machine_info": {"gpucolloc": {"x": ' + "[" * 40 + "]" * 40 + "}}}"}[where]
    (tmp_path / "0001_deep.json").write_text(text)
    loaded = history.load(tmp_path)
    assert loaded.runs == [] and len(loaded.problems) == 1 and "0001_deep.json" in loaded.problems[0]
    assert "deep" in loaded.problems[0]
