"""Paired A/B of a serving job (``pytest-gpucolloc ab``): its latency judged at p50 and p99 beside the training jobs'
throughput, lower being better, on real git revisions of a user's serving step, each arm a pytest session on the CPU."""
import json
import subprocess

import pytest

import serving_workload
from pytest_gpucolloc import ab_judge, cli, serving

SCENARIO = '''
from pytest_gpucolloc import Workload

def test_service(collocate):  # 40 requests/s: neither arm queues
    collocate([Workload("serve_workload:factory", batch_size=2, rate=40)])

def test_flooded(collocate):  # far more requests than either arm answers: the queue grows
    collocate([Workload("serve_workload:factory", batch_size=2, rate=100000)])
'''

# unpinned: both arms' services pinned to one core of a small, busy machine would share it with whatever else runs
ARGS = ["--", "test_scenario.py", "--colloc-device=cpu", "--colloc-cpu-full", "--gpu-mode=naive", "--colloc-cpus=none",
        "--colloc-warmup-seconds=0.3"]
AB = ["ab", "--threshold", "10", "--ab-pairs", "3", "--ab-window-seconds", "0.5"]


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A project with two commits: the second makes each request five times the work (2 ms, then 10 ms; a 2 ms
    request's p99 on a busy CPU can reach several ms)."""
    path = tmp_path / "project"
    path.mkdir()
    git(path, "init", "-q")
    git(path, "config", "user.email", "ab@example.invalid")
    git(path, "config", "user.name", "ab")
    (path / "serve_workload.py").write_text(serving_workload.source(ms=2))
    (path / "test_scenario.py").write_text(SCENARIO)
    git(path, "add", ".")
    git(path, "commit", "-qm", "2 ms a request")
    (path / "serve_workload.py").write_text(serving_workload.source(ms=10))
    git(path, "commit", "-qam", "10 ms a request")
    monkeypatch.chdir(path)
    return path


def ab(tmp_path, baseline, candidate, ab_args, *pytest_args):
    """The A/B's exit code, and its judgements by scenario and metric."""
    report = tmp_path / "ab.json"
    code = cli.main([*AB, *ab_args, "--baseline", baseline, "--candidate", candidate, "--out", str(tmp_path / "arms"),
                     "--json", str(report), *ARGS, *pytest_args])
    judged = {(j["scenario"], j["metric"]): j for j in json.loads(report.read_text())["judgements"]}
    return code, judged


def test_a_slower_serving_step_is_regressed_on_p50_and_p90_and_fails_the_job(repo, tmp_path, capsys):
    code, judged = ab(tmp_path, "HEAD~1", "HEAD", ["--alpha", "0.05", "--ab-max-blocks", "5"], "-k", "service")
    out = capsys.readouterr()
    assert code == 1, out.out + out.err
    throughput, p90 = judged[("test_service[cpu-naive]", "throughput")], judged[("test_service[cpu-naive]", "p90")]
    assert throughput["verdict"] != "regressed", throughput  # both arms answer 40 requests/s: the latency fails it
    assert p90["verdict"] == "regressed" and p90["change"] > 0.5 and p90["blocks"] == 5, p90
    baseline_ms, candidate_ms = p90["ms"]
    assert 2 <= baseline_ms < candidate_ms and 10 <= candidate_ms, p90
    p50 = judged[("test_service[cpu-naive]", "p50")]  # every request is slower: the median too
    assert p50["verdict"] == "regressed" and p50["change"] > 1, p50
    p99 = judged[("test_service[cpu-naive]", "p99")]  # 3 windows of 0.5 s at 40/s: 60 requests, too few for p99
    assert p99["verdict"] == "inconclusive" and "too few for p99 in 5 of 5 blocks (200 needed)" in p99["reason"], p99
    assert "test_service[cpu-naive]: the service got slower (p50 +" in out.out, out.out
    row = next(line for line in out.out.splitlines() if " p50 " in line)
    assert "test_service[cpu-naive]" in row and "regressed" in row and " ms " in row, out.out


def test_a_service_saturated_in_both_arms_is_not_judged_on_p99(repo, tmp_path, capsys):
    """Both arms flooded (an A/A of a rate neither serves): their p99s measure queues, so neither is judged, and the
    row says why. (An A/A at a rate the service keeps up with is the unit tests' part: on a busy 2-core machine the
    two arms' services share cores, which no GPU runner has.)"""
    code, judged = ab(tmp_path, "HEAD", "HEAD", ["--ab-min-blocks", "2", "--ab-max-blocks", "2"], "-k", "flooded")
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    flooded = judged[("test_flooded[cpu-naive]", "latency")]
    assert flooded["verdict"] == "inconclusive" and flooded["saturated"] and flooded["change"] is None, flooded
    assert "latency not judged" in flooded["reason"] and "requests still queued" in flooded["reason"], flooded
    # said after the first block, not once the budget is spent: two blocks can never judge a latency
    said = out.out + out.err
    assert "test_flooded[cpu-naive]: about 2 blocks fit (a block took" in said, said
    assert "--ab-max-blocks 2), and a latency verdict needs" in said, said


def window(ms, backlog=0, offered_rps=100.0, requests=100, stalls=0, stall_ms=0.0):
    """One window of a service as an arm sends it: ``requests`` of ``ms`` each, ``stalls`` of them ``stall_ms``."""
    histogram = serving.new_histogram()
    for i in range(requests):
        serving.record(histogram, (stall_ms if i < stalls else ms) / 1000)
    return {"histogram": histogram.encode().decode("ascii"), "backlog": backlog, "offered_rps": offered_rps}


def latency(blocks, threshold=0.1, alpha=0.05):
    return {j.metric: j for j in ab_judge.judge_latency("s", blocks, ("baseline", "candidate"), threshold, alpha)}


@pytest.mark.parametrize("candidate_ms, verdict", [([4.0, 4.2, 3.9, 4.1, 4.0], "regressed"),
                                                   ([1.0, 1.05, 0.98, 1.0, 1.02], "improved"),
                                                   ([2.0, 2.01, 1.99, 2.0, 2.0], "unchanged")])
def test_latency_is_lower_is_better(candidate_ms, verdict):
    blocks = [{"baseline": [window(2.0)] * 2, "candidate": [window(ms)] * 2} for ms in candidate_ms]
    judged = latency(blocks)
    assert set(judged) == {"p50", "p90", "p99"}  # 200 requests a block: 2 beyond p99, none beyond p99.9
    for metric in judged:
        assert judged[metric].verdict == verdict and judged[metric].blocks == 5 and judged[metric].pairs == 10
        assert judged[metric].ms[0] == pytest.approx(2.0, rel=0.01)


def test_one_stalled_block_does_not_decide():
    """Eleven blocks where the candidate rose 20%, one where the baseline stalled (5x): a tail, judged by signs, still
    regressed, as a t test on the blocks' mean log-ratio is not; the median, judged by signed ranks, gives the
    stalled block the top rank and stays inconclusive (p 0.017), never a wrong verdict."""
    blocks = [{"baseline": [window(2.0)] * 2, "candidate": [window(2.4 + 0.01 * i)] * 2} for i in range(11)]
    blocks.insert(4, {"baseline": [window(10.0)] * 2, "candidate": [window(2.4)] * 2})
    judged = latency(blocks, threshold=0.02, alpha=0.005)
    for tail in ("p90", "p99"):
        assert judged[tail].verdict == "regressed" and judged[tail].change == pytest.approx(0.22, abs=0.01), judged
        assert ab_judge.judge("s", judged[tail].log_ratios, 0.02, 0.005, lower_is_better=True).verdict == "inconclusive"
    assert judged["p50"].verdict == "inconclusive" and judged["p50"].p_slower == pytest.approx(0.017, abs=0.001)
    assert judged["p50"].change == pytest.approx(0.22, abs=0.01)  # the estimate is not moved by the stalled block


def test_a_rare_stall_is_a_tail_regression_not_a_median_one():
    """2% of the candidate's requests take 20 ms: p99 regressed, p50 unchanged."""
    blocks = [{"baseline": [window(2.0 + 0.001 * i, requests=250)],
               "candidate": [window(2.0 + 0.001 * i, requests=250, stalls=5, stall_ms=20.0)]} for i in range(10)]
    judged = latency(blocks, threshold=0.02, alpha=0.005)
    assert judged["p99"].verdict == "regressed" and judged["p99"].change > 5, judged["p99"]
    assert judged["p50"].verdict == "unchanged", judged["p50"]
    assert ab_judge.in_words(list(judged.values())) == [
        f"s: only its tail got worse (p99 {judged['p99'].change:+.1%}); the median unchanged "
        f"(p50 {judged['p50'].change:+.1%})"]


def test_too_few_blocks_say_so_instead_of_a_number():
    """Every block holds requests enough for p99 (255 an arm, as a live A/B's 5 windows at 50/s): its tail is
    short of blocks, not of requests, and says so (a GPU run once read "too few for p99 in 0 of 6 blocks")."""
    blocks = [{"baseline": [window(2.0, requests=255)], "candidate": [window(2.2, requests=255)]}] * 4
    judged = latency(blocks, threshold=0.02, alpha=0.005)
    for metric in ("p50", "p90", "p99"):
        assert judged[metric].verdict == "inconclusive" and judged[metric].ci is None, judged[metric]
        assert judged[metric].detectable is None and not judged[metric].final, judged[metric]
        assert "4 blocks cannot resolve a change at this alpha (8 needed); 4 of 4 rose" in judged[metric].reason
    assert judged["p99"].change == pytest.approx(0.1, abs=0.01)
    # the sentence says the blocks were too few, not that nothing moved (a 3x slower service once read "no latency
    # moved beyond what 2 blocks resolve (p50 +226.0%, ...)")
    said = ab_judge.in_words(list(judged.values()))[0]
    assert said.startswith("s: 4 blocks: too few for any latency verdict at this alpha (p50 +10.1%, p99 +10.1%)"), said


def test_a_queue_that_grew_in_either_arm_is_not_judged_on_latency():
    """100 requests/s: 25 left queued at a window's end is 0.25 s of arrivals, the most a service may leave."""
    blocks = [{"baseline": [window(2.0, backlog=25)], "candidate": [window(9.0)]}] * 5
    assert latency(blocks)["p50"].verdict == "regressed"
    blocks[1] = {"baseline": [window(2.0)], "candidate": [window(9.0), window(900.0, backlog=26)]}
    judged = latency(blocks)["latency"]
    assert judged.verdict == "inconclusive" and judged.saturated and judged.change is None
    assert "the candidate's service saturated in block 2, 26 requests still queued" in judged.reason
    # its queue grew in most blocks, the baseline's never: it can no longer keep up with the rate
    slower = [{"baseline": [window(2.0)], "candidate": [window(900.0, backlog=40)]}] * 3
    judged = latency(slower)["latency"]
    assert judged.verdict == "regressed" and "saturated in 3 of 3 blocks" in judged.reason


def test_one_short_block_does_not_hide_the_tail_of_the_others():
    """Block 1 ended early (150 requests an arm); in the other eleven 2% of the candidate's requests take 40 ms: p99
    is judged over the blocks that resolve it, and regressed."""
    blocks = [{"baseline": [window(2.0, requests=150)], "candidate": [window(2.0, requests=150)]}]
    blocks += [{"baseline": [window(2.0 + 0.001 * i, requests=1000)],
                "candidate": [window(2.0 + 0.001 * i, requests=1000, stalls=20, stall_ms=40.0)]} for i in range(11)]
    judged = latency(blocks, threshold=0.02, alpha=0.005)
    assert judged["p99"].verdict == "regressed" and judged["p99"].blocks == 11, judged["p99"]
    assert ab_judge.in_words(list(judged.values()))[0].startswith("s: only its tail got worse (p99 +")


def test_a_p99_without_requests_enough_is_final_and_the_sentence_names_the_p90_that_moved():
    blocks = [{"baseline": [window(2.0, requests=60)],
               "candidate": [window(2.0, requests=60, stalls=8, stall_ms=30.0)]} for _ in range(10)]
    judged = latency(blocks, threshold=0.02, alpha=0.005)
    assert judged["p90"].verdict == "regressed" and judged["p99"].final and judged["p99"].verdict == "inconclusive"
    assert "only its tail got worse (p90 +" in ab_judge.in_words(list(judged.values()))[0]


def test_an_ab_that_looks_after_every_block_judges_each_look_at_the_alpha_that_keeps_its_own():
    """Eight blocks, all rose 10%: judged once, regressed (p 2^-8 < 0.005); by an A/B that may look after each of up to
    12 blocks, each look at the per-look alpha (shift.per_look_alpha): nine blocks needed."""
    blocks = [{"baseline": [window(2.0)] * 2, "candidate": [window(2.2 + 0.001 * i)] * 2} for i in range(8)]
    once = {j.metric: j for j in ab_judge.judge_latency("s", blocks, ("baseline", "candidate"), 0.02, 0.005)}
    looked = {j.metric: j for j in ab_judge.judge_latency("s", blocks, ("baseline", "candidate"), 0.02, 0.005,
                                                          looks=12)}
    assert once["p50"].verdict == "regressed"
    assert looked["p50"].verdict == "inconclusive" and "(9 needed); 8 of 8 rose" in looked["p50"].reason
    blocks.append(blocks[0])
    ninth = {j.metric: j for j in ab_judge.judge_latency("s", blocks, ("baseline", "candidate"), 0.02, 0.005,
                                                         looks=12)}
    assert ninth["p50"].verdict == "regressed" and ninth["p99"].verdict == "regressed"
