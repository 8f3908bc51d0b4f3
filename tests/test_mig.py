"""MIG: planning against every captured/documented table, and provisioning against the simulator."""
import itertools
import json
from pathlib import Path

import pytest

from doubles.mig_simulator import SimulatedMig
from pytest_gpucolloc import Workload
from pytest_gpucolloc.mig import planner
from pytest_gpucolloc.mig.profiles import NAMED_TABLES, named_table, table_from_dict
from pytest_gpucolloc.mig.provision import MigError, MigProvisioner, MigUnavailable
from pytest_gpucolloc.mig.state import Checkpoint, MigBackendError
from pytest_gpucolloc.modes.base import ModeOptions, Target
from pytest_gpucolloc.modes.mig import MigMode
from pytest_gpucolloc.nvml import GpuInfo
from pytest_gpucolloc.scenario import ScenarioFailed, Settings, run_scenario

TABLES = sorted(NAMED_TABLES)
REFERENCE = Path(__file__).resolve().parents[1] / "pytest_gpucolloc" / "mig" / "tables" / "h200.json"


def brute_force_fits(table, profiles) -> bool:
    """Independent oracle: try every combination of allowed starts."""
    if sum(p.slice_count for p in profiles) > table.compute_slices:
        return False
    for profile in set(profiles):
        if profiles.count(profile) > profile.instance_count:
            return False
    for starts in itertools.product(*(p.starts for p in profiles)):
        spans = [set(range(s, s + p.size)) for s, p in zip(starts, profiles)]
        if sum(map(len, spans)) == len(set().union(*spans)) and max(max(s) for s in spans) < table.memory_slices:
            return True
    return False


@pytest.mark.parametrize("name", TABLES)
def test_paper_homogeneous_layouts_fit_every_table(name):
    table = named_table(name)
    for n in (1, 2, 3, 7):
        result = planner.plan(table, planner.default_layout(n))
        assert result.feasible, (n, result.explain())
        slices = [set(p.slices) for p in result.placements]
        assert len(set().union(*slices)) == sum(map(len, slices))  # memory slices never overlap


@pytest.mark.parametrize("name", TABLES)
def test_planner_agrees_with_brute_force_on_every_mix_of_the_papers_profiles(name):
    table = named_table(name)
    base = [table.resolve(s) for s in ("1g", "2g", "4g")]  # R26 -> 1g, R50 -> 2g, R152 -> 4g
    checked = 0
    for size in range(2, 8):
        for mix in itertools.combinations_with_replacement(base, size):
            result = planner.plan(table, [p.name for p in mix])
            assert result.feasible == brute_force_fits(table, list(mix)), [p.name for p in mix]
            if not result.feasible:
                assert result.reasons and "does not fit on" in result.explain()
                if result.alternative:
                    assert planner.plan(table, result.alternative).feasible
            checked += 1
    assert checked > 14


def test_the_papers_infeasible_mix_is_explained_with_an_alternative():
    result = planner.plan(named_table("h200"), planner.parse_layout("4g,2g,2g"))
    assert not result.feasible
    assert result.explain() == ("does not fit on NVIDIA H200: 4g+2g+2g needs 8 compute slices of 7. "
                                "A layout that fits: 3g.71gb,2g.35gb,2g.35gb")


@pytest.mark.parametrize("layout,reason", [
    ("3g,3g,3g", "3 x 3g.71gb but the GPU allows 2"),
    ("3g,3g,1g", "they occupy 9 memory slices of 8"),
    ("5g", "profile '5g' is unknown on this GPU"),
    ("1g.18gb+me*2", "2 x 1g.18gb+me but the GPU allows 1"),
])
def test_infeasible_layouts_say_why_in_plain_words(layout, reason):
    result = planner.plan(named_table("h200"), planner.parse_layout(layout))
    assert not result.feasible and reason in result.explain()


def test_placement_conflicts_are_explained():
    data = named_table("h200").to_dict()
    data["profiles"] = [p for p in data["profiles"] if p["name"] in ("2g.35gb", "3g.71gb")]
    data["profiles"][0]["placements"]["starts"] = [0, 2]  # a table where 2g can only sit low
    result = planner.plan(table_from_dict(data), ["3g", "3g"][:1] + ["2g", "2g"])
    assert result.feasible
    data["profiles"][1]["placements"]["starts"] = [0]
    result = planner.plan(table_from_dict(data), ["3g", "2g"])
    assert not result.feasible and "no placement keeps their memory slices apart" in result.explain()


