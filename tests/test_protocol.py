"""The worker protocol (protocol.py): both sides' messages, and what the controller does with anything else."""
import pytest

from pytest_gpucolloc import protocol
from pytest_gpucolloc.device import standalone_target
from pytest_gpucolloc.modes.naive import NaiveMode
from pytest_gpucolloc.scenario import ScenarioFailed, Settings, run_scenario
from pytest_gpucolloc.workloads import Workload


def test_commands_and_events_survive_the_wire():
    spec = protocol.Spec(workload=Workload("resnet26").to_dict(), device="cpu", warmup_s=0.5, warmup_steps=2, cpus=[1])
    assert protocol.decode_command(protocol.encode_command(spec).decode()) == spec
    assert protocol.decode_command(protocol.encode_command(protocol.Measure(1.5, 0.5, 3)).decode()) == \
        protocol.Measure(1.5, 0.5, 3)
    result = protocol.Result(rounds=[(0.5, 64), (0.5, 60)], peak_memory_bytes=None)
    assert protocol.decode_event(protocol.encode_event(result).encode()) == result
    error = protocol.Error("OutOfMemoryError", "CUDA out of memory", details={"device_free_bytes": 0})
    assert protocol.decode_event(protocol.encode_event(error).encode()) == error


@pytest.mark.parametrize("line,why", [
    (b"progress: 50%", "not a protocol message"),
    (b'{"event": "launch"}', "not a protocol message"),
    (b'{"event": "result", "rounds": []}', "non-empty list"),
    (b'{"event": "result", "rounds": [[0, 10]]}', "seconds must be positive"),
    (b'{"event": "result", "rounds": [[1.0, "many"]]}', "samples must be"),
    (b'{"event": "result", "rounds": [[1.0, -1]]}', "samples must be"),
    (b'{"event": "result", "rounds": [[1.0, 5]], "data_wait_s": [0.1, 0.2]}', "one number per round"),
    (b'{"event": "result", "rounds": [[1.0, 5]], "data_wait_s": [-0.1]}', "data wait must be"),
    (b'{"event": "ready", "pid": 1, "samples_per_step": 0, "warmup_steps": 1, "cpus": [], "startup_phases_s": {}}',
     "samples_per_step must be"),
])
def test_anything_else_on_the_channel_is_a_protocol_error(line, why):
    with pytest.raises(protocol.ProtocolError, match=why):
        protocol.decode_event(line)


@pytest.mark.slow
def test_a_workload_writing_on_the_message_channel_fails_promptly_naming_its_worker(tmp_path):
    settings = Settings(rounds=2, round_s=0.2, warmup_s=0.2, warmup_steps=2, timeout_s=120)
    jobs = [Workload("tests.user_workloads:tiny", batch_size=4),
            Workload("tests.user_workloads:tiny", batch_size=4, options={"fail_after": 1, "failure": "channel"})]
    with standalone_target("cpu") as target, pytest.raises(ScenarioFailed) as failure:
        run_scenario(jobs, NaiveMode(), target, settings, tmp_path)
    assert "worker w1 failed: wrote on its message channel what is not a message" in str(failure.value)
    assert "progress: 50%" in str(failure.value)


def test_an_out_of_memory_says_what_the_job_tried_to_allocate_and_what_was_free():
    from pytest_gpucolloc.pool import WorkerFailed, WorkerSlot
    from pytest_gpucolloc.scenario import _explain

    message = ("CUDA out of memory. Tried to allocate 1.50 TiB. GPU 0 has a total capacity of 139.81 GiB of which "
               "139.20 GiB is free.")
    error = protocol.Error("OutOfMemoryError", message, details={
        "device_free_bytes": 139 * 2**30, "device_total_bytes": 140 * 2**30, "max_memory_allocated_bytes": 2**30})
    job = Workload("gpt2-small", batch_size=4096, options={"seq_len": 4096})
    text = _explain(WorkerFailed("w0", f"OutOfMemoryError: {message}", "", error), WorkerSlot(job))
    assert text.startswith("gpt2-small/bs4096/seq4096 does not fit in the GPU's memory: it tried to allocate "
                           "1.50 TiB with 139.0 GiB of 140.0 GiB free; it had allocated 1,024 MB at its peak")
    partitioned = WorkerSlot(job, mode_facts={"memory_limit_mb": 1024})
    assert "does not fit in its partition: pinned device memory limit 1024 MB" in _explain(
        WorkerFailed("w0", "OutOfMemoryError", "", error), partitioned)
