"""pytest hooks and fixtures of pytest-gpucolloc (registered through the ``pytest11`` entry point)."""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Callable, Iterable

import pytest

from . import distributed, machine, measure, report, telemetry
from .modes import MODES, ModeConfigError, SharingMode
from .mig.provision import MigError, MigUnavailable
from .modes.sequential import SequentialMode
from .mps import MpsDaemon, MpsError
from .options import add_options, read_options
from .scenario import ScenarioFailed, ScenarioResult, run_scenario
from .session import CollocSession, DeviceUnavailable, clean_stale_scratch
from .workloads import Workload, WorkloadError, as_workload

session_key = pytest.StashKey[CollocSession]()
diagnostics_key = pytest.StashKey[str]()
_previous_sigterm = pytest.StashKey[object]()
MODE_ORDER = list(MODES)  # sequential first: its results are the baselines of the other modes


def pytest_addoption(parser):
    add_options(parser)


def _sigterm_as_interrupt(signum, frame):
    # pytest ignores SIGTERM by default; turn it into Ctrl-C so every cleanup path runs.
    raise KeyboardInterrupt("SIGTERM")


@pytest.hookimpl(trylast=True)  # after pytest-benchmark has set up its session and storage
def pytest_configure(config):
    config.addinivalue_line("markers", "quick: scenario of the quick tier (also run in CPU smoke mode)")
    config.addinivalue_line("markers", "gpu: test needs a real NVIDIA GPU; skipped with the reason without one")
    config.addinivalue_line("markers", "mig_layout(layout): MIG layout of this scenario, e.g. '3g,2g,1g*2'")
    config.addinivalue_line("markers", "colloc_gate(threshold=PERCENT): this scenario's regression threshold")
    try:
        values = read_options(config)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    session = config.stash[session_key] = CollocSession(values)
    session.worker = distributed.worker_index(config)
    if session.worker is None:  # the controller cleans up; workers start after it
        session.stale_removed = clean_stale_scratch()
    if distributed.is_controller_of_workers(config) and values["colloc_device"] != "cpu":
        try:
            distributed.check_workers_per_gpu(config.getoption("numprocesses") or 0,
                                              distributed.selected_gpus(values["colloc_gpus"]))
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    if values["colloc_device"] == "cuda":
        try:
            config.stash[session_key].placement()
        except DeviceUnavailable as exc:
            raise pytest.UsageError(str(exc)) from None
    if session.worker is None:
        _check_storage_is_writable(config)
        benchmarks = getattr(config, "_benchmarksession", None)
        if benchmarks is not None and getattr(benchmarks, "storage", None) is not None:
            from .history import guard_saving

            guard_saving(benchmarks.storage, session.save_problems)
    try:
        config.stash[_previous_sigterm] = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    except ValueError:  # not the main thread
        pass


def _check_storage_is_writable(config) -> None:
    """A run that would save must be able to: say so before any GPU time is spent, not after."""
    import os

    from .history import storage_path

    saving = config.getoption("benchmark_autosave", False) or config.getoption("benchmark_save", None)
    folders = []
    if saving:
        root = storage_path(config.getoption("benchmark_storage", None))
        if root is not None:
            folders.append(("--benchmark-storage", root))
    report_path = config.stash[session_key].values["colloc_gate_report"]
    if report_path:
        folders.append(("--colloc-gate-report", Path(report_path).resolve().parent))
    for option, folder in folders:
        existing = next((p for p in [folder, *folder.parents] if p.exists()), None)
        if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            raise pytest.UsageError(f"{option}: {folder} is not writable, so nothing measured could be saved; "
                                    "fix its permissions or choose another folder")


def pytest_unconfigure(config):
    previous = config.stash.get(_previous_sigterm, None)
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def _session(config) -> CollocSession:
    return config.stash[session_key]


