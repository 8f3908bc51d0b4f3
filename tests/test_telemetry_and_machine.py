import time

from pytest_gpucolloc import machine, nvml, telemetry


def test_throttle_decoding_names_only_reasons_that_break_comparability():
    assert telemetry.decode_throttle(0) == []
    assert telemetry.decode_throttle(0x1) == []  # GPU idle is not throttling
    assert telemetry.decode_throttle(0x4 | 0x40) == ["sw_power_cap", "hw_thermal"]


def test_energy_from_counter_readings():
    assert telemetry.energy_joules(1_000, 251_000) == 250.0
    assert telemetry.energy_joules(None, 5) is None
    assert telemetry.energy_joules(10, 5) is None  # counter reset: no fake number


def test_summary_averages_power_over_the_window_and_flags_throttling():
    samples = [
        {"t": 0.0, "energy_mj": 0, "sm_clock_mhz": 1980, "clock_event_reasons": 0},
        {"t": 1.0, "energy_mj": 500_000, "sm_clock_mhz": 1900, "clock_event_reasons": 0x20},
        {"t": 2.0, "energy_mj": 1_000_000, "sm_clock_mhz": 1980, "clock_event_reasons": 0},
    ]
    summary = telemetry.summarise(samples, 2.0)
    assert summary["energy_j"] == 1000.0
    assert summary["avg_power_w"] == 500.0
    assert summary["sm_clock_mhz_min"] == 1900
    assert summary["throttled"] is True and summary["throttle_reasons"] == ["sw_thermal"]
    assert summary["throttle_share"] == {"sw_thermal": 1 / 3}


def test_an_abnormal_limit_that_only_blinks_is_recorded_but_does_not_flag_the_run():
    samples = [{"t": float(i), "sm_clock_mhz": 1980, "clock_event_reasons": 0x40 if i == 7 else 0} for i in range(50)]
    summary = telemetry.summarise(samples, 50.0, max_sm_clock_mhz=1980)
    assert summary["throttle_reasons"] == ["hw_thermal"] and summary["throttle_share"] == {"hw_thermal": 0.02}
    assert summary["throttled"] is False
    samples[10:15] = [dict(s, clock_event_reasons=0x40) for s in samples[10:15]]
    held = telemetry.summarise(samples, 50.0, max_sm_clock_mhz=1980)  # 6 of 50 samples: 12%
    assert held["throttled"] is True and held["throttled_why"] == ["hw_thermal held 12% of the window"]


def test_the_power_cap_is_recorded_and_never_makes_a_run_incomparable():
    # A GPU-bound job at its power limit: the cap bit set in every sample, the clock at its maximum.
    samples = [{"t": float(i), "sm_clock_mhz": 1980, "power_mw": 690_000, "clock_event_reasons": 0x4}
               for i in range(20)]
    summary = telemetry.summarise(samples, 20.0, max_sm_clock_mhz=1980)
    assert summary["power_capped_share"] == 1.0 and summary["sm_clock_mhz_mean"] == 1980
    assert summary["throttled"] is False and summary["throttled_why"] == []


def test_a_clock_far_below_its_maximum_flags_the_run_whatever_the_reason_bits_say():
    samples = [{"t": float(i), "sm_clock_mhz": 1980 if i < 15 else 1200, "clock_event_reasons": 0x4}
               for i in range(20)]  # a quarter of the window at 61% of the maximum
    summary = telemetry.summarise(samples, 20.0, max_sm_clock_mhz=1980)
    assert summary["clock_below_floor_share"] == 0.25 and summary["throttled"] is True
    assert "SM clock was below 75% of its 1980 MHz maximum for 25% of the window" in summary["throttled_why"][0]
    # a GPU that lowers its clock for lack of work (launch-bound jobs between kernels) is not throttled
    idle = [dict(s, clock_event_reasons=0x1) if s["sm_clock_mhz"] == 1200 else s for s in samples]
    assert telemetry.summarise(idle, 20.0, max_sm_clock_mhz=1980)["throttled"] is False


def test_missing_energy_counter_falls_back_to_power_readings_and_says_so():
    samples = [{"t": 0.0, "power_mw": 300_000}, {"t": 1.0, "power_mw": 500_000}]
    summary = telemetry.summarise(samples, 1.0)
    assert summary["avg_power_w"] == 400.0
    assert "energy_j" not in summary and "energy_unavailable" in summary


