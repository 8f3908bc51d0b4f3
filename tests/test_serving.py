"""Serving jobs (Workload(..., rate=...)): open-loop requests whose latency counts from the scheduled arrival, every
latency kept, a rate the job cannot serve said as such, and one record holding the service's percentiles beside its
training neighbours' throughput. Real workers on the CPU through pytester; the schedule on a pretend clock."""
import json
import queue
import threading
import time

import pytest

import serving_workload
from pytest_gpucolloc import protocol, serving, worker
from pytest_gpucolloc.workloads import Workload, WorkloadError
from serving_workload import SOURCE as SERVE_SOURCE
from tiny_workload import SOURCE as TINY_SOURCE

SCENARIOS = '''
import pytest
from pytest_gpucolloc import Workload

pytestmark = pytest.mark.gpucolloc_quick
SERVE = Workload("serve_workload:factory", batch_size=8, rate="50%")  # CPU smoke mode runs it at batch size 4

@pytest.mark.parametrize("neighbours", [0, 1])
def test_service(collocate, neighbours):
    collocate([SERVE] + [Workload("tiny_workload:factory", batch_size=4)] * neighbours)

def test_flooded(collocate):
    collocate([Workload("serve_workload:factory", batch_size=2, rate=100000)])
'''
ARGS = ["--gpu-mode=naive", "--colloc-device=cpu", "--colloc-rounds=3", "--colloc-round-seconds=0.3",
        "--colloc-warmup-seconds=0.2", "-p", "no:cacheprovider"]