def test_short_names_resolve_to_each_gpus_plain_profile():
    assert named_table("h200").resolve("1g").name == "1g.18gb"
    assert named_table("a100-40gb").resolve("3g").name == "3g.20gb"
    assert named_table("h100-80gb").resolve("7g").multiprocessor_count == 132
    assert named_table("h200").resolve("1g+me").name == "1g.18gb+me"


@pytest.mark.parametrize("text", ["", "3g,,1g", "3x", "1g*0", "1g*9", "1g*4,2g*4", "3g;rm -rf /", "../1g", "１g"])
def test_malformed_layouts(text):
    with pytest.raises(planner.LayoutError):
        planner.parse_layout(text)


def test_h200_table_matches_the_captured_reference():
    reference = json.loads(Path("/work/shared/reference/h200-mig-profiles.json").read_text()) \
        if Path("/work/shared/reference/h200-mig-profiles.json").exists() else None
    table = named_table("h200")
    assert [p.profile_id for p in table.profiles] == [19, 20, 15, 14, 9, 5, 0]
    if reference:
        assert [p["profile_id"] for p in reference["gpu_instance_profiles"]] == [19, 20, 15, 14, 9, 5, 0]


def test_nvml_profile_names_are_cleaned():
    data = named_table("h200").to_dict()
    data["profiles"][0]["name"] = "MIG 1g.18gb"
    data["profiles"][1]["name"] = None
    table = table_from_dict(data)
    assert table.profiles[0].name == "1g.18gb" and table.profiles[1].name == "1g.16gb"


# --- simulator rules -------------------------------------------------------------------------------

@pytest.fixture
def sim():
    return SimulatedMig(named_table("h200"))


def test_simulator_enforces_placements_overlap_and_budgets(sim):
    one_g, three_g, four_g = (named_table("h200").resolve(x) for x in ("1g", "3g", "4g"))
    with pytest.raises(MigBackendError, match="cannot start at memory slice 2"):
        sim.create_gpu_instance(three_g.profile_id, 2)
    sim.create_gpu_instance(four_g.profile_id, 0)
    with pytest.raises(MigBackendError) as error:
        sim.create_gpu_instance(one_g.profile_id, 3)
    assert error.value.code == "insufficient_resources"
    sim.create_gpu_instance(three_g.profile_id, 4)
    with pytest.raises(MigBackendError, match="compute slices|in use"):
        sim.create_gpu_instance(one_g.profile_id, 6)
    with pytest.raises(MigBackendError, match="unknown GPU-instance profile id 4"):
        sim.create_gpu_instance(4, 0)  # an NVML *index* is not a profile id


def test_simulator_destroys_compute_instances_first_and_refuses_while_in_use(sim):
    gi = sim.create_gpu_instance(19, 0)
    ci = sim.create_compute_instance(gi)
    with pytest.raises(MigBackendError) as error:
        sim.destroy_gpu_instance(gi)
    assert error.value.code == "in_use"
    sim.attach_process(4242, gi)
    with pytest.raises(MigBackendError, match="processes still use"):
        sim.destroy_compute_instance(gi, ci)
    sim.detach_process(4242)
    sim.destroy_compute_instance(gi, ci)
    sim.destroy_gpu_instance(gi)
    assert sim.gpu_instances() == []


def test_simulator_permissions_and_mig_mode():
    table = named_table("h200")
    with pytest.raises(MigBackendError) as error:
        SimulatedMig(table, privileged=False).create_gpu_instance(19, 0)
    assert error.value.code == "no_permission"
    with pytest.raises(MigBackendError) as error:
        SimulatedMig(table, mig_enabled=False).create_gpu_instance(19, 0)
    assert error.value.code == "not_supported"


# --- provisioning ----------------------------------------------------------------------------------

def existing_layout(sim):
    """What an admin left on the GPU: 3g at 4 and two 1g at 0 and 1."""
    for profile_id, start in ((9, 4), (19, 0), (19, 1)):
        sim.create_compute_instance(sim.create_gpu_instance(profile_id, start))
    return sim.layout()


def provisioner(sim, tmp_path, allow=True):
    return MigProvisioner(sim, sim.table, "GPU-sim", 0, allow_reconfigure=allow, checkpoint_dir=tmp_path)


