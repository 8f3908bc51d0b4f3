"""What a user reads of serving jobs: the terminal's serving table (a real CPU run through pytester), the report's
trade-off figure and Serving section, and ``advise --p99-within`` (a real CPU run of benchmarks/test_serving.py,
saved: data/README.md)."""
import json
from pathlib import Path

import pytest

from pytest_gpucolloc import cli, latency_plot, report
from pytest_gpucolloc.history import read_run, short_name
from test_serving import ARGS, SCENARIOS, SERVE_SOURCE
from tiny_workload import SOURCE as TINY_SOURCE

DATA = Path(__file__).resolve().parent / "data"
SERVING_RUN = DATA / "serving-cpu-run.json"


_ms = report.ms  # a latency as the tables show it

def test_the_summary_has_a_serving_table_with_the_saved_numbers_and_says_why_a_service_saturated(pytester):
    pytester.makepyfile(tiny_workload=TINY_SOURCE, serve_workload=SERVE_SOURCE, test_scenarios=SCENARIOS)
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(*ARGS, f"--benchmark-json={out}")
    result.assert_outcomes(passed=3)
    saved = {b["name"]: b["extra_info"]["serving"] for b in json.loads(out.read_text())["benchmarks"]}
    lines = result.stdout.lines
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["scenario", "mode", "offered"])
    assert "p99.9 ms" in lines[header] and "training kept" in lines[header]
    rows = {line.split()[0]: line.split() for line in lines[header + 2:header + 5]}
    beside = saved["test_service[cpu-naive-1]"]
    assert rows["test_service[cpu-naive-1]"] == [
        "test_service[cpu-naive-1]", "naive", report.rate(beside["offered_rps"]), report.rate(beside["achieved_rps"]),
        _ms(beside["p50_ms"]), _ms(beside["p99_ms"]), _ms(beside["p999_ms"]), _ms(beside["max_ms"]),
        f"{beside['p99_vs_alone']:.2f}x", "1", "-", f"{100 * beside['training_kept']:.1f}%"]
    assert rows["test_service[cpu-naive-0]"][9] == "0"  # the service alone: no training beside it
    # A saturated service: no percentiles (they measure the queue), and why under the table.
    assert rows["test_flooded[cpu-naive]"][4:9] == ["saturated"] * 4 + ["-"]
    why = next(i for i, line in enumerate(lines) if line.startswith("saturated: "))
    assert why > header and lines[why].startswith(
        "saturated: test_flooded[cpu-naive]: 100,000 requests/s is more than it serves: the queue grew to")


def test_the_serving_table_fits_a_terminal_and_says_where_every_column_is():
    entries = [(short_name(name), scenario) for name, scenario in read_run(SERVING_RUN).scenarios.items()]
    wide = report.serving_table(entries)
    assert max(map(len, wide.splitlines())) > 120  # every column: wider than a CI log
    lines = report.serving_table(entries, width=120, ask="the report: pytest-gpucolloc report 0003").splitlines()
    said = next(i for i, line in enumerate(lines) if line.startswith("left out to fit 120 characters: "))
    assert max(map(len, lines[:said])) <= 120, "\n".join(lines)
    assert set(lines[said].split(": ", 1)[1].split(", ")) <= set(report.SERVING_DROP_ORDER)  # the least important
    assert lines[said + 1] == "show them with the report: pytest-gpucolloc report 0003"
    assert lines[0].split("  ")[0] == "scenario" and "p50 ms" in lines[0] and "training kept" in lines[0]


def _runs(path):
    return {b["name"]: b["extra_info"] for b in json.loads(path.read_text())["benchmarks"]}