def pytest_sessionstart(session):
    colloc = session.config.stash.get(session_key, None)
    if colloc is None or not colloc.values["colloc_gate"]:
        return
    from . import history  # scipy and the storage reader load only when the gate is on

    root = history.storage_path(session.config.getoption("benchmark_storage", None))
    if root is None:
        raise pytest.UsageError("--colloc-gate reads file storage only (--benchmark-storage=file://...)")
    colloc.history = history.load(root)  # before this run saves anything


def _gate_policy(session: CollocSession, node):
    from . import gate

    threshold = session.values["colloc_gate_threshold"]
    marker = node.get_closest_marker("colloc_gate")
    if marker and "threshold" in marker.kwargs:
        threshold = marker.kwargs["threshold"]
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 100:
            pytest.fail(f"colloc_gate(threshold=...) must be a percentage between 0 and 100, got {threshold!r}",
                        pytrace=False)
    return gate.Policy(threshold=threshold / 100, alpha=session.values["colloc_gate_alpha"],
                       runs=session.values["colloc_gate_runs"], min_runs=session.values["colloc_gate_min_runs"])


def _judge(session: CollocSession, node, result: ScenarioResult) -> dict:
    from . import gate

    placement = session.placement()
    current = gate.RunSample("current", tuple(result.aggregate_rounds), placement.gpu.name if placement.gpu else None,
                             placement.gpu.uuid if placement.gpu else None, result.throttled,
                             contaminated=bool(result.foreign_pids))
    verdict = gate.decide(current, session.history.samples(node.nodeid), _gate_policy(session, node)).to_dict()
    session.verdicts.append((node.name, verdict))
    return verdict


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    session = config.stash.get(session_key, None)
    if session is None or session.values["colloc_device"] == "cpu":
        return None
    gpus = distributed.selected_gpus(session.values["colloc_gpus"])
    return len(gpus) or None  # -n auto: one worker per selected GPU


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    session = node.config.stash.get(session_key, None)
    if session is None:
        return
    for entry in distributed.receive(node):
        distributed.add_to_benchmark_session(node.config, entry)
        session.forwarded.append((entry["name"], entry["extra_info"]))
        if entry["extra_info"].get("gate"):
            session.verdicts.append((entry["name"], entry["extra_info"]["gate"]))


def pytest_sessionfinish(session, exitstatus):
    colloc = session.config.stash.get(session_key, None)
    if colloc is None:
        return
    if colloc.worker is not None:
        distributed.publish(session.config, colloc.forward)
    failed = colloc.save_problems or any(v["verdict"] == "regressed" for _, v in colloc.verdicts)
    if failed and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_report_header(config):
    session = _session(config)
    try:
        where = session.placement().reason
    except DeviceUnavailable as exc:
        where = str(exc)
    lines = [f"gpucolloc: modes {', '.join(session.modes)}; {where}"]
    if session.stale_removed:
        lines.append(f"gpucolloc: removed {len(session.stale_removed)} directories (and their MPS daemons) left "
                     f"by killed runs: {', '.join(session.stale_removed)}")
    return lines


def pytest_generate_tests(metafunc):
    if "gpu_mode" in metafunc.fixturenames:
        modes = _session(metafunc.config).modes
        metafunc.parametrize("gpu_mode", modes, ids=modes, indirect=True)


