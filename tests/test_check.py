"""``pytest-gpucolloc check``: each finding from what a machine shows (a /sys and /proc laid out as Linux lays
them out, NVML's facts as ``nvml.steadiness`` returns them), and the command on this GPU-less machine."""
import json

from pytest_gpucolloc import checkup, cli

STEADY = {"persistence_mode": 1, "power_limit_w": 700.0, "default_power_limit_w": 700.0, "max_power_limit_w": 700.0,
          "application_sm_clock_mhz": 1980, "default_application_sm_clock_mhz": 1980, "max_sm_clock_mhz": 1980,
          "mig_mode": 0, "mig_pending": 0, "processes": {}}


def test_a_steady_gpu_has_only_ok_findings():
    found = checkup.gpu(0, "NVIDIA H200", STEADY)
    assert {f.severity for f in found} == {checkup.OK} and len(found) == 4


def test_what_makes_a_gpu_unsteady_is_named_with_what_to_do():
    facts = {**STEADY, "persistence_mode": 0, "power_limit_w": 450.0, "application_sm_clock_mhz": 1410,
             "processes": {4242: {"memory_bytes": 3 * 2**30, "mps": False, "name": "python train.py"},
                           99: {"memory_bytes": None, "mps": False, "name": None}}}
    found = {f.check: f for f in checkup.gpu(1, "NVIDIA H200", facts, own_pids={99})}
    assert {f.severity for f in found.values()} == {checkup.UNSTEADY}
    assert found["GPU 1 (NVIDIA H200) persistence"].fix == "sudo nvidia-smi -i 1 -pm 1"
    assert found["GPU 1 (NVIDIA H200) power limit"].finding.startswith("450 W, below its default 700 W")
    assert "1410 MHz, not its default 1980 MHz" in found["GPU 1 (NVIDIA H200) clocks"].finding
    others = found["GPU 1 (NVIDIA H200) processes"].finding
    assert "4242 (python train.py, 3.0 GiB)" in others and "99" not in others  # its own process is not a stranger


def test_mig_on_is_a_note_and_a_pending_change_is_unsteady():
    on = [f for f in checkup.gpu(0, "H200", {**STEADY, "mig_mode": 1, "mig_pending": 1}) if f.check.endswith("MIG")]
    assert on[0].severity == checkup.NOTE and on[0].fix.startswith("--gpu-mode=mig")
    pending = [f for f in checkup.gpu(0, "H200", {**STEADY, "mig_pending": 1}) if f.check.endswith("MIG")]
    assert pending[0].severity == checkup.UNSTEADY and "pending a GPU reset" in pending[0].finding


def test_cpu_governors_other_than_performance_are_counted(tmp_path):
    for cpu, governor in enumerate(["performance", "powersave", "powersave"]):
        folder = tmp_path / f"cpu{cpu}" / "cpufreq"
        folder.mkdir(parents=True)
        (folder / "scaling_governor").write_text(governor + "\n")
    (finding,) = checkup.cpu_governors(tmp_path)
    assert finding.severity == checkup.UNSTEADY and finding.finding.startswith("powersave on 2 of 3 cores")
    for cpu in (1, 2):
        (tmp_path / f"cpu{cpu}" / "cpufreq" / "scaling_governor").write_text("performance\n")
    assert checkup.cpu_governors(tmp_path)[0].severity == checkup.OK
    assert checkup.cpu_governors(tmp_path / "none")[0].severity == checkup.NOTE  # a VM: not exposed


def test_cpu_load_above_half_the_cores_is_unsteady():
    assert checkup.cpu_load(load=3.0, cores=4)[0].severity == checkup.UNSTEADY
    assert checkup.cpu_load(load=1.0, cores=4)[0].severity == checkup.OK


def test_mps_daemons_are_found_by_their_program_name(tmp_path):
    for pid, name in ((10, "bash"), (11, "nvidia-cuda-mps-control"), (12, "nvidia-cuda-mps-server")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "comm").write_text(name + "\n")
    (finding,) = checkup.mps_daemons(tmp_path)
    assert finding.severity == checkup.UNSTEADY
    assert "nvidia-cuda-mps-control (pid 11), nvidia-cuda-mps-server (pid 12)" in finding.finding
    (tmp_path / "11" / "comm").write_text("sleep\n")
    (tmp_path / "12" / "comm").write_text("sleep\n")
    assert checkup.mps_daemons(tmp_path)[0].severity == checkup.OK


def test_the_command_without_a_gpu_checks_the_cpu_side_and_exits_by_what_it_found(capsys):
    code = cli.main(["check", "--format", "json"])
    rows = json.loads(capsys.readouterr().out)
    checks = [row["check"] for row in rows]
    assert checks[0] == "GPU" and "no NVIDIA GPU" in rows[0]["finding"]  # this machine has none
    assert {"MPS daemons", "CPU governor", "CPU load"} <= set(checks)
    assert code == (1 if any(row["severity"] == "unsteady" for row in rows) else 0)
    # the machine's load may cross the line between two calls: each call's text goes by its own exit code
    again = cli.main(["check", "--format", "markdown"])
    said = capsys.readouterr().out
    assert ("that make numbers unsteady" if again == 1 else "nothing found that makes numbers unsteady") in said
