"""GPU tier, read-only MIG: what the plugin reads off the real GPU. Never calls a MIG setter."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from pytest_gpucolloc import nvml
from pytest_gpucolloc.mig import planner
from pytest_gpucolloc.mig.profiles import live_table, named_table

pytestmark = pytest.mark.gpucolloc_gpu


@pytest.fixture(scope="module")
def gpu():
    assert nvml.init() is None
    return nvml.gpus()[0]


def test_live_profile_table_matches_nvidia_smi(gpu):
    if gpu.mig_mode is None:
        pytest.skip(f"{gpu.name} does not support MIG")
    table = live_table(gpu.uuid, gpu.name)
    listing = subprocess.run(["nvidia-smi", "mig", "-i", str(gpu.index), "-lgipp"], capture_output=True, text=True)
    for profile in table.profiles:
        line = next(text for text in listing.stdout.splitlines() if f"Profile ID {profile.profile_id:>2} " in text
                    or f"Profile ID {profile.profile_id} " in text)
        assert "{" + ",".join(map(str, profile.starts)) + "}:" + str(profile.size) in line
    path = os.environ.get("GPUCOLLOC_EVIDENCE")
    if path:
        known = json.loads(Path(path).read_text()) if Path(path).exists() else {}
        known["mig_live_table"] = table.to_dict()
        known["nvidia_smi_lgipp"] = listing.stdout.splitlines()
        known["nvidia_smi_lgip"] = subprocess.run(["nvidia-smi", "mig", "-i", str(gpu.index), "-lgip"],
                                                  capture_output=True, text=True).stdout.splitlines()
        Path(path).write_text(json.dumps(known, indent=2))
    if gpu.name == "NVIDIA H200":
        def facts(t):  # NVML lists profiles by index; the captured table by size
            return sorted((p.profile_id, p.slice_count, p.instance_count, p.multiprocessor_count, p.starts, p.size)
                          for p in t.profiles)

        assert facts(table) == facts(named_table("h200"))


def test_paper_layouts_plan_on_the_live_gpu(gpu):
    if gpu.mig_mode is None:
        pytest.skip(f"{gpu.name} does not support MIG")
    table = live_table(gpu.uuid, gpu.name)
    for n in (1, 2, 3, 7):
        assert planner.plan(table, planner.default_layout(n)).feasible
    assert not planner.plan(table, ["4g", "2g", "2g"]).feasible


def test_mig_mode_off_skips_with_how_to_enable_it(pytester, gpu):
    if gpu.mig_mode != 0:
        pytest.skip("MIG mode is not off on this GPU")
    pytester.makepyfile('''
from pytest_gpucolloc import Workload
def test_mig(collocate):
    collocate([Workload("resnet26", batch_size=32)] * 2)
''')
    result = pytester.runpytest_subprocess("--gpu-mode=mig", "-rs", "--mig-reconfigure")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*mig: MIG mode is disabled on GPU 0; pytest-gpucolloc never changes it*nvidia-smi -i 0 -mig 1*"])
    mode = nvml.gpus()[0].mig_mode
    assert mode == 0  # unchanged
