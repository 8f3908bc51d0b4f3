"""What a sharing mode says about itself reaches the options, the figures and the fixture from ``modes/`` alone:
``mps-half`` (one module and its registry line) is the example."""
import pytest
from matplotlib.colors import is_color_like

from pytest_gpucolloc import modes
from pytest_gpucolloc.mig.provision import MigError, MigUnavailable
from pytest_gpucolloc.modes import MODES, ModeConfigError, ModeFailed, ModeUnavailable
from pytest_gpucolloc.modes.base import ModeOptions, Target
from pytest_gpucolloc.modes.mps_half import HalfMpsMode
from pytest_gpucolloc.mps_daemon import MpsError
from pytest_gpucolloc.workloads import Workload

SCENARIO = '''
import pytest
from pytest_gpucolloc import Workload

pytestmark = pytest.mark.gpucolloc_quick

def test_pair(collocate):
    collocate([Workload("resnet26", batch_size=4)] * 2)
'''


def test_a_mode_is_selectable_and_skipped_on_the_cpu_with_its_reason(pytester):
    pytester.makepyfile(test_pair=SCENARIO)
    result = pytester.runpytest("--gpu-mode=mps-half", "--colloc-device=cpu", "-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*mps-half: MPS needs an NVIDIA GPU (running in CPU smoke mode)*"])


def test_help_lists_every_registered_mode(pytester):
    help_text = " ".join(pytester.runpytest("--help").stdout.str().split())  # undo the wrapping
    assert "mps-half" in MODES
    assert f"({', '.join(MODES)})" in help_text


def test_every_mode_has_a_colour_of_its_own():
    assert set(modes.MODE_COLOURS) == set(MODES)
    assert all(is_color_like(colour) for colour in modes.MODE_COLOURS.values())
    assert len(set(modes.MODE_COLOURS.values())) == len(MODES)
    # mps-half extends mps but names no colour: it gets one of its own, not mps's
    assert modes.MODE_COLOURS["mps-half"] != modes.MODE_COLOURS["mps"]


def test_modes_beyond_the_palette_still_get_colours(monkeypatch):
    extra = {f"extra-{k}": type(f"Extra{k}", (HalfMpsMode,), {"name": f"extra-{k}"}) for k in range(12)}
    monkeypatch.setattr(modes, "MODES", {**MODES, **extra})
    colours = modes._colours()
    assert set(colours) == set(MODES) | set(extra) and all(is_color_like(c) for c in colours.values())
    assert {name: colours[name] for name in MODES} == modes.MODE_COLOURS  # the registered ones keep theirs


def test_mps_half_limits_each_client_to_half_the_sms_unless_the_job_says_otherwise(tmp_path):
    target = Target("cpu", None, tmp_path, ModeOptions())
    jobs = [Workload("resnet26", batch_size=4), Workload("resnet26", batch_size=4, sm_percent=30)]
    assert HalfMpsMode().limits(jobs, target) == [{"sm_percent": 50}, {"sm_percent": 30}]
    assert HalfMpsMode.same_with_one_job is None  # one client at 50% is not the mps client with the whole GPU


@pytest.mark.parametrize("error, base", [(MigUnavailable, ModeUnavailable), (MigError, ModeFailed),
                                         (MpsError, ModeFailed), (ModeConfigError, ModeFailed)])
def test_each_modes_errors_are_a_skip_or_a_failure_by_their_base(error, base):
    # the fixture catches only the two bases: a mode's error of neither kind would be a crash, not an outcome
    assert issubclass(error, base)
