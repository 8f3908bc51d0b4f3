"""``pytest-gpucolloc report``: a page that answers first (the answer, the summary table) and links its figures,
opened in a real headless browser (Debian's Chromium)."""
import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_gpucolloc import cli
from pytest_gpucolloc.history import read_run

DATA = Path(__file__).resolve().parent / "data"  # cut from real runs: data/README.md
H200_RUN = DATA / "default-run.json"
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def runs(tmp_path):
    """An H200 run as measured, and the same run made into a CPU smoke run (which must never share a figure)."""
    data = json.loads(H200_RUN.read_text())
    data["machine_info"]["gpucolloc"]["device"] = "cpu"
    for bench in data["benchmarks"]:
        bench["extra_info"]["device"] = "cpu"
        bench["extra_info"]["gpu"] = None
    cpu = tmp_path / "cpu-smoke.json"
    cpu.write_text(json.dumps(data))
    return [H200_RUN, cpu]


def _answer(page: str) -> list[str]:
    return re.findall(r"<p class=answer>(.*?)</p>", page)


def test_the_page_answers_first_and_links_each_figure_once(runs, tmp_path):
    out = tmp_path / "report"
    assert cli.main(["report", *map(str, runs), "--storage", str(DATA / "aa-history"), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert len(page) < 100_000  # figures are linked, not embedded
    linked = re.findall(r"<img [^>]*src='([^']+)'", page)
    assert linked and sorted(linked) == sorted(f"figures/{p.name}" for p in (out / "figures").iterdir())
    assert "data:" not in page and not list((out / "figures").glob("*.svg"))  # each figure once
    # The answer comes first, per machine kind, computed from the runs: the H200 run's largest speedup under mps.
    best = max(s.speedup for s in read_run(H200_RUN).scenarios.values())
    h200 = next(a for a in _answer(page) if a.startswith("<b>NVIDIA H200, driver 580.159.04:</b>"))
    assert "Only mps was measured, so nothing to compare it with" in h200 and f"{best:.1f}x" in h200, h200
    assert page.index("class=answer") < page.index("<table class=summary") < page.index("<img ")
    summary = page[page.index("<table class=summary"):]
    assert "<th>mps</th>" in summary and f"{best:.2f}x" in summary and "mixes of different jobs" in summary
    kinds = {"NVIDIA-H200": 0, "CPU-smoke": 0}
    for png in (out / "figures").glob("*.png"):
        if png.name.startswith(("scaling", "per-job", "efficiency", "mixes")):
            found = [kind for kind in kinds if kind in png.name]
            assert len(found) == 1, png.name  # a figure draws one machine kind, never CPU smoke beside a GPU
            kinds[found[0]] += 1
    assert kinds["NVIDIA-H200"] and kinds["CPU-smoke"]
    assert any(p.startswith("figures/history-") for p in linked)
    assert any(p.startswith("figures/per-job-") for p in linked)


def test_a_regression_is_marked_and_runs_without_mixes_have_no_mixed_section(tmp_path):
    data = json.loads(H200_RUN.read_text())
    data["benchmarks"] = [b for b in data["benchmarks"] if not b["name"].startswith("test_mixed")]
    data["benchmarks"][0]["extra_info"]["gate"] = {"verdict": "regressed", "change": -0.05, "baseline": 12000.0,
                                                   "threshold": 0.02}
    run = tmp_path / "regressed.json"
    run.write_text(json.dumps(data))
    out = tmp_path / "report"
    assert cli.main(["report", str(run), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert "<p class=alert>The gate judged 1 regressed" in page and "<span class=regressed>1 regressed</span>" in page
    assert "Mixed jobs" not in page and "mixes of different jobs" not in page
    assert "Only mps was measured, so nothing to compare it with" in _answer(page)[0]
    assert "class=best" not in page and "only mps measured" in page  # green is for the best of several modes


def test_a_run_where_sharing_does_not_pay_says_so(tmp_path):
    data = json.loads(H200_RUN.read_text())
    for bench in data["benchmarks"]:  # together hardly faster than one after another
        bench["extra_info"]["speedup_vs_sequential"] = 1.02
    run = tmp_path / "no-gain.json"
    run.write_text(json.dumps(data))
    out = tmp_path / "report"
    assert cli.main(["report", str(run), "--out", str(out)]) == 0
    assert _answer((out / "index.html").read_text())[0].startswith("Sharing does not pay here")


def test_plot_draws_the_reports_figures(runs, tmp_path, capsys):
    """``plot`` and ``report`` draw the same figures: the newest run of a storage and its history."""
    storage = tmp_path / "storage" / "Linux-CPython-3.12-64bit"
    storage.mkdir(parents=True)
    (storage / "0001_run.json").write_text(H200_RUN.read_text())
    assert cli.main(["plot", "--storage", str(storage.parent), "--out", str(tmp_path / "plots")]) == 0
    assert cli.main(["report", "--storage", str(storage.parent), str(H200_RUN), "--out", str(tmp_path / "r")]) == 0
    drawn = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert drawn and drawn == sorted(p.name for p in (tmp_path / "r" / "figures").iterdir())


def test_bad_input_is_one_line(tmp_path, capsys):
    (tmp_path / "x.json").write_text("not json")
    assert cli.main(["report", str(tmp_path / "x.json"), "--out", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.startswith("error: cannot read")
    assert cli.main(["report", "--storage", str(tmp_path / "none"), "--out", str(tmp_path / "r")]) == 3


@pytest.mark.skipif(BROWSER is None, reason="needs Debian's chromium (apt-get install chromium) to open the page")
def test_a_browser_draws_every_figure(runs, tmp_path):
    out = tmp_path / "report"
    assert cli.main(["report", *map(str, runs), "--out", str(out)]) == 0
    flags = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(flags + ["--virtual-time-budget=5000", "--dump-dom", (out / "index.html").as_uri()],
                         capture_output=True, text=True, timeout=120, check=False).stdout
    body = re.search(r"<body[^>]*>", dom).group(0)
    figures = len(list((out / "figures").glob("*.png")))
    assert f'data-figures="{figures}"' in body and 'data-broken="0"' in body, body
    # What a reader sees first: the answer, then the summary table with a row per workload and mix.
    assert dom.index('class="answer"') < dom.index('class="summary"') < dom.index("<img")
    summary = dom[dom.index('class="summary"'):dom.index("</table>")]
    assert summary.count("<tr>") == 1 + 3 + 1  # header, two workloads and a mix, the mixes' heading
    subprocess.run(flags + ["--window-size=1200,3000", f"--screenshot={tmp_path / 'page.png'}",
                            (out / "index.html").as_uri()], capture_output=True, timeout=120, check=False)
    assert (tmp_path / "page.png").stat().st_size > 50_000  # a page with figures on it, not a blank one


def test_a_mix_whose_mig_layout_cannot_exist_is_shown_as_such_with_the_planners_reason(tmp_path):
    data = json.loads(H200_RUN.read_text())
    mixed = next(b for b in data["benchmarks"] if b["name"].startswith("test_mixed"))
    for worker, size in zip(mixed["extra_info"]["workers"], ["4g", "4g"]):  # ResNet152 and its partner at 4g each
        worker["params"]["mig"] = size
    run = tmp_path / "mig-sizes.json"
    run.write_text(json.dumps(data))
    out = tmp_path / "report"
    assert cli.main(["report", str(run), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert (out / "figures" / "mixes-NVIDIA-H200-driver-580.159.04.png").exists()
    note = re.search(r"<p>resnet152-imagenet/bs32 \+ resnet26-cifar10/bs128 under mig: ([^<]*)</p>", page)
    assert note and note.group(1).startswith("does not fit on NVIDIA H200"), note
    assert "A layout that fits" in note.group(1)


def test_a_mix_whose_mig_layout_fits_has_no_such_cell(tmp_path):
    data = json.loads(H200_RUN.read_text())
    mixed = next(b for b in data["benchmarks"] if b["name"].startswith("test_mixed"))
    for worker, size in zip(mixed["extra_info"]["workers"], ["1g", "4g"]):  # the paper's sizes: they fit
        worker["params"]["mig"] = size
    run = tmp_path / "mig-sizes.json"
    run.write_text(json.dumps(data))
    out = tmp_path / "report"
    assert cli.main(["report", str(run), "--out", str(out)]) == 0
    assert "under mig:" not in (out / "index.html").read_text()


def test_a_scenarios_run_warnings_are_marked_in_the_summary_and_listed(tmp_path):
    data = json.loads(H200_RUN.read_text())
    warned = next(b for b in data["benchmarks"] if b["name"].startswith("test_mixed"))
    sentences = ["unstable rounds: aggregate throughput varied 14% (CV) from round to round, above 10%; something "
                 "else was using the machine, or the rounds are too short: see `pytest-gpucolloc check`, or raise "
                 "--colloc-round-seconds",
                 "more workers than CPU cores: 2 workers on 1 cores; they wait for a core, so the numbers measure "
                 "the CPU rather than the sharing mode (fewer jobs, or a machine with more cores)"]
    warned["extra_info"]["warnings"] = sentences
    run = tmp_path / "warned.json"
    run.write_text(json.dumps(data))
    out = tmp_path / "report"
    assert cli.main(["report", str(run), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    # The summary marks the mix's row (and only it), and links to the list, which comes before the figures.
    summary = page[page.index("<table class=summary"):]
    summary = summary[:summary.index("</table>")]
    marked = [row for row in summary.split("<tr>") if "class=warned" in row]
    assert len(marked) == 1 and marked[0].startswith("<td>resnet152-imagenet/bs32 + resnet26-cifar10/bs128 <a"), marked
    assert "href='#warnings'" in marked[0]
    section = page[page.index("<h2 id=warnings>Warnings</h2>"):]
    assert page.index("<table class=summary") < page.index("id=warnings") < page.index("<img ")
    section = section[:section.index("</table>")]
    for sentence in sentences:  # each sentence on its own row, with the scenario and the run it is from
        assert (f"<tr><td>{warned['name']}</td><td>warned</td><td>{html.escape(sentence)}</td></tr>"
                in section), sentence
    # The same run without warnings: no section, no mark.
    del warned["extra_info"]["warnings"]
    run.write_text(json.dumps(data))
    assert cli.main(["report", str(run), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert "Warnings" not in page and "class=warned" not in page


def test_the_answer_of_cpu_smoke_runs_of_one_mode_says_what_they_are():
    """Naive measured alone on the CPU: no "Use naive: it shares best" as if it had beaten anything."""
    from collections import Counter

    from pytest_gpucolloc import report

    rows = [report.SummaryRow("resnet26-cifar10/bs4", False, {"naive": report.Cell(2, 1.6, 100.0, 1)}, Counter()),
            report.SummaryRow("tiny/bs4", False, {"naive": report.Cell(2, 1.4, 50.0, 1)}, Counter())]
    said = report.answer(rows, cpu=True)
    assert said == ("CPU smoke mode (small jobs on the CPU: it checks the suite, not what a GPU does): Only naive "
                    "was measured, so nothing to compare it with (measure other modes with --gpu-mode): 2 "
                    "resnet26-cifar10/bs4 jobs made 1.6x the throughput of one alone."), said
