"""One pytest session's collocation state (device, settings, baselines, verdicts, results), registered as a plugin
by ``plugin.py``, and the hooks that act on the whole run."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from . import (
    benchmark_api,
    distributed,
    forget,
    forkserver,
    gate,
    history,
    interleave,
    machine,
    machine_warmup,
    markers,
    preamble,
    process_marks,
    progress,
    report,
    telemetry,
    timings,
)
from .cpu_affinity import check_cores
from .device import DeviceChoice, DeviceUnavailable, detect, make_target, selected_gpus
from .machine_warmup import DEFAULT_LIMIT_S
from .modes.base import ModeOptions, Target
from .options import Config, DeviceConfig
from .scenario import ScenarioResult, Settings
from .scratch import can_write_in, clean_stale_scratch
from .signals import sigterm_as_interrupt

# CPU smoke mode: real processes and real training, small enough for a laptop or a CI runner.
CPU_IMAGE_SIZE = 32
CPU_BATCH_CAP = 4


@dataclass
class ScenarioContext:
    """What one scenario needs from its session, handed down in one piece."""

    settings: Settings
    target: Target
    sampler_factory: Callable | None  # NVML telemetry over the measurement window; None: off
    policy: Any  # gate.Policy when the run is gated, else None
    repeats: int = 1  # fresh-process repeats of the scenario


@dataclass
class Baselines:
    """Throughput measured earlier in the session, per (workload key, device key)."""

    alone: dict[tuple, ScenarioResult] = field(default_factory=dict)  # each distinct job alone, measured once
    ideal: dict[tuple, float] = field(default_factory=dict)  # one process training the summed batch
    one_job: dict[tuple, ScenarioResult] = field(default_factory=dict)  # (mode, ...): one-job scenarios measured


class CollocSession:
    def __init__(self, config, options: Config):
        self.config, self.options = config, options
        self.xdist_index = distributed.xdist_index(config)  # this xdist worker owns the index-th selected GPU
        self.results: list[tuple[str, ScenarioResult, gate.Verdict | None]] = []  # (test, result, gate verdict)
        self.skipped: list[tuple[str, str]] = []  # (scenario, why it was skipped): said in the summary
        self.verdicts: list[tuple[str, gate.Verdict]] = []  # (test, gate verdict): objects until saved or shown
        self.judged: list[tuple[str, gate.RunSample]] = []  # (test id, run) gated so far: they place this GPU's level
        self.measured_for_ab: list[str] = []  # gated run: node ids marked gpucolloc_gate(by="ab"), saved, not judged
        self.machine_warmup: machine_warmup.WarmUp | None = None  # once the GPU was warmed
        self.history: history.History | None = None  # loaded before this run saved anything
        self.stale_removed: list[str] = []
        self.orphans_killed: list[int] = []  # processes that workers of killed runs had started
        self.save_problems: list[str] = []  # runs that could not be saved, and where they went
        self.saved: list[Path] = []  # the run this session saved (pytest-benchmark saves at the session's end)
        self.forward: list[dict] = []  # scenarios an xdist worker sends to the controller
        self.forwarded: list[tuple[str, dict]] = []  # what the controller received
        self.baselines = Baselines()
        self.alone_measured: list[tuple[str, ScenarioResult]] = []  # (test that needed it, the job alone)
        self.rates_asked: dict[tuple, str] = {}  # serving job key -> how its rate was chosen
        self.seconds: dict[str, float] = {}  # test id -> how long its scenario took (kept for the next run's estimate)
        self._device: DeviceChoice | None = None
        self._settings: Settings | None = None
        self._on_stop = contextlib.ExitStack()
        self.invited = False  # a gpucolloc option was given, or a collected test uses the plugin
        self.deselected_full = 0  # scenarios of the full matrix left out (no --colloc-full)
        self.autosaved = False  # --colloc-gate turned on --benchmark-autosave

    # --- set-up and tear-down (called from plugin.py) ------------------------------------------------
    def invite(self, before_running: bool = True) -> None:
        """The plugin acts only where invited (docs/architecture.md: a guest in every session); then usage errors,
        clean-up after killed runs, and safe saving."""
        if self.invited:
            return
        self.invited = True
        if self.xdist_index is None:  # the controller cleans up; xdist workers start after it
            self.orphans_killed = process_marks.kill_orphans()  # first: named as such, not as in a scratch folder
            self.stale_removed = clean_stale_scratch()
        if before_running:
            self._check_usage()
        if self.xdist_index is None:
            if before_running:
                self._check_writable()
            storage = benchmark_api.file_storage(self.config)
            if storage is not None:
                benchmark_api.guard_saving(storage, self.save_problems, self.saved)
        # pytest ignores SIGTERM by default: as Ctrl-C, every cleanup path runs
        self._on_stop.enter_context(sigterm_as_interrupt())

    def save_when_gated(self) -> None:
        """A gated run is saved (``--benchmark-autosave``): the next ones' history. Before pytest-benchmark reads it."""
        if self.options.colloc_gate and self.xdist_index is None:
            self.autosaved = benchmark_api.autosave(self.config)

    def check_storage(self, invited: bool) -> None:
        """The gate reads only pytest-benchmark's file storage, and its elasticsearch backend without its client
        library ends pytest-benchmark's set-up in an internal error: usage errors first, before it reads its options."""
        given = self.config.getoption("benchmark_storage", None)
        if benchmark_api.storage_path(given) is not None:
            return
        supported = ("pytest-gpucolloc reads pytest-benchmark's file storage only (its default .benchmarks; "
                     "--benchmark-storage=file://PATH or a folder)")
        if self.options.colloc_gate and self.xdist_index is None:
            raise pytest.UsageError(f"--colloc-gate judges against saved runs, and --benchmark-storage={given} is "
                                    f"another backend of pytest-benchmark: {supported}; without --colloc-gate "
                                    "pytest-benchmark saves there as usual")
        if invited and benchmark_api.missing_storage_client(given):
            raise pytest.UsageError(f"--benchmark-storage={given}: pytest-benchmark's elasticsearch backend needs the "
                                    "elasticsearch package, which is not installed: pip install "
                                    f"'pytest-benchmark[elasticsearch]'; {supported}")

    def compare_with_history(self) -> None:
        """``--benchmark-compare`` without a run compares with the latest run of the history, not an A/B arm's, one
        set aside (by any of its files) or a copy of another. Called before pytest-benchmark reads the option."""
        config = self.config
        root = benchmark_api.storage_path(config.getoption("benchmark_storage", None))
        if config.getoption("benchmark_compare", None) is not True or root is None:
            return
        left_out = {run.path.resolve() for run, _ in history.load(root).left_out}  # indexed: thousands in a second
        for path in reversed(benchmark_api.latest_saved(root)):
            if path.resolve() not in left_out:  # a file not of this plugin too: pytest-benchmark reads it as it would
                config.option.benchmark_compare = str(path)
                return

    def _check_usage(self) -> None:
        config = self.config
        try:
            if distributed.is_controller_of_workers(config) and self.options.colloc_device != "cpu":
                distributed.check_workers_per_gpu(config.getoption("numprocesses") or 0,
                                                  selected_gpus(self.options.colloc_gpus))
            if self.options.colloc_device == "cuda":
                self.device()
            check_cores(self.options.colloc_cpus)
            if self.options.colloc_columns:
                report.columns(self.options.colloc_columns, report.COLUMNS, "--colloc-columns")
            if self.xdist_index is not None or not distributed.is_controller_of_workers(config):
                self.settings()  # device-dependent defaults checked against each other
            if self.options.colloc_gate:
                if self.options.colloc_gate_runs < self.options.colloc_gate_min_runs:
                    raise ValueError(f"--colloc-gate-runs ({self.options.colloc_gate_runs}) must be at least "
                                     f"--colloc-gate-min-runs ({self.options.colloc_gate_min_runs}): with fewer the "
                                     "gate could never judge")
                if (root := benchmark_api.storage_path(config.getoption("benchmark_storage", None))) is not None:
                    for listed in (forget.FILE, forget.ACCEPTED):  # a damaged list said now, not after measuring
                        forget.read_beside(root, listed)  # as the history reads them
        except (ValueError, DeviceUnavailable) as exc:
            raise pytest.UsageError(str(exc)) from None

    def stop(self) -> None:
        forkserver.close_shared()
        progress.stop()
        self._on_stop.close()

    def _check_writable(self) -> None:
        """A run that would save must be able to: say so before any GPU time is spent, not after."""
        config = self.config
        folders = []
        root = benchmark_api.storage_path(config.getoption("benchmark_storage", None))
        if root is not None and (config.getoption("benchmark_autosave", False)
                                 or config.getoption("benchmark_save", None)):
            folders.append(("--benchmark-storage", root))
        dump = config.getoption("benchmark_json", None)
        if dump is not None and root is not None and Path(dump).is_file() \
                and Path(dump).resolve().is_relative_to(Path(root).resolve()):
            raise pytest.UsageError(f"--benchmark-json={dump} is a saved run of --benchmark-storage: writing there "
                                    "would overwrite it; name a file outside the storage")
        # asked for on the command line without the gate: no report, an old one kept (an ini key is for gated runs)
        if config.getoption("colloc_gate_report") is not None and not self.options.colloc_gate:
            raise pytest.UsageError(f"--colloc-gate-report={self.options.colloc_gate_report} writes the gate's "
                                    "verdicts: add --colloc-gate")
        if self.options.colloc_gate_report and Path(self.options.colloc_gate_report).is_dir():
            raise pytest.UsageError(f"--colloc-gate-report={self.options.colloc_gate_report} is a folder: name the "
                                    "report's file, e.g. a gate.md in it")
        if self.options.colloc_gate_report:
            folders.append(("--colloc-gate-report", Path(self.options.colloc_gate_report).resolve().parent))
        for option, folder in folders:
            existing = next((p for p in [folder, *folder.parents] if p.exists()), None)
            if existing is None or not existing.is_dir() or not can_write_in(existing):
                raise pytest.UsageError(f"{option}: {folder} is not writable, so nothing measured could be saved; "
                                        "fix its permissions or choose another folder")

    # --- what scenarios get ----------------------------------------------------------------------------
    @property
    def modes(self) -> list[str]:
        return self.values.modes

    @functools.cached_property
    def values(self) -> DeviceConfig:
        """The options whose defaults depend on the device, filled in (GPU or CPU smoke mode)."""
        return self.options.for_device(self.device().device == "cuda")

    def device(self) -> DeviceChoice:
        if self._device is None:
            selector = self.options.colloc_gpu
            if self.xdist_index is not None and self.options.colloc_device != "cpu":
                gpus = selected_gpus(self.options.colloc_gpus)
                if gpus:
                    selector = gpus[self.xdist_index].uuid
            self._device = detect(self.options.colloc_device, selector)
            if self.xdist_index is not None:
                self._device.reason += f" (xdist worker gw{self.xdist_index})"
        return self._device

    def machine_kind(self) -> str:
        """What scenario times are kept per: the GPU model, or the CPU (smoke mode)."""
        gpu = self.device().gpu
        return gpu.name if gpu else "cpu"

    def settings(self) -> Settings:
        if self._settings is None:
            on_gpu = self.device().device == "cuda"
            values, options = self.values, self.options
            self._settings = Settings(
                rounds=values.rounds, max_rounds=values.max_rounds, precision=options.colloc_precision / 100,
                round_s=values.round_s, warmup_s=values.warmup_s, warmup_steps=values.warmup_steps,
                timeout_s=options.colloc_timeout, cpu_policy=options.colloc_cpus,
                image_size=None if on_gpu else CPU_IMAGE_SIZE, batch_cap=None if on_gpu else CPU_BATCH_CAP,
                extra_step_every=options.colloc_extra_step_every, spawn=options.colloc_spawn,
                cudnn=options.colloc_cudnn)
        return self._settings

    def mode_options(self) -> ModeOptions:
        return ModeOptions(**{f.name: getattr(self.options, f.name) for f in dataclasses.fields(ModeOptions)})

    def context(self, node) -> ScenarioContext:
        """A scenario's context; its target has a new scratch directory that the caller releases."""
        repeats = markers.repeats(node, self.options.colloc_repeats)
        options = self.mode_options()
        marker = node.get_closest_marker("gpucolloc_mig_layout")
        if marker:
            options = dataclasses.replace(options, mig_layout=marker.args[0] if marker.args else None)
        policy = markers.gate_policy(node, self.options) if self.history is not None else None
        gpu = self.device().gpu
        if gpu is not None and self.machine_warmup is None and self.machine_warmup_limit() > 0:  # once, first
            self.machine_warmup = machine_warmup.run(gpu.uuid, self.machine_warmup_limit())
        target = make_target(self.device(), options)
        sampler = telemetry.sampler_factory(target.gpu) \
            if target.gpu is not None and self.options.colloc_telemetry else None
        return ScenarioContext(self.settings(), target, sampler, policy, repeats)

    def machine_warmup_limit(self) -> float:
        """Seconds of warm-up before the session's first measurement: 0 on the CPU; auto is on when gating."""
        if self.device().gpu is None:
            return 0.0
        chosen = self.options.colloc_machine_warmup
        return (DEFAULT_LIMIT_S if self.options.colloc_gate else 0.0) if chosen is None else chosen

    # --- hooks ---------------------------------------------------------------------------------------
    def pytest_sessionstart(self, session):
        root = benchmark_api.storage_path(self.config.getoption("benchmark_storage", None))
        if self.options.colloc_gate and root is not None:  # None: refused before (check_storage)
            self.history = history.load(root)  # before this run saves anything

    def pytest_report_header(self, config):
        return preamble.header_lines(self, config) if self.invited else None  # invited by a test only

    def pytest_collection_modifyitems(self, config, items):
        ours = [item for item in items if markers.uses_plugin(item)]
        if not ours:
            return
        self.invite()
        if self.options.colloc_full or "gpucolloc_full" in (config.getoption("markexpr", "") or ""):
            return
        named = [arg for arg in config.args if "::" in arg]  # tests named one by one are asked for
        full = [item for item in ours if item.get_closest_marker("gpucolloc_full")
                and not any(item.nodeid == arg or item.nodeid.startswith((arg + "[", arg + "::"))
                            for arg in named)]
        if full:
            self.deselected_full = len(full)
            config.hook.pytest_deselected(items=full)
            items[:] = [item for item in items if item not in set(full)]

    def pytest_report_collectionfinish(self, config, start_path, items):
        """Before anything runs: how long the selected scenarios may take, and what was left out."""
        return preamble.collection_lines(self, config, items) if self.invited else None

    def pytest_runtest_setup(self, item):
        if item.get_closest_marker("gpucolloc_gate"):
            markers.left_to_ab(item)  # a misspelt marker fails here, before any skip could hide it
        if item.get_closest_marker("gpucolloc_gpu") and self.device().gpu is None:
            pytest.skip(f"needs an NVIDIA GPU: {self.device().reason}")

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        entries = distributed.receive(node)
        if entries:
            self.invite(before_running=False)  # an xdist controller collects nothing: its workers' scenarios invite it
        for entry in entries:
            benchmark_api.add_to_session(node.config, entry)
            self.forwarded.append((entry["name"], entry["extra_info"]))
            if entry["extra_info"].get("gate_by") == "ab" and self.history is not None:
                self.measured_for_ab.append(entry["fullname"])
            if entry["extra_info"].get("gate"):
                self.verdicts.append((entry["name"], gate.Verdict.from_dict(entry["extra_info"]["gate"])))

    def pytest_sessionfinish(self, session, exitstatus):
        if not self.invited:
            return
        if self.xdist_index is not None:
            distributed.publish(session.config, self.forward)
        elif self.seconds:  # scenarios ran: the device and settings are known
            timings.remember(session.config, self.machine_kind(), self.settings(), self.seconds)
        failed = self.save_problems or any(v.failed for _, v in self.verdicts)
        if failed and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        elif self.nothing_gated() and session.exitstatus == 0:  # a gate that judged nothing has not passed
            session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED

    def nothing_gated(self) -> bool:
        """A gated run (xdist: its controller) that judged no scenario: its exit code is pytest's 5, not a pass."""
        return self.history is not None and self.xdist_index is None and not self.verdicts

    @pytest.hookimpl(optionalhook=True)
    def pytest_benchmark_update_machine_info(self, config, machine_info):
        if not self.invited:
            return
        ready = self.results[0][1].workers[0].ready if self.results else None
        machine_info["gpucolloc"] = machine.identity(self.device().gpu, dataclasses.asdict(ready) if ready else None)
        arm = os.environ.get(interleave.ARM_ENV)
        if arm:  # what kind of run this is: an A/B arm's is never a run of the history (``history.experiment``)
            machine_info["gpucolloc"]["experiment"] = f"the {arm} arm of a paired A/B"
        if every := self.options.colloc_extra_step_every:  # in the history, judged, but no later run's baseline
            machine_info["gpucolloc"]["slowed"] = every

    @pytest.hookimpl(optionalhook=True, wrapper=True)
    def pytest_benchmark_compare_machine_info(self, config, benchmarksession, machine_info, compared_benchmark):
        """pytest-benchmark warns with both machine infos whole (thousands of characters; an INTERNALERROR when the
        storage is outside the working directory) whenever anything differs, volatile fields included. A run this
        plugin saved is compared here instead, in a few words; pytest-benchmark's comparison sees no difference."""
        saved = compared_benchmark.get("machine_info")
        if not (isinstance(saved, dict) and isinstance(saved.get("gpucolloc"), dict)):
            return (yield)  # not a run of this plugin: pytest-benchmark's comparison as it is
        changes = benchmark_api.machine_differences(saved, machine_info)
        with contextlib.suppress(DeviceUnavailable):  # a usage error, said once the session starts
            changes += machine.differences(saved["gpucolloc"], machine.identity(self.device().gpu, None))
        compared_benchmark["machine_info"] = machine_info
        try:
            result = yield
        finally:
            compared_benchmark["machine_info"] = saved
        if changes:
            benchmarksession.logger.warning("gpucolloc: compared run differs: " + "; ".join(changes))
        return result
