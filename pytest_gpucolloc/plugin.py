"""pytest-gpucolloc's entry point (``pytest11``): options, markers, fixtures. The run-level work is
``session.CollocSession``, registered here as a plugin; one scenario's path is ``fixture.CollocateFixture``."""
from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from . import benchmark_api, markers
from .device import make_target, release, selected_gpus
from .fixture import CollocateFixture, diagnostics_key
from .modes import MODES
from .mps_daemon import MpsDaemon
from .options import add_options, any_given, read_options
from .session import CollocSession
from .signals import signals_deferred
from .summary import Summary
from .table_fit import terminal_width, wrapped

session_key = pytest.StashKey[CollocSession]()


def pytest_addoption(parser):
    add_options(parser)


@pytest.hookimpl(tryfirst=True)  # before pytest-benchmark's, which compares the saved run's machine info with ours
def pytest_configure(config):
    for line in markers.DECLARED:
        config.addinivalue_line("markers", line)
    try:
        options = read_options(config)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    session = CollocSession(config, options)
    config.stash[session_key] = session
    config.pluginmanager.register(session, "gpucolloc-session")
    config.pluginmanager.register(Summary(session), "gpucolloc-summary")
    session.check_storage(any_given(config))
    session.save_when_gated()
    session.compare_with_history()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """Invited by an option, the session starts once every plugin is configured (it needs pytest-benchmark's
    storage), before the report header and xdist's workers; otherwise a collected test invites it."""
    if any_given(session.config):
        session.config.stash[session_key].invite()


def pytest_unconfigure(config):
    session = config.stash.get(session_key, None)
    if session is not None:
        session.stop()
        config.pluginmanager.unregister(session)
        config.pluginmanager.unregister(name="gpucolloc-summary")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session):
    """SIGTERM or Ctrl-C while the session ends (pytest-benchmark saving the run, the summary) waits for its end:
    it had cut the save short, losing the run, in a traceback. Said in one line; pytest's exit code 2."""
    own = session.config.stash.get(session_key, None)
    if own is None or not own.invited:
        return (yield)
    with signals_deferred() as arrived:
        result = yield
    if arrived:
        saved = f" (the run saved whole: {own.saved[-1]})" if own.saved else ""
        pytest.exit(f"{arrived[0]} arrived as the session ended: stopped once its end was done{saved}",
                    pytest.ExitCode.INTERRUPTED)
    return result


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one xdist worker per selected GPU, answered before xdist's own (the CPU count) and before
    pytest_configure, so the options are read here."""
    if not any_given(config) or os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # another project's -n auto, or the user's own count: not ours to answer
    try:
        options = read_options(config)
        return None if options.colloc_device == "cpu" else len(selected_gpus(options.colloc_gpus)) or None
    except ValueError:
        return None  # pytest_configure reports the usage error


def pytest_generate_tests(metafunc):
    if "gpu_mode" in metafunc.fixturenames:
        session = metafunc.config.stash[session_key]
        # CPU smoke runs carry their own ids, so their results never share a name (or a history) with a GPU's
        prefix = "cpu-" if session.device().gpu is None else ""
        metafunc.parametrize("gpu_mode", session.modes, ids=[prefix + m for m in session.modes], indirect=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    diagnostics = item.stash.get(diagnostics_key, "")
    if rep.failed and diagnostics:
        rep.sections.append(("gpucolloc diagnostics", diagnostics))
    if rep.skipped and "collocate" in getattr(item, "fixturenames", ()) and isinstance(rep.longrepr, tuple):
        item.config.stash[session_key].skipped.append((item.name, str(rep.longrepr[2]).removeprefix("Skipped: ")))
    return rep


@pytest.fixture
def gpu_mode(request) -> str:
    """Name of the sharing mode this test runs under (parametrised from --gpu-mode)."""
    return getattr(request, "param", request.config.stash[session_key].modes[0])


@pytest.fixture
def collocate(request, gpu_mode, benchmark, tmp_path) -> Iterator[CollocateFixture]:
    """``collocate([Workload("resnet26", batch_size=128)] * 2)`` runs workloads together under the test's sharing
    mode, measures, records into ``benchmark`` and returns a ``ScenarioResult``."""
    fixture = CollocateFixture(request.config.stash[session_key], request.node, gpu_mode, benchmark, tmp_path)
    yield fixture
    if fixture.used and benchmark_api.disabled_by_user(request.config):
        benchmark_api.mark_used(benchmark, "--benchmark-disable: not recorded")


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, config):
    session = config.stash.get(session_key, None)
    ran = len(session.results) + len(session.forwarded) if session is not None and session.invited else 0
    if ran and benchmark_api.disabled_by_user(config):
        terminalreporter.write_line(wrapped(
            f"gpucolloc: --benchmark-disable: {ran} scenario(s) ran as tests and were measured, but nothing was "
            "recorded into pytest-benchmark (nothing saved or compared); --benchmark-skip skips them instead",
            terminal_width()))


@pytest.fixture
def mps_daemon(request):
    """A private, running MPS control daemon for the selected GPU, stopped after the test (``client_env()``: a
    client's environment; ``clients()``, ``servers()``, ``control(cmd)``, ``set_default`` and ``log_tail()``)."""
    session = request.config.stash[session_key]
    target = make_target(session.device(), session.mode_options())
    try:
        reason = MODES["mps"]().unavailable_reason(target)
        if reason:
            pytest.skip(f"mps_daemon: {reason}")
        with MpsDaemon(target.scratch / "mps", target.gpu.uuid) as daemon:
            daemon.start()
            yield daemon
    finally:
        release(target)
