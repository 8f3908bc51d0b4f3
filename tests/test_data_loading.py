"""Data-loader workloads on the CPU, for real: JPEG images decoded and augmented by DataLoader worker processes,
the time the training process waited for them, the cores each job got, and nothing left behind."""
import multiprocessing

import pytest
import torch

from processes import left_behind
from pytest_gpucolloc import Workload, record, report
from pytest_gpucolloc.device import standalone_target
from pytest_gpucolloc.image_data import JpegImages, LoaderFeed
from pytest_gpucolloc.modes.naive import NaiveMode
from pytest_gpucolloc.scenario import Settings, run_scenario
from test_workers import FAST

SMOKE = Settings(rounds=2, round_s=0.3, warmup_s=0.2, warmup_steps=2, timeout_s=120, image_size=32, batch_cap=4)


@pytest.fixture
def cpu_target():
    with standalone_target("cpu") as target:
        yield target


def assert_nothing_left(result):
    """Once the scenario has returned, none of its workers runs, nor any process they started (the loaders).
    Only this scenario's processes are looked at: another pytest session may be running workers meanwhile."""
    workers = [worker.ready.pid for worker in result.workers]
    assert left_behind(workers) == [], "a worker or its loader outlived its scenario"


def test_images_are_decoded_and_augmented_afresh_for_every_sample():
    images = JpegImages(crop=32, num_classes=10, count=8)
    assert all(img[:2] == b"\xff\xd8" for img in images.images)  # JPEG bytes in memory
    first, label = images[3]
    again, _ = images[3]
    assert first.shape == (3, 32, 32) and first.dtype == torch.float32 and 0 <= label < 10
    assert not torch.equal(first, again)  # a new random crop and flip each time
    assert -3 < first.mean() < 3  # normalised


def test_the_feed_copies_batches_from_loader_processes_and_counts_the_wait():
    feed = LoaderFeed(crop=32, num_classes=10, batch_size=4, workers=2, device=torch.device("cpu"))
    images, labels = torch.zeros(4, 3, 32, 32), torch.zeros(4, dtype=torch.long)
    feed.next_into(images, labels)
    assert len(multiprocessing.active_children()) == 2  # the DataLoader's worker processes
    assert images.abs().sum() > 0 and feed.wait_s > 0  # the first batch is always waited for
    before = images.clone()
    feed.next_into(images, labels)
    assert not torch.equal(before, images)


def test_a_loader_job_trains_for_real_in_cpu_smoke_mode_and_says_how_long_it_waited(cpu_target, tmp_path):
    job = Workload("resnet50-imagenet64", batch_size=128, data="loader", loader_workers=2)
    result = run_scenario([job, job], NaiveMode(), cpu_target, SMOKE, tmp_path)
    assert_nothing_left(result)
    saved = record.read(record.write(result))
    assert saved.workloads == ("resnet50-imagenet64/bs4/loader2",) * 2  # the batch it really used
    for worker in saved.workers:
        assert worker.throughput > 0 and 0 <= worker.data_wait_share < 1
    assert "want 6 cores" in saved.cpu_affinity or "core(s) per worker" in saved.cpu_affinity
    row = report.rows([("test_x", saved)])[0]
    assert row[report.HEADERS.index("data wait")].count("%") == 2


def test_a_user_workload_with_its_own_loader_processes_trains(cpu_target, tmp_path):
    """A process the job forks closes its inherited stdin at start: the worker must not hold that lock."""
    job = Workload("tests.user_workloads:own_loader", batch_size=4)
    result = run_scenario([job], NaiveMode(), cpu_target, FAST, tmp_path)
    assert_nothing_left(result)
    assert result.workers[0].stats.throughput > 0 and result.workers[0].data_wait_share is None


def test_a_synthetic_job_has_no_data_wait(cpu_target, tmp_path):
    result = run_scenario([Workload("resnet26-cifar10", batch_size=4)], NaiveMode(), cpu_target, SMOKE, tmp_path)
    assert_nothing_left(result)
    saved = record.read(record.write(result))
    assert saved.workers[0].data_wait_share is None
    assert report.rows([("test_x", saved)])[0][report.HEADERS.index("data wait")] == "-"