class Clock:
    """A pretend clock: a request takes ``service`` seconds, and waiting moves time along."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 1e-9
        return self.now


def test_latency_counts_from_the_scheduled_arrival_so_a_queue_shows():
    """Requests every second, each taking 2.5 s: the job falls behind and each answer is later than the one before.
    Timed from when the job got to a request (coordinated omission), every latency would read 2.5 s."""
    clock = Clock()
    requests = serving.Requests(lambda: setattr(clock, "now", clock.now + 2.5), lambda: None, rate=1.0, clock=clock)
    latencies = [requests.serve_one() for _ in range(4)]
    assert latencies == pytest.approx([2.5, 4.0, 5.5, 7.0], abs=1e-6)
    assert requests.backlog(clock.now) == 7  # by t=10 requests 0-10 have arrived (11), 4 are answered


def test_back_to_back_has_no_queue():
    clock = Clock()
    requests = serving.Requests(lambda: setattr(clock, "now", clock.now + 0.01), lambda: None, rate=None, clock=clock)
    assert [requests.serve_one() for _ in range(3)] == pytest.approx([0.01] * 3, abs=1e-6)
    assert requests.backlog(clock.now) == 0


def test_a_queue_goes_on_when_more_rounds_are_asked_for_so_a_slow_service_is_seen_to_fall_behind():
    """Rounds come in batches (more until the mean is precise): between them the schedule and the queue go on. A
    service answering every 15 ms a request sent every 10 ms is saturated over both batches, however short the
    last one is."""
    clock = Clock()
    requests = serving.Requests(lambda: setattr(clock, "now", clock.now + 0.015), lambda: None, rate=100.0,
                                clock=clock)
    first, first_latency = serving.serve_rounds(requests, clock.now, 0.5, 4, samples_per_request=1)
    more, more_latency = serving.serve_rounds(requests, clock.now + 0.05, 0.5, 1, samples_per_request=1, fresh=False)
    backlog = [entry["backlog"] for entry in first_latency + more_latency]
    assert backlog == sorted(backlog) and backlog[-1] > backlog[-2] > 60
    facts = serving.summary(100.0, 100.0, first + more, first_latency + more_latency, 1)
    assert facts["saturated"] and facts["achieved_rps"] == pytest.approx(100 / 1.5, rel=0.05)


def test_poisson_arrivals_come_at_the_rate_with_random_gaps_the_same_from_every_start():
    """A Poisson schedule at 50/s: gaps of mean 20 ms that vary (an even schedule's phase against periodic
    neighbours is set once per session); the same gaps from every start, so two runs or arms compare alike; the
    backlog counts the arrivals so far; a request still queued at the end counts its wait from its own arrival."""
    clock = Clock()
    requests = serving.Requests(lambda: None, lambda: None, rate=50.0, clock=clock, arrivals="poisson")
    arrivals = [requests.arrival(k) - requests.start for k in range(2001)]
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert sum(gaps) / len(gaps) == pytest.approx(0.02, rel=0.1) and min(gaps) < 0.002 and max(gaps) > 0.08
    requests.restart(clock.now + 5)
    assert [requests.arrival(k) - requests.start for k in range(5)] == pytest.approx(arrivals[:5])
    now = requests.start + arrivals[10] + 1e-6
    assert requests.backlog(now) == 11  # requests 0-10 have arrived, none answered
    stalled = serving.Requests(lambda: setattr(clock, "now", clock.now + 1.0), lambda: None, rate=50.0, clock=clock,
                               arrivals="poisson")
    _, latency = serving.serve_rounds(stalled, clock.now, 0.5, 1, samples_per_request=1)
    queued = serving.decode(latency[0]["histogram"])
    assert latency[0]["backlog"] > 20 and queued.get_total_count() == 1 + latency[0]["backlog"]
    assert queued.get_min_value() < 50_000  # the last arrival waited a few ms, not the round's length


def test_a_schedule_is_even_unless_asked_and_only_a_service_takes_one():
    job = Workload("resnet50-imagenet224", batch_size=4, rate=50, arrivals="poisson")
    assert job.label.endswith("/serve-50rps-poisson") and Workload.from_dict(job.to_dict()) == job
    assert job.key() != job.__class__("resnet50-imagenet224", batch_size=4, rate=50).key()
    assert "arrivals" not in Workload("resnet50-imagenet224", rate=50).to_dict()  # saved as before
    with pytest.raises(WorkloadError, match="arrivals must be one of even, poisson"):
        Workload("resnet50-imagenet224", rate=50, arrivals="bursty")
    with pytest.raises(WorkloadError, match="give it a rate"):
        Workload("resnet50-imagenet224", arrivals="poisson")


@pytest.mark.parametrize("spin", [True, False])
def test_a_service_on_cores_of_its_own_spins_between_measured_requests_else_it_sleeps(monkeypatch, spin):
    """A core woken from sleep dispatches slower, by varying amounts: measured waits of a pinned service spin."""
    slept = []
    monkeypatch.setattr(serving.time, "sleep", slept.append)
    requests = serving.Requests(lambda: None, lambda: None, rate=200.0, spin=spin)
    _, latency = serving.serve_rounds(requests, time.monotonic() + 0.02, 0.05, 2, samples_per_request=1)
    assert serving.summary(200.0, 200.0, [(0.05, 10)] * 2, latency, 1)["requests"] >= 15
    assert (slept == []) is spin


def test_a_slow_service_waiting_for_its_next_request_still_hears_a_command_at_once():
    """One request a second: a command sent between two of them is taken when it arrives, not at the next
    request (a measurement's start would otherwise be missed and its lateness counted as latency)."""
    channel = Channel()
    requests = serving.Requests(lambda: None, lambda: None, rate=1.0)
    threading.Timer(0.2, channel.commands.put, [protocol.Stop()]).start()
    began = time.monotonic()
    assert isinstance(worker._train_until_told(None, channel, requests), protocol.Stop)
    assert time.monotonic() - began < 0.6


class Channel:
    """The worker's command channel, as _train_until_told reads it."""

    def __init__(self):
        self.commands = queue.Queue()

    def poll(self):
        try:
            return self.commands.get_nowait()
        except queue.Empty:
            return None


def test_a_rate_too_slow_to_answer_requests_in_every_round_is_refused_before_it_runs(pytester):
    pytester.makepyfile(serve_workload=SERVE_SOURCE, test_slow=SLOW)
    result = pytester.runpytest_subprocess(*ARGS, "--colloc-cpu-full")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*at 1 requests/s a round of 0.3 s holds fewer than 2 requests to measure: "
                                 "raise the rate or --colloc-round-seconds*"])
    assert "Traceback" not in result.stdout.str()


def test_in_cpu_smoke_mode_a_share_of_a_slow_service_is_skipped_saying_why(pytester):
    """A service answering ~4 requests/s back to back on the CPU, asked for 10% of it: too few requests a round to
    measure, so CPU smoke mode skips it with the reason (on a GPU it would fail, as a rate too slow does)."""
    pytester.makepyfile(serve_workload=serving_workload.source(ms=250), test_slow=SLOW.replace("rate=1", 'rate="10%"'))
    result = pytester.runpytest_subprocess(*ARGS, "--colloc-cpu-full", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*CPU smoke mode: serve_workload:factory*requests/s here back to back, so 10% of it "
                                 "leaves fewer than 2 requests a round of 0.3 s to measure; this service scenario "
                                 "runs on a GPU*"])


SLOW = """
from pytest_gpucolloc import Workload

def test_slow(collocate):
    collocate([Workload("serve_workload:factory", rate=1)])
"""