def _with_sms_reserved(tmp_path, p99_ms, kept):
    """The saved CPU run and, beside its service with one training job under naive, the same service under
    mps-partitioned with 30% of the SMs reserved for it (the training job given the other 70%): what benchmarks/
    test_serving.py::test_service_with_sms_reserved measures on a GPU (MPS needs one)."""
    data = json.loads(SERVING_RUN.read_text())
    naive = next(b for b in data["benchmarks"] if b["name"].endswith("rate50-1train]"))
    reserved = json.loads(json.dumps(naive))
    reserved["name"] = "test_service_with_sms_reserved[cpu-mps-partitioned-rate50-1train-reserve30]"
    reserved["fullname"] = "benchmarks/test_serving.py::" + reserved["name"]
    info = reserved["extra_info"]
    info["mode"] = "mps-partitioned"
    info["workers"][0]["mode_facts"], info["workers"][1]["mode_facts"] = {"sm_percent": 30}, {"sm_percent": 70}
    facts = info["serving"]
    facts.update(p99_ms=p99_ms, p99_vs_alone=p99_ms / facts["alone_p99_ms"], training_kept=kept)
    data["benchmarks"].append(reserved)
    path = tmp_path / "serving-reserved.json"
    path.write_text(json.dumps(data))
    return path