def pytest_collection_modifyitems(config, items):
    def mode_rank(item) -> int:
        mode = getattr(item, "callspec", None) and item.callspec.params.get("gpu_mode")
        return MODE_ORDER.index(mode) if mode in MODE_ORDER else -1

    items.sort(key=mode_rank)  # stable: the file order is kept within a mode


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu"):
        placement = _session(item.config).placement()
        if placement.gpu is None:
            pytest.skip(f"needs an NVIDIA GPU: {placement.reason}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    diagnostics = item.stash.get(diagnostics_key, "")
    if rep.failed and diagnostics:
        rep.sections.append(("gpucolloc diagnostics", diagnostics))
    return rep


@pytest.fixture
def gpu_mode(request) -> str:
    """Name of the sharing mode this test runs under (parametrised from --gpu-mode)."""
    return getattr(request, "param", _session(request.config).modes[0])


def _record(benchmark, result: ScenarioResult, session: CollocSession) -> None:
    """Store the scenario in pytest-benchmark: timing = seconds per sample of aggregate throughput per
    round (so --benchmark-compare-fail sees a throughput loss), throughput numbers in extra_info.
    An xdist worker's pytest-benchmark is off: the controller records it (distributed.py)."""
    benchmark.extra_info.update(result.extra_info())
    seconds = measure.seconds_per_sample(result.aggregate_rounds)
    if benchmark.disabled:
        if session.worker is not None:
            session.forward.append(distributed.forwarded_entry(benchmark, seconds))
            benchmark._mode = "pytest-gpucolloc (recorded by the xdist controller)"
        return
    stats = benchmark._make_stats(1)
    for value in seconds:
        stats.update(value)
    benchmark._mode = "pytest-gpucolloc"


@pytest.fixture
def collocate(request, gpu_mode, benchmark, tmp_path) -> Callable[..., ScenarioResult]:
    """Run workloads together under the test's sharing mode, measure, and record into ``benchmark``.

    ``collocate([Workload("resnet26", batch_size=128)] * 2)`` returns a ``ScenarioResult``.
    """
    config = request.config
    session = _session(config)
    used = []

    def run(workloads: Iterable[Workload | str], *, ideal: bool | None = None) -> ScenarioResult:
        if used:
            raise RuntimeError("collocate can run one scenario per test (one benchmark record each)")
        used.append(True)
        try:
            jobs = [as_workload(w) for w in workloads]
        except WorkloadError as exc:
            pytest.fail(str(exc), pytrace=False)
        if not jobs:
            pytest.fail("collocate() needs at least one workload", pytrace=False)
        placement = session.placement()
        if placement.gpu is None and not request.node.get_closest_marker("quick") \
                and not session.values["colloc_cpu_full"]:
            pytest.skip(f"{placement.reason}: runs only the quick tier (marker 'quick'); "
                        "pass --colloc-cpu-full to run every scenario on the CPU")
        mode: SharingMode = MODES[gpu_mode]()
        settings = session.settings(config)
        target = session.new_target()
        marker = request.node.get_closest_marker("mig_layout")
        if marker:
            target.options["mig_layout"] = marker.args[0] if marker.args else None
        try:
            reason = mode.unavailable_reason(target)
            if reason:
                pytest.skip(f"{gpu_mode}: {reason}")
            sampler = telemetry.sampler_factory(target.gpu.uuid) \
                if target.gpu is not None and session.values["colloc_telemetry"] else None
            result = run_scenario(jobs, mode, target, settings, tmp_path, sampler)
            _add_baselines(session, result, settings, target, tmp_path,
                           ideal if ideal is not None else session.values["colloc_ideal"])
        except MigUnavailable as exc:
            if str(exc).startswith("does not fit"):
                session.unfit.append((request.node.name, str(exc)))
            pytest.skip(f"{gpu_mode}: {exc}")
        except (ModeConfigError, MpsError, MigError) as exc:
            pytest.fail(f"{gpu_mode}: {exc}", pytrace=False)
        except ScenarioFailed as exc:
            if exc.diagnostics:
                request.node.stash[diagnostics_key] = exc.diagnostics
            pytest.fail(f"{gpu_mode}: {exc}", pytrace=False)
        finally:
            session.release(target)
        if session.history is not None:
            result.info["gate"] = _judge(session, request.node, result)
        _record(benchmark, result, session)
        session.results.append((request.node.name, result))
        return result

    return run


def _add_baselines(session: CollocSession, result: ScenarioResult, settings, target, log_dir, want_ideal) -> None:
    device = session.device_key()
    if result.mode == SequentialMode.name:
        for worker in result.workers:
            session.alone[(worker.workload.key(), device)] = worker.stats.throughput
        result.speedup = 1.0
    else:
        alone = [session.alone.get((w.workload.key(), device)) for w in result.workers]
        result.speedup = measure.weighted_speedup([w.stats.throughput for w in result.workers], alone)
    if want_ideal and result.homogeneous:
        combined = result.workloads[0].with_batch_size(sum(w.batch_size for w in result.workloads))
        key = (combined.key(), device)
        if key not in session.ideal:
            ideal = run_scenario([combined], SequentialMode(), target, settings, log_dir)
            session.ideal[key] = ideal.aggregate_throughput
        result.ideal_throughput = session.ideal[key]


@pytest.fixture
def mps_daemon(request):
    """A private, running MPS control daemon for the selected GPU, stopped after the test.

    ``mps_daemon.client_env()`` is the environment a client process needs; ``clients()``,
    ``servers()``, ``control(cmd)``, ``set_default(cmd, value)`` and ``log_tail()`` inspect it.
    """
    session = _session(request.config)
    target = session.new_target()
    try:
        reason = MODES["mps"]().unavailable_reason(target)
        if reason:
            pytest.skip(f"mps_daemon: {reason}")
        with MpsDaemon(target.scratch / "mps", target.gpu.uuid) as daemon:
            daemon.start()
            yield daemon
    finally:
        session.release(target)


def pytest_benchmark_update_machine_info(config, machine_info):
    session = config.stash.get(session_key, None)
    if session is None:
        return
    report_of_a_worker = session.results[0][1].workers[0].ready if session.results else None
    machine_info["gpucolloc"] = machine.identity(session.placement().gpu, report_of_a_worker)


def pytest_benchmark_compare_machine_info(config, benchmarksession, machine_info, compared_benchmark):
    saved = compared_benchmark.get("machine_info", {}).get("gpucolloc", {})
    current = machine_info.get("gpucolloc", {})
    changes = machine.differences(saved, current)
    if changes:
        benchmarksession.logger.warning("gpucolloc: compared run differs: " + "; ".join(changes))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    session = config.stash.get(session_key, None)
    for problem in session.save_problems if session else []:
        terminalreporter.write_line(f"gpucolloc: {problem}", red=True)
    if not session or not (session.results or session.unfit or session.forwarded):
        return
    terminalreporter.write_sep("-", "gpucolloc: collocation scenarios")
    placement = session.placement()
    terminalreporter.write_line(placement.reason)
    if placement.gpu is None:
        terminalreporter.write_line("telemetry sampler: off (no GPU)")
    elif not session.values["colloc_telemetry"]:
        terminalreporter.write_line("telemetry sampler: off (--colloc-telemetry=off)")
    entries = [(name, r.extra_info()) for name, r in session.results] + session.forwarded
    terminalreporter.write_line(report.table(entries))
    terminalreporter.write_line(
        "speedup: sum of each job's throughput relative to running alone (sequential, same session); "
        "CV: round-to-round spread of aggregate throughput"
    )
    for name, why in session.unfit:
        terminalreporter.write_line(f"{name}: {why}")
    if session.history is not None:
        _gate_summary(terminalreporter, config, session)


def _gate_summary(terminalreporter, config, session: CollocSession) -> None:
    regressed = [name for name, v in session.verdicts if v["verdict"] == "regressed"]
    terminalreporter.write_sep("-", f"gpucolloc gate: {len(regressed)} regressed of {len(session.verdicts)}")
    for problem in session.history.problems:
        terminalreporter.write_line(f"history: {problem}")
    terminalreporter.write_line(report.gate_table(session.verdicts))
    path = session.values["colloc_gate_report"]
    if path:
        try:
            Path(path).write_text(f"### Collocation regression gate\n\n{report.gate_table(session.verdicts, 'github')}\n")
        except OSError as error:
            terminalreporter.write_line(f"could not write the gate report to {path}: {error}", red=True)
