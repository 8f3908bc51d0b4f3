"""``pytest-gpucolloc report``: one self-contained page, opened in a real headless browser (Debian's Chromium)."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_gpucolloc import cli

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
H200_RUN = RESULTS / "2026-12-01-h200-default-run-before-after" / "default-run.json"
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


def test_the_report_is_one_self_contained_page_with_its_figures_beside_it(runs, tmp_path, capsys):
    out = tmp_path / "report"
    assert cli.main(["report", *map(str, runs), "--storage", str(RESULTS / "2026-11-30-h200"), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    pngs, svgs = sorted((out / "figures").glob("*.png")), sorted((out / "figures").glob("*.svg"))
    assert pngs and len(pngs) == len(svgs) == page.count("<img ")
    assert not re.search(r"(src|href)=[\"'](?!data:)", page)  # nothing to fetch: every figure is embedded
    kinds = {"NVIDIA-H200": 0, "CPU-smoke": 0}
    for png in pngs:
        if png.name.startswith(("scaling", "per-job", "efficiency")):
            found = [kind for kind in kinds if kind in png.name]
            assert len(found) == 1, png.name  # a figure draws one machine kind, never CPU smoke beside a GPU
            kinds[found[0]] += 1
    assert kinds["NVIDIA-H200"] and kinds["CPU-smoke"]
    assert any(p.name.startswith("history-") for p in pngs) and any(p.name.startswith("per-job-") for p in pngs)
    assert "mps" in page and "NVIDIA H200, driver 580.159.04" in page


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
                         capture_output=True, text=True, timeout=120).stdout
    body = re.search(r"<body[^>]*>", dom).group(0)
    figures = len(list((out / "figures").glob("*.png")))
    assert f'data-figures="{figures}"' in body and 'data-broken="0"' in body, body
    subprocess.run(flags + ["--window-size=1200,3000", f"--screenshot={tmp_path / 'page.png'}",
                            (out / "index.html").as_uri()], capture_output=True, timeout=120)
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
    note = re.search(r"<p>resnet26-cifar10/bs128 \+ resnet152-imagenet/bs32 under mig: ([^<]*)</p>", page)
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
