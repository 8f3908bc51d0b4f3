import pytest

from pytest_gpucolloc.cpu_affinity import CpuListError, CpuPolicy, assign_cpus, parse_cpu_policy


def test_auto_gives_disjoint_cores_and_keeps_one_for_the_controller():
    result = assign_cpus(3, CpuPolicy("auto"), available=list(range(16)))
    assert result.cpus == [(1, 2, 3, 4, 5), (6, 7, 8, 9, 10), (11, 12, 13, 14, 15)]
    flat = [c for s in result.cpus for c in s]
    assert len(flat) == len(set(flat)) and 0 not in flat


def test_never_two_workers_per_core_unless_asked():
    result = assign_cpus(7, CpuPolicy("auto"), available=[0, 1])
    assert result.cpus == [None] * 7
    assert "not pinned" in result.note


def test_exactly_enough_cores_uses_all_of_them():
    assert assign_cpus(2, CpuPolicy("auto"), available=[4, 5]).cpus == [(4,), (5,)]


def test_explicit_lists_may_overlap():
    policy = parse_cpu_policy("0-1;1,2")
    assert assign_cpus(2, policy, available=[0, 1, 2]).cpus == [(0, 1), (1, 2)]


def test_explicit_lists_must_cover_every_worker_and_exist():
    with pytest.raises(CpuListError, match="2 core lists for 3 workers"):
        assign_cpus(3, parse_cpu_policy("0;1"), available=[0, 1])
    with pytest.raises(CpuListError, match="may not use"):
        assign_cpus(1, parse_cpu_policy("7"), available=[0, 1])


@pytest.mark.parametrize("text", ["x", "3-1", "-1", "1;;2", "0-99999", "1,a", "$(reboot)"])
def test_malformed_lists(text):
    with pytest.raises(CpuListError):
        parse_cpu_policy(text)


def test_none_disables_pinning():
    assert assign_cpus(2, parse_cpu_policy("none"), available=[0, 1, 2]).cpus == [None, None]


def test_jobs_with_data_loaders_get_cores_in_proportion_to_their_loader_workers():
    result = assign_cpus(3, CpuPolicy("auto"), available=list(range(16)), wants=[5, 1, 1])
    assert [len(cores) for cores in result.cpus] == [10, 2, 2]
    flat = [c for s in result.cpus for c in s]
    assert len(flat) == len(set(flat)) and 0 not in flat
    assert "10, 2, 2 cores" in result.note and "share cores" not in result.note


def test_too_few_cores_for_the_loaders_is_said():
    result = assign_cpus(7, CpuPolicy("auto"), available=list(range(16)), wants=[5] * 7)
    assert result.cpus[0] == (1, 2)  # alike jobs: alike shares, still one per core
    assert "want 35 cores" in result.note and "only 15 can be given" in result.note