def test_round_trip_creates_the_plan_and_restores_the_checkpoint(sim, tmp_path):
    before = existing_layout(sim)
    plan = planner.plan(sim.table, planner.parse_layout("2g,2g,2g"))
    with provisioner(sim, tmp_path).provision(plan) as instances:
        assert sim.layout() == [("2g.35gb", 0), ("2g.35gb", 2), ("2g.35gb", 4)]
        assert [i.profile for i in instances] == ["2g.35gb"] * 3
        assert len({i.uuid for i in instances}) == 3 and all(i.uuid.startswith("MIG-") for i in instances)
        assert (tmp_path / "mig-checkpoint-GPU-sim.json").exists()
    assert sim.layout() == before
    assert not (tmp_path / "mig-checkpoint-GPU-sim.json").exists()


@pytest.mark.parametrize("failure", [RuntimeError("worker exploded"), KeyboardInterrupt("Ctrl-C"),
                                     TimeoutError("scenario timed out")], ids=["error", "ctrl-c", "timeout"])
def test_failure_inside_the_test_still_restores(sim, tmp_path, failure):
    before = existing_layout(sim)
    plan = planner.plan(sim.table, planner.default_layout(7))
    with pytest.raises(type(failure)):
        with provisioner(sim, tmp_path).provision(plan):
            raise failure
    assert sim.layout() == before
    assert not (tmp_path / "mig-checkpoint-GPU-sim.json").exists()


def test_crash_mid_provisioning_is_followed_by_restore(sim, tmp_path):
    before = existing_layout(sim)
    sim.fail_after["create_gpu_instance"] = 2  # the second planned instance fails
    plan = planner.plan(sim.table, planner.parse_layout("3g,3g"))
    with pytest.raises(MigError, match="creating the MIG layout failed: injected failure"):
        with provisioner(sim, tmp_path).provision(plan):
            pass
    assert sim.layout() == before


def test_a_killed_run_leaves_a_checkpoint_the_next_run_restores(sim, tmp_path):
    before = existing_layout(sim)
    Checkpoint("GPU-sim", sim.gpu_instances()).save(tmp_path / "mig-checkpoint-GPU-sim.json")
    for gi in sim.gpu_instances():  # the killed run had torn the layout down and built its own
        for ci in gi.compute_instances:
            sim.destroy_compute_instance(gi.gi_id, ci.ci_id)
        sim.destroy_gpu_instance(gi.gi_id)
    sim.create_compute_instance(sim.create_gpu_instance(0, 0))
    assert provisioner(sim, tmp_path).recover() is True
    assert sim.layout() == before


def test_without_opt_in_a_matching_layout_is_used_and_nothing_changes(sim, tmp_path):
    for start in (0, 4):
        sim.create_compute_instance(sim.create_gpu_instance(9, start))
    sim.calls.clear()
    with provisioner(sim, tmp_path, allow=False).provision(planner.plan(sim.table, ["3g", "3g"])) as instances:
        assert len(instances) == 2
    assert not [c for c in sim.calls if c.startswith(("create", "destroy"))]


def test_without_opt_in_a_different_layout_is_a_skip_reason(sim, tmp_path):
    existing_layout(sim)
    with pytest.raises(MigUnavailable, match="pass --mig-reconfigure"):
        with provisioner(sim, tmp_path, allow=False).provision(planner.plan(sim.table, ["7g"])):
            pass


def test_foreign_processes_block_reconfiguration(sim, tmp_path):
    sim.attach_process(999)
    with pytest.raises(MigUnavailable, match=r"processes \[999\] use it"):
        with provisioner(sim, tmp_path).provision(planner.plan(sim.table, ["7g"])):
            pass


def test_mig_mode_disabled_says_how_an_admin_enables_it(tmp_path):
    sim = SimulatedMig(named_table("h200"), mig_enabled=False)
    with pytest.raises(MigUnavailable, match=r"nvidia-smi -i 0 -mig 1"):
        with provisioner(sim, tmp_path).provision(planner.plan(sim.table, ["7g"])):
            pass
    assert not [c for c in sim.calls if c.startswith(("create", "destroy"))]


def test_no_permission_is_explained(tmp_path):
    sim = SimulatedMig(named_table("h200"), privileged=False)
    with pytest.raises(MigError, match="needs root or the mig/config capability"):
        with provisioner(sim, tmp_path).provision(planner.plan(sim.table, ["7g"])):
            pass