@pytest.mark.parametrize("rate", [0, -5, True, "fast", "0%", "150%", 1e9])
def test_a_rate_that_means_nothing_is_refused(rate):
    with pytest.raises(WorkloadError, match="rate must be"):
        Workload("resnet50-imagenet224", rate=rate)


def test_a_serving_job_is_labelled_and_saved_with_its_rate_and_a_training_job_as_before():
    job = Workload("resnet50-imagenet224", batch_size=4, precision="bf16", rate="80%")
    assert job.label == "resnet50-imagenet224/bs4/bf16/serve-80%" and job.share_of_alone == 0.8
    assert Workload.from_dict(job.to_dict()) == job
    assert "rate" not in Workload("resnet26").to_dict()


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(tiny_workload=TINY_SOURCE, serve_workload=SERVE_SOURCE, test_scenarios=SCENARIOS)


def _records(path):
    data = json.loads(path.read_text())
    return {bench["name"]: bench["extra_info"] for bench in data["benchmarks"]}


def test_a_service_beside_training_records_its_percentiles_and_what_training_kept(pytester, suite):
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(*ARGS, f"--benchmark-json={out}", "-k", "service")
    result.assert_outcomes(passed=2)
    records = _records(out)
    alone, beside = records["test_service[cpu-naive-0]"]["serving"], records["test_service[cpu-naive-1]"]["serving"]
    for facts in (alone, beside):
        assert 0 < facts["p50_ms"] <= facts["p90_ms"] <= facts["p99_ms"] <= facts["p999_ms"] <= facts["max_ms"]
        assert facts["rate_asked"].startswith("50% of ") and facts["offered_rps"] > 0
        assert facts["achieved_rps"] == pytest.approx(facts["offered_rps"], rel=0.2)  # it keeps up at half its rate
        assert not facts["saturated"] and facts["requests"] >= 3
        assert len(facts["round_p99_ms"]) == len(facts["round_p50_ms"]) == 3 and serving.decode(facts["histogram"]).get_total_count() \
            == facts["requests"]
    assert alone["training_jobs"] == 0 and beside["training_jobs"] == 1
    assert beside["alone_p99_ms"] == alone["p99_ms"] and beside["p99_vs_alone"] > 0
    assert beside["alone_p50_ms"] == alone["p50_ms"] and beside["alone_round_p50_ms"] == alone["round_p50_ms"]
    assert 0 < beside["training_kept"]
    # the scenario's aggregate is its training job's samples, not the service's
    trainer = records["test_service[cpu-naive-1]"]["workers"][1]
    assert records["test_service[cpu-naive-1]"]["aggregate_throughput"] == pytest.approx(
        trainer["throughput"], rel=0.05)


def test_a_rate_the_job_cannot_serve_is_said_to_be_saturated_with_how_far_the_queue_grew(pytester, suite):
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(*ARGS, f"--benchmark-json={out}", "-k", "flooded")
    result.assert_outcomes(passed=1)
    facts = _records(out)["test_flooded[cpu-naive]"]["serving"]
    assert facts["saturated"] and facts["unserved"] > 1000 and facts["backlog"] == sorted(facts["backlog"])
    assert facts["achieved_rps"] < 1000  # what it did answer: far below what was offered
    assert "more than it serves: the queue grew to" in facts["why"]
    result.stdout.fnmatch_lines(["*saturated service: 100,000 requests/s is more than it serves*"])


def test_one_service_per_scenario(pytester):
    pytester.makepyfile(test_two='''
from pytest_gpucolloc import Workload

def test_two(collocate):
    collocate([Workload("resnet50-imagenet224", rate=10)] * 2)
''')
    result = pytester.runpytest_subprocess("--gpu-mode=naive", "--colloc-device=cpu", "--colloc-cpu-full")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*one serving job (rate=...) per scenario*"])


def test_training_runs_without_hdrhistogram_installed(pytester, monkeypatch):
    """hdrhistogram is loaded only where a test has a service: an environment without it (an offline machine
    installed with --no-deps) still loads the plugin and trains."""
    broken = pytester.mkdir("no_hdrh") / "hdrh"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('hdrhistogram is not installed here')\n")
    monkeypatch.setenv("PYTHONPATH", str(broken.parent))
    pytester.makepyfile(tiny_workload=TINY_SOURCE, test_train='''
from pytest_gpucolloc import Workload

def test_train(collocate):
    collocate([Workload("tiny_workload:factory", batch_size=4)])
''')
    pytester.runpytest_subprocess(*ARGS, "--colloc-cpu-full").assert_outcomes(passed=1)