def test_unsupported_utilisation_is_a_reason_not_a_zero():
    assert telemetry.fallback_utilisation([{"utilization_gpu_pct": None}]) == {
        "gpu_utilization_pct": "unsupported on this GPU"}


def test_sampler_reads_only_inside_the_window(monkeypatch):
    readings = []

    def instant(uuid):
        readings.append(time.monotonic())
        return {"energy_mj": 1000 * len(readings), "power_mw": 1, "sm_clock_mhz": 1, "clock_event_reasons": 0}

    monkeypatch.setattr(nvml, "instant_sample", instant)
    monkeypatch.setattr(nvml, "gpm_supported", lambda uuid: False)
    monkeypatch.setattr(nvml, "gpu_processes", lambda uuid: {42: {"memory_bytes": 7, "mps": True}, 9: {"memory_bytes": 1, "mps": False}})
    start = time.monotonic() + 0.3
    with telemetry.Sampler("GPU-test", (start, start + 0.6), [42]) as sampler:
        time.sleep(1.2)
    assert readings and min(readings) >= start - 0.01 and max(readings) <= start + 0.6 + 0.05
    summary = sampler.summary()
    assert summary["memory_bytes_by_pid"] == {"42": 7}  # only our workers
    assert summary["foreign_pids"] == [9]  # someone else on the GPU: the result is contaminated
    assert summary["metrics_source"] == "nvml-utilization-rates"


def test_sampler_errors_are_reported_not_raised(monkeypatch):
    def broken(uuid):
        raise RuntimeError("NVML went away")

    monkeypatch.setattr(nvml, "gpm_supported", broken)
    start = time.monotonic()
    with telemetry.Sampler("GPU-test", (start, start + 0.1), []) as sampler:
        time.sleep(0.2)
    assert "NVML went away" in sampler.summary()["error"]


def test_machine_differences_in_words():
    saved = {"driver_version": "570.86", "cuda_driver_version": "12.8", "gpu_name": "NVIDIA H200", "torch": "2.10"}
    current = {"driver_version": "580.159", "cuda_driver_version": "13.0", "gpu_name": "NVIDIA H200", "torch": "2.11"}
    assert machine.differences(saved, current) == [
        "driver 570.86 -> 580.159", "CUDA driver 12.8 -> 13.0", "torch 2.10 -> 2.11"]
    assert machine.differences(current, current) == []
    assert machine.differences({"cudnn": 91000}, {}) == []  # not recorded on one side: not a change


def test_identity_without_a_gpu_says_cpu():
    import torch

    info = machine.identity(None, {"cuda_runtime": "13.0", "cudnn": None})
    assert info["device"] == "cpu" and "plugin_version" in info
    assert torch.__version__.startswith(info["torch"]) and info["cuda_runtime"] == "13.0"
    # before any worker has run, torch's view is read in a separate process, with the keys a worker gives
    before = machine.identity(None, None)
    assert before["cuda_runtime"] == torch.version.cuda and before["cudnn"] is None


def test_under_mig_gpm_is_read_per_gpu_instance(monkeypatch):
    samples = []

    class FakeSample:
        def __init__(self, uuid, gpu_instance_id=None):
            self.gi = gpu_instance_id
            samples.append(self)

        def free(self):
            self.freed = True

    monkeypatch.setattr(nvml, "instant_sample", lambda uuid: {"energy_mj": 0})
    monkeypatch.setattr(nvml, "gpu_processes", lambda uuid: {})
    monkeypatch.setattr(nvml, "gpm_supported", lambda uuid: True)
    monkeypatch.setattr(nvml, "GpmSample", FakeSample)
    monkeypatch.setattr(nvml, "gpm_metrics", lambda a, b: {"sm_activity_pct": 10.0 + (a.gi or 0)})
    start = time.monotonic()
    with telemetry.Sampler("GPU-x", (start, start + 0.3), [1, 2], gpu_instance_ids=[3, 5]) as sampler:
        time.sleep(0.5)
    summary = sampler.summary()
    assert summary["sm_activity_pct"] == 10.0
    assert summary["per_gpu_instance"] == {"3": {"sm_activity_pct": 13.0}, "5": {"sm_activity_pct": 15.0}}
    assert all(getattr(s, "freed", False) for s in samples)  # NVML samples are always released
