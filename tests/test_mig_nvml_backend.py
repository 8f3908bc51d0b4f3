"""The real NVML MIG backend (``mig/nvml_backend.py``) against a fake pynvml driven by the simulator: its own
ctypes calls, profile index/id handling, sparse MIG device indexes and error codes run here, on a GPU-less CI."""
import pytest

from doubles.fake_pynvml import FakePynvml
from doubles.mig_simulator import SimulatedMig
from pytest_gpucolloc.mig import planner
from pytest_gpucolloc.mig.nvml_backend import NvmlMigBackend, read_profiles
from pytest_gpucolloc.mig.profiles import named_table, table_from_dict
from pytest_gpucolloc.mig.provision import MigError, MigProvisioner
from pytest_gpucolloc.mig.state import MigBackendError


@pytest.fixture
def sim():
    return SimulatedMig(named_table("h200"))


def backend_of(sim):
    return NvmlMigBackend("GPU-sim", lib=FakePynvml(sim))


def facts(table):
    return sorted((p.profile_id, p.name, p.slice_count, p.instance_count, p.memory_mb, p.starts, p.size)
                  for p in table.profiles)


def test_profiles_read_through_nvml_are_the_table_it_reports(sim):
    read = table_from_dict({"gpu": "NVIDIA H200", "profiles": read_profiles("GPU-sim", FakePynvml(sim))})
    assert facts(read) == facts(named_table("h200"))


def test_provisioning_through_nvml_creates_the_plan_and_restores_what_was_there(sim, tmp_path):
    sim.create_gpu_instance(named_table("h200").resolve("7g").profile_id, 0)  # an admin's layout
    sim.create_compute_instance(1)
    before = sim.layout()
    backend = backend_of(sim)
    assert [(i.profile_id, i.start, len(i.compute_instances)) for i in backend.gpu_instances()] == \
        [(named_table("h200").resolve("7g").profile_id, 0, 1)]
    table = named_table("h200")
    plan = planner.plan(table, ["3g", "2g", "1g", "1g"])
    provisioner = MigProvisioner(backend, table, "GPU-sim", 0, allow_reconfigure=True, checkpoint_dir=tmp_path)
    with provisioner.provision(plan) as instances:
        assert sorted(sim.layout()) == sorted((p.profile.name, p.start) for p in plan.placements)
        uuids = [i.uuid for i in instances]
        assert len(set(uuids)) == 4 and all(u.startswith("MIG-sim-") for u in uuids)  # found at sparse indexes
    assert sim.layout() == before
    assert not list(tmp_path.glob("mig-checkpoint-*"))


def test_nvml_errors_become_backend_errors_with_their_code(sim, tmp_path):
    backend = backend_of(sim)
    sim.privileged = False
    with pytest.raises(MigBackendError) as error:
        backend.create_gpu_instance(named_table("h200").resolve("1g").profile_id, 0)
    assert error.value.code == "no_permission"
    table = named_table("h200")
    provisioner = MigProvisioner(backend, table, "GPU-sim", 0, allow_reconfigure=True, checkpoint_dir=tmp_path)
    with pytest.raises(MigError, match="needs root or the mig/config capability"):
        with provisioner.provision(planner.plan(table, ["1g"])):
            pass


def test_an_instance_in_use_is_not_destroyed(sim):
    backend = backend_of(sim)
    gi = backend.create_gpu_instance(named_table("h200").resolve("2g").profile_id, 0)
    ci = backend.create_compute_instance(gi)
    sim.attach_process(4242, gi)
    assert backend.processes() == [4242]
    with pytest.raises(MigBackendError) as error:
        backend.destroy_compute_instance(gi, ci)
    assert error.value.code == "in_use"
    sim.detach_process(4242)
    backend.destroy_compute_instance(gi, ci)
    backend.destroy_gpu_instance(gi)
    assert backend.gpu_instances() == []
