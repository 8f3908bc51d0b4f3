import pytest

from pytest_gpucolloc import measure


def stats(rounds, per_step=1):
    return measure.WorkerStats(rounds, per_step)


def test_throughput_is_samples_over_the_whole_window():
    worker = stats([(1.0, 100), (2.0, 300)], per_step=10)
    assert worker.throughput == pytest.approx(400 / 3)
    assert worker.round_throughputs == [100, 150]
    assert worker.step_times == pytest.approx([0.1, 2 / 30])


def test_concurrent_aggregate_adds_workers_round_by_round():
    a = stats([(1.0, 100), (1.0, 120)])
    b = stats([(1.0, 50), (1.0, 40)])
    assert measure.concurrent_aggregate([a, b]) == [150, 160]


def test_sequential_aggregate_is_equal_work_one_after_another():
    fast = stats([(1.0, 300)])
    slow = stats([(1.0, 100)])
    # 2 samples take 1/300 + 1/100 s
    assert measure.sequential_aggregate([fast, slow]) == [pytest.approx(2 / (1 / 300 + 1 / 100))]
    assert measure.sequential_aggregate([fast, fast]) == [pytest.approx(300)]


def test_weighted_speedup():
    assert measure.weighted_speedup([60, 60], [100, 100]) == pytest.approx(1.2)
    assert measure.weighted_speedup([60, 10], [100, None]) is None


def test_benchmark_timing_is_inverse_throughput_so_a_drop_looks_slower():
    before = measure.seconds_per_sample([100.0])[0]
    after = measure.seconds_per_sample([95.0])[0]
    assert after / before - 1 > 0.05  # a 5% throughput loss is a >5% time increase


def test_cv():
    assert measure.coefficient_of_variation([10]) is None
    assert measure.coefficient_of_variation([10, 10, 10]) == 0
    assert measure.coefficient_of_variation([9, 11]) == pytest.approx(0.1414, rel=1e-3)


def test_rounds_for_precision_asks_for_more_rounds_only_while_the_mean_is_uncertain():
    steady = [100.0, 100.1, 99.9, 100.0, 100.05]
    assert measure.rounds_for_precision(steady, 0.005) == 0  # known within 0.5% already
    noisy = [100.0, 90.0, 110.0, 95.0, 105.0]
    needed = measure.rounds_for_precision(noisy, 0.005)
    assert needed > 100  # CV ~8%: hundreds of rounds for 0.5%
    assert measure.rounds_for_precision(noisy, 0.05) < needed
    assert measure.rounds_for_precision([100.0], 0.005) == 2


def test_rounds_stop_when_precise_at_the_most_or_when_the_precision_is_out_of_reach():
    steady = [100.0, 100.1, 99.9, 100.0, 100.05]
    assert measure.enough_rounds(steady, 0.005, 10)[0] == "precision 0.50% reached"
    noisy = [100.0, 90.0, 110.0, 95.0, 105.0]  # CV ~8%: hundreds of rounds for 0.5%, far beyond 10
    stopped, needed = measure.enough_rounds(noisy, 0.005, 10)
    assert stopped == f"precision 0.50% out of reach (about {needed} rounds needed, at most 10)" and needed > 20
    # within reach of twice the most: more rounds, up to the most
    close = [100.0, 99.0, 101.0, 99.5, 100.5]
    stopped, needed = measure.enough_rounds(close, 0.005, 10)
    assert stopped is None and 5 < needed <= 20
    assert measure.enough_rounds(close + close, 0.005, 10)[0] in ("precision 0.50% reached", "most rounds reached")
    assert measure.enough_rounds(noisy, 0, 10) == (None, 10)  # precision 0: always the most
    assert measure.enough_rounds(noisy + noisy, 0, 10)[0] == "most rounds reached"


def test_warm_up_is_over_once_throughput_stops_rising():
    assert not measure.stopped_rising([10, 20, 40])  # too few windows to tell
    assert not measure.stopped_rising([10, 20, 40, 80])  # still climbing
    assert not measure.stopped_rising([10, 50, 100, 100.5])  # the last four windows still include the climb
    assert measure.stopped_rising([10, 50, 100, 100.5, 100.2, 100.4])  # flat within 2%
    assert measure.stopped_rising([100, 100, 90, 95])  # noise downwards is not warm-up
