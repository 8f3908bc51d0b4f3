"""How the project's own tests run: in parallel (pytest-xdist) unless told otherwise.

Most of the suite's time is spent waiting on real worker processes (warm-up, measurement rounds of fixed length,
timeouts, signals), not computing, so xdist workers side by side finish it sooner on CI's 2 cores (measured on such a
machine: 22 minutes serial, 15.6 with two workers, 14.2 with three, 12.8 with the start-up cut below; later, with
workers that start without importing torchvision, 5.9 minutes with three and 5.2 with four). This file
is read only when tests/ is what pytest runs (the README's `pytest`, `pytest tests/...`), never by `pytest
benchmarks/`, whose measurements must run one at a time. Where an NVIDIA GPU is present the suite stays serial:
its GPU tier measures the GPU, and tests run side by side would share it.
"""
import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

import pytest

WORKERS = 4  # twice CI's cores: while some wait on their workers' fixed-length rounds, the others compute


@pytest.hookimpl(tryfirst=True)  # before xdist's own pytest_cmdline_main, which turns -n into workers
def pytest_cmdline_main(config):
    option = config.option
    if hasattr(config, "workerinput"):
        return  # an xdist worker: it runs its tests itself
    if getattr(option, "numprocesses", 0) is None and option.dist == "no" and not option.tx \
            and not option.collectonly and not option.usepdb and not Path("/dev/nvidiactl").exists():
        option.numprocesses = WORKERS  # no -n, --dist or --tx given, and no NVIDIA driver: ours
        option.dist = "worksteal"  # the tests take from a second to a minute: an idle worker takes a waiting one


@pytest.hookimpl(trylast=True)  # after pytest's terminal reporter is set up: its width is kept below
def pytest_configure(config):
    if getattr(config, "workerinput", None) is not None or config.getoption("dist", "no") == "no":
        # Every pytest the tests start (pytester's, an A/B's arms, the studies') is a user's run of the plugin:
        # hypothesis's pytest plugin, installed for this suite's own property tests, is no part of it, and loading
        # it is half of each one's start-up (1.4 of 2.8 s of CPU), a few minutes over the suite.
        os.environ["PYTEST_ADDOPTS"] = f"{os.environ.get('PYTEST_ADDOPTS', '')} -p no:hypothesispytest".strip()
        # A machine that says PYTHONDONTWRITEBYTECODE (CI's does) has each of those processes compile the package
        # and rewrite pytest's plugins afresh: about 0.5 s of CPU for every pytest and fork server started.
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        # The tests read the plugin's messages whole, line by line: a terminal wide enough that none wraps (xdist's
        # workers would say 80 columns, a log 120). The tests of fitting and wrapping set COLUMNS themselves. This
        # session's own output keeps the width it has.
        writer = config.get_terminal_writer()
        writer.fullwidth = writer.fullwidth
        os.environ["COLUMNS"] = "1000"
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        # An xdist worker's environment says it is one (PYTEST_XDIST_WORKER, ...): pytest-benchmark then turns
        # itself off, and every pytest the tests start (pytester's, an A/B's arms) would inherit that. The tests
        # run pytest as a user does, outside any xdist worker.
        for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
            os.environ.pop(name, None)
        # the run's temporary folder, shared by its xdist workers (each has a folder of its own in it)
        config.stash[_LOCK_PATH] = Path(config.option.basetemp).parent / "alone.lock"


_LOCK_PATH = pytest.StashKey[Path]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test marked ``alone`` runs with no other test beside it (in another xdist worker), set-up and teardown
    included; the others run side by side."""
    path = item.config.stash.get(_LOCK_PATH, None)
    if path is None:  # not under xdist: every test runs alone
        return (yield)
    with _turn(path, alone=item.get_closest_marker("alone") is not None):
        return (yield)


@contextmanager
def _turn(path: Path, alone: bool):
    """A readers-writer lock over xdist's workers: a test that must run alone waits for the running ones to end,
    and, holding the gate while it waits, keeps new ones from starting meanwhile."""
    with open(f"{path}.gate", "a") as gate, open(f"{path}.run", "a") as run:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(run, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(run, fcntl.LOCK_UN)