def test_the_report_draws_p99_against_what_training_keeps_and_lists_the_services(tmp_path):
    out = tmp_path / "report"
    assert cli.main(["report", str(SERVING_RUN), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    figure = "figures/serving-CPU-smoke-mode-batches-capped-small-inputs.png"
    assert f"src='{figure}'" in page and (out / figure).stat().st_size > 10_000
    assert "<h2>Serving: p99 against what training keeps</h2>" in page
    # The Serving section: one row per scenario with a service, its percentiles as saved, before the figures.
    section = page[page.index("<h2 id=serving>Serving</h2>"):]
    assert page.index("id=serving") < page.index("<img ")
    table = section[:section.index("</table>")]
    saved = _runs(SERVING_RUN)
    assert table.count("<tr><td>") == len(saved) == 6
    one = saved["test_service_beside_training[cpu-naive-resnet50-rate50-1train]"]["serving"]
    row = next(r for r in table.split("<tr>") if "rate50-1train" in r)
    assert (f"<td>{_ms(one['p50_ms'])}</td><td>{_ms(one['p99_ms'])}</td><td>{_ms(one['p999_ms'])}</td>"
            f"<td>{_ms(one['max_ms'])}</td><td>{one['p99_vs_alone']:.2f}x</td><td>1</td>" in row), row
    # Saturated on two cores: said instead of percentiles, and why under the table.
    flooded = next(r for r in table.split("<tr>") if "rate80-3train" in r)
    assert flooded.count("<td>saturated</td>") == 4
    why = saved["test_service_beside_training[cpu-naive-resnet50-rate80-3train]"]["serving"]["why"]
    assert f"<p>test_service_beside_training[cpu-naive-resnet50-rate80-3train]: {why}</p>" in section


def test_the_trade_off_figure_has_a_log_p99_axis_the_service_alone_and_a_labelled_point_per_scenario(tmp_path):
    run = read_run(_with_sms_reserved(tmp_path, p99_ms=85.0, kept=0.6))
    figures = latency_plot.serving("CPU", list(run.scenarios.items()))
    assert len(figures) == 1
    panels = {axes.get_title(): axes for axes in figures[0].figure.axes if axes.get_visible()}
    assert sorted(panels) == ["resnet50-imagenet224/bs4/bf16/serve-50%", "resnet50-imagenet224/bs4/bf16/serve-80%"]
    axes = panels["resnet50-imagenet224/bs4/bf16/serve-50%"]
    assert axes.get_yscale() == "log"
    alone = _runs(SERVING_RUN)["test_service_beside_training[cpu-naive-resnet50-rate50-1train]"]["serving"]
    assert [line.get_ydata()[0] for line in axes.get_lines()] == [alone["alone_p99_ms"]]
    assert sorted(text.get_text() for text in axes.texts) == ["1 train", "1 train, 30% SMs", "3 train"]
    points = sorted(tuple(map(float, c.get_offsets()[0])) for c in axes.collections)  # x: kept, y: p99 ms
    assert points[1:] == [(0.6, 85.0), (alone["training_kept"], alone["p99_ms"])]


def test_a_report_without_services_has_no_serving_section_or_figure(tmp_path):
    out = tmp_path / "report"
    assert cli.main(["report", str(DATA / "default-run.json"), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert "Serving" not in page and not list((out / "figures").glob("serving-*"))


@pytest.mark.parametrize("budget, picked", [
    ("120", "test_service_beside_training[cpu-naive-resnet50-rate50-1train]"),  # both within: training keeps 93%
    ("90", "test_service_with_sms_reserved[cpu-mps-partitioned-rate50-1train-reserve30]"),  # only it is within
    ("1.2x", "test_service_with_sms_reserved[cpu-mps-partitioned-rate50-1train-reserve30]"),  # 1.06x; naive 1.25x
])
def test_advise_picks_the_way_within_the_p99_budget_where_training_keeps_the_most(tmp_path, capsys, budget, picked):
    run = _with_sms_reserved(tmp_path, p99_ms=85.0, kept=0.6)
    code = cli.main(["advise", str(run), "--p99-within", budget, "--format", "json"])
    advice = json.loads(capsys.readouterr().out)
    answer = next(a for a in advice["answers"] if a["service"].endswith("serve-50%") and a["training_jobs"] == 1)
    assert answer["within"] and answer["option"]["scenario"] == picked
    # The 80% service has no way within these budgets beside one training job but at 1.2x (157 ms, 1.15x alone).
    assert code == (0 if budget == "1.2x" else 1) and advice["met"] is (budget == "1.2x")
    assert cli.main(["advise", str(run), "--p99-within", budget]) == code
    out = capsys.readouterr().out
    way = "naive" if "naive" in picked else "mps-partitioned, 30% of SMs reserved for the service"
    assert out.splitlines()[1].startswith(f"  1 training job: {way} ({picked}) keeps p99 at "), out


def test_advise_says_when_no_way_keeps_the_budget_with_the_smallest_p99_seen(capsys):
    assert cli.main(["advise", str(SERVING_RUN), "--p99-within", "10ms"]) == 1
    out = capsys.readouterr().out
    smallest = _runs(SERVING_RUN)["test_service_beside_training[cpu-naive-resnet50-rate50-1train]"]["serving"]
    assert out.startswith(
        "No measured way keeps resnet50-imagenet224/bs4/bf16/serve-50%'s p99 within 10 ms beside training; the "
        f"smallest p99 seen: {smallest['p99_ms']:,.1f} ms ({smallest['p99_vs_alone']:.2f}x alone) under naive "
        "(test_service_beside_training[cpu-naive-resnet50-rate50-1train], 1 training job)"), out
    # Three training jobs saturated the service on two cores: never within a budget, and said so.
    assert "saturated" in next(line for line in out.splitlines() if line.startswith("resnet50-imagenet224/bs4/bf16/"
                                                                                      "serve-50%  3"))


@pytest.mark.parametrize("args, code, message", [
    (["--p99-within", "soon"], 2, "--p99-within: 'soon' is not a budget"),
    (["--p99-within", "0"], 2, "is not a budget"),
    (["--p99-within", "25", "--jobs", "resnet26*2"], 2, "not allowed with argument"),
])
def test_advise_refuses_a_budget_that_is_not_one(capsys, args, code, message):
    assert cli.main(["advise", str(SERVING_RUN), *args]) == code
    assert message in capsys.readouterr().err


def test_advise_on_runs_without_services_says_what_is_missing_and_how_to_measure_it(capsys, tmp_path, monkeypatch):
    """Exit 3, nothing to read: a service's p99 to bound, not the storage, is what is missing (with no run saved it
    had said "no storage folder .benchmarks: check --storage")."""
    assert cli.main(["advise", str(DATA / "default-run.json"), "--p99-within", "25"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("error: none of the runs read (default-run) has a serving job (Workload(..., rate=...)) "
                          "beside training jobs, so there is no p99 to bound: measure one first, e.g. `pytest "
                          "benchmarks/test_serving.py --colloc-full"), err
    monkeypatch.chdir(tmp_path)  # a newcomer's first question: nothing saved yet
    (tmp_path / "empty").mkdir()
    for storage in ([], ["--storage", "empty"]):
        assert cli.main(["advise", "--p99-within", "2x", *storage]) == 3
        err = capsys.readouterr().err
        assert err.startswith(f"error: no saved run to read under {storage[-1] if storage else '.benchmarks'}, so no "
                              "serving job beside training jobs and no p99 to bound: measure one first"), err
        assert "check --storage" not in err
    assert cli.main(["advise", "0001", "--p99-within", "2x"]) == 3  # a run named: where it was looked for is the news
    assert "no storage folder .benchmarks: check --storage" in capsys.readouterr().err