# --- the mig mode end to end: simulator for MIG, real worker processes on the CPU --------------------

SIM_GPU = GpuInfo(0, "GPU-sim", "NVIDIA H200", 141 * 2**30, 1, (9, 0), {"sm_count": 132})
FAST = Settings(rounds=2, round_s=0.2, warmup_s=0.1, warmup_steps=2, timeout_s=60)
TINY = Workload("tests.user_workloads:tiny", batch_size=4)


def sim_target(tmp_path, sim, **options):
    return Target("cpu", SIM_GPU, tmp_path, ModeOptions(mig_reconfigure=True, mig_checkpoint_dir=tmp_path, **options),
                  mig_backend=sim, mig_table=sim.table)


def test_mig_mode_runs_each_worker_in_its_own_instance_and_restores(sim, tmp_path):
    before = existing_layout(sim)
    result = run_scenario([TINY] * 3, MigMode(), sim_target(tmp_path, sim), FAST, tmp_path)
    assert [w.mode_facts["profile"] for w in result.workers] == ["2g.35gb"] * 3  # the paper's 3-process layout
    assert len({w.ready.cuda_visible_devices for w in result.workers}) == 3
    assert all(w.ready.cuda_visible_devices.startswith("MIG-sim-") for w in result.workers)
    assert [i["placement"] for i in result.mode_facts["mig_layout"]] == ["0:2", "2:2", "4:2"]
    assert sim.layout() == before


def test_mig_mode_uses_per_workload_profiles(sim, tmp_path):
    jobs = [Workload("tests.user_workloads:tiny", batch_size=4, mig="4g"), Workload("tests.user_workloads:tiny", mig="3g")]
    result = run_scenario(jobs, MigMode(), sim_target(tmp_path, sim), FAST, tmp_path)
    assert [w.mode_facts["profile"] for w in result.workers] == ["4g.71gb", "3g.71gb"]


def test_infeasible_scenario_is_unavailable_with_the_reason(sim, tmp_path):
    jobs = [Workload("tests.user_workloads:tiny", mig=p) for p in ("4g", "2g", "2g")]
    with pytest.raises(MigUnavailable, match="does not fit on NVIDIA H200: 4g\\+2g\\+2g needs 8 compute slices of 7"):
        run_scenario(jobs, MigMode(), sim_target(tmp_path, sim), FAST, tmp_path)
    assert sim.gpu_instances() == []


def test_worker_failure_under_mig_still_restores(sim, tmp_path):
    before = existing_layout(sim)
    jobs = [TINY, Workload("tests.user_workloads:tiny", batch_size=4, options={"fail_after": 3})]
    with pytest.raises(ScenarioFailed, match="injected failure"):
        run_scenario(jobs, MigMode(), sim_target(tmp_path, sim), FAST, tmp_path)
    assert sim.layout() == before


def test_mixed_profiles_and_layouts_are_configuration_errors(sim, tmp_path):
    from pytest_gpucolloc.modes.base import ModeConfigError

    with pytest.raises(ModeConfigError, match="every workload a MIG profile, or none"):
        MigMode().validate([Workload("resnet26", mig="1g"), Workload("resnet26")], sim_target(tmp_path, sim))
    with pytest.raises(ModeConfigError, match="2 instances for 3 workloads"):
        MigMode().validate([TINY] * 3, sim_target(tmp_path, sim, mig_layout="3g,3g"))


def test_the_papers_mixed_matrix_fits_mig_except_three_layouts():
    """benchmarks/test_paper.py's mixes with their MIG sizes (ResNet26 1g, ResNet50 2g, ResNet152 4g): on an
    H200 the three layouts the paper names cannot exist, each with the planner's reason and a layout that fits."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("paper", Path(__file__).resolve().parents[1] / "benchmarks" / "test_paper.py")
    paper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(paper)
    table = named_table("h200")
    unfit = {mix: planner.plan(table, [job.mig for job in paper.jobs_of(mix)]) for mix in paper.MIXES}
    unfit = {mix: plan for mix, plan in unfit.items() if not plan.feasible}
    assert sorted(unfit) == ["r152+2r50", "r152+r50+2r26", "r152+r50+3r26"]
    for plan in unfit.values():
        assert "needs" in plan.explain() and "A layout that fits:" in plan.explain()
    assert [job.model for job in paper.jobs_of("r152+2r26")] == ["resnet152-imagenet"] + ["resnet26-cifar10"] * 2
