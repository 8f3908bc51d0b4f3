"""Command-line / ini options: declared once, each value parsed by a small function that raises ValueError naming
the option, so bad input is a pytest usage error before any process starts or any GPU state is touched."""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .cpu_affinity import CpuPolicy, parse_cpu_policy
from .machine_warmup import MAX_LIMIT_S
from .mig.planner import parse_layout
from .modes import MODES, parse_modes
from .verdict import DEFAULT_ALPHA, DEFAULT_MIN_RUNS, DEFAULT_REMEASURE, DEFAULT_RUNS, DEFAULT_THRESHOLD

# The gate's options, shared with the console command: a threshold of 100% would be a drop to nothing.
MAX_THRESHOLD = 99.0
MIN_ALPHA, MAX_ALPHA = 1e-6, 0.2
MAX_RUNS = 1000


def number_option(name: str, low: float, high: float, integer: bool = False) -> Callable[[str], Any]:
    def parse(text: str):
        try:
            value = int(text) if integer else float(text)
        except (TypeError, ValueError):
            kind = "an integer" if integer else "a number"
            raise ValueError(f"{name} must be {kind}, got {text!r}") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise ValueError(f"{name} must be between {low:g} and {high:g}, got {text!r}")
        return value

    return parse


def parse_machine_warmup(text: str) -> float | None:
    """Seconds, or None for auto (decided by the session: on when gating on a GPU)."""
    seconds = number_option("--colloc-machine-warmup", 0, MAX_LIMIT_S)
    return None if str(text).strip().lower() == "auto" else seconds(text)


SPAWN_METHODS = ("fresh", "forkserver")
CUDNN_CHOICES = ("autotune", "heuristics")


def one_of(name: str, choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = (text or "").strip().lower()
        if value not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}, got {text!r}")
        return value
    return parse


def parse_gpu_selector(text: str) -> str | int:
    """A GPU index (``0``) or UUID (``GPU-...``)."""
    value = (text or "0").strip()
    if re.fullmatch(r"\d{1,3}", value):
        return int(value)
    if re.fullmatch(r"GPU-[0-9a-fA-F-]{8,64}", value):
        return value
    raise ValueError(f"--colloc-gpu must be a GPU index or a GPU-... UUID, got {text!r}")


def parse_gpu_list(text: str) -> list[str | int] | None:
    if not text:
        return None
    try:
        gpus = [parse_gpu_selector(item) for item in map(str.strip, text.split(",")) if item]
    except ValueError:
        raise ValueError(f"--colloc-gpus must list GPU indexes or GPU-... UUIDs, e.g. '0,1'; got {text!r}") from None
    if not gpus or len(set(gpus)) != len(gpus):
        raise ValueError(f"--colloc-gpus must list distinct GPUs, got {text!r}")
    return gpus


def parse_mig_layout(text: str) -> str | None:
    if text:
        parse_layout(text)  # a LayoutError (ValueError) says what is wrong
    return text or None


def _path(name: str) -> Callable[[str], str | None]:
    def parse(text: str) -> str | None:
        if text and ("\0" in text or len(text) > 4096):
            raise ValueError(f"{name} is not a usable path: {text[:80]!r}")
        return text or None

    return parse


def parse_flag(text: Any) -> bool:
    value = text if isinstance(text, bool) else str(text).strip().lower()
    if value in (True, "1", "true", "yes", "on"):
        return True
    if value in (False, "0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected on or off (true or false), got {text!r}")


@dataclass(frozen=True)
class Option:
    help: str
    parse: Callable[[Any], Any]
    default: str | None  # None: depends on the device (GPU / CPU default below)
    gpu_default: str | None = None
    cpu_default: str | None = None
    flag: bool = False
    name: str = ""  # its Config field; the ini key, and the command-line flag with dashes

    @property
    def flag_name(self) -> str:
        return "--" + self.name.replace("_", "-")


def option(*args, **kwargs) -> Any:
    """A field of ``Config`` that an option fills."""
    return field(metadata={"option": Option(*args, **kwargs)})


def add_options(parser) -> None:
    group = parser.getgroup("gpucolloc", "GPU collocation benchmarks (pytest-gpucolloc)")
    for option in OPTIONS:
        kind = {"action": "store_const", "const": "true"} if option.flag \
            else {"metavar": option.name.split("_")[-1].upper()}
        group.addoption(option.flag_name, dest=option.name, default=None, help=option.help, **kind)
        parser.addini(option.name, option.help, default=None)


def _parse(option: Option, raw: Any) -> Any:
    try:
        return option.parse(raw)
    except ValueError as exc:
        message = str(exc)
        raise ValueError(message if option.flag_name in message else f"{option.flag_name}: {message}") from None


def any_given(config) -> bool:
    """Whether the session names one of the plugin's options (command line or ini): an invitation to act."""
    return any(config.getoption(option.name) is not None or config.getini(option.name) for option in OPTIONS)


@dataclass(frozen=True)
class Config:
    """The options, parsed once (``read_options``). Those whose default depends on the device are None here unless
    given: ``for_device`` fills them once it is known."""

    gpu_mode: list[str] | None = option(f"sharing modes to run scenarios under, comma-separated ({', '.join(MODES)}); "
        "default: mps on a GPU, naive in CPU smoke mode",
        parse_modes, None, "mps", "naive")
    colloc_device: str = option("auto (GPU if NVML sees one, else CPU smoke mode), cuda, or cpu",
        one_of("--colloc-device", ("auto", "cuda", "cpu")), "auto")
    colloc_gpu: str | int = option("GPU to run on: index or UUID (default 0)", parse_gpu_selector, "0")
    colloc_gpus: list[str | int] | None = option("with pytest-xdist (-n N): the GPUs to spread over, one xdist "
        "worker each, e.g. '0,1' or UUIDs (default: every GPU)", parse_gpu_list, "")
    colloc_rounds: int | None = option("fewest measurement rounds per scenario (default: 5 on a GPU, 3 on the CPU)",
        number_option("--colloc-rounds", 2, 10000, integer=True), None, "5", "3")
    colloc_max_rounds: int | None = option("most measurement rounds per scenario: rounds are added until the "
        "mean's 95%% confidence interval is within --colloc-precision (default: 10 on a GPU; on the CPU "
        "--colloc-rounds)",
        number_option("--colloc-max-rounds", 0, 10000, integer=True), None, "10", "0")
    colloc_precision: float = option("stop adding rounds when the 95%% confidence interval of the scenario's mean "
        "throughput is within this many percent, or once the rounds so far say even twice --colloc-max-rounds "
        "would not reach it (default 0.5; 0: always --colloc-max-rounds)",
        number_option("--colloc-precision", 0, 100), "0.5")
    colloc_round_seconds: float | None = option("length of one measurement round in seconds (default: 1 GPU, 0.5 CPU)",
        number_option("--colloc-round-seconds", 0.05, 3600), None, "1", "0.5")
    colloc_warmup_seconds: float | None = option("longest warm-up per worker, once it has taken the fewest steps "
        "(--colloc-warmup-steps): warm-up ends earlier when the step time has stopped improving (default: 10 GPU, "
        "0.5 CPU)",
        number_option("--colloc-warmup-seconds", 0, 3600), None, "10", "0.5")
    colloc_warmup_steps: int | None = option("fewest warm-up steps per worker (default: 20 GPU, 2 CPU)",
        number_option("--colloc-warmup-steps", 1, 10**6, integer=True), None, "20", "2")
    colloc_timeout: float = option("seconds a scenario's workers may take to start and warm up, and beyond the "
        "planned measurement time to finish it (default 600)",
        number_option("--colloc-timeout", 1, 86400), "600")
    colloc_repeats: int = option("start each scenario's workers K times afresh within the run, for scenarios whose "
        "noise lives between processes: every repeat is saved and the gate takes each repeat's processes as one sample "
        "(default 1; per scenario: @pytest.mark.gpucolloc_repeats(K))",
        number_option("--colloc-repeats", 1, 1000, integer=True), "1")
    colloc_cpus: CpuPolicy = option("CPU cores per worker: auto (disjoint cores per worker), none, or explicit lists "
        "'0-3;4-7' (one per worker)", parse_cpu_policy, "auto")
    colloc_ideal: bool = option("also measure the 'ideal' reference for homogeneous scenarios: one process "
        "with the summed batch (gives collocation efficiency)", parse_flag, "false", flag=True)
    colloc_full: bool = option("also run the scenarios marked gpucolloc_full (the paper's whole matrix); without it "
        "they are deselected, and the expected time of the selection is shown before it starts",
        parse_flag, "false", flag=True)
    colloc_cpu_full: bool = option("in CPU smoke mode, run every scenario instead of only the quick tier",
        parse_flag, "false", flag=True)
    colloc_extra_step_every: int | None = option("inject a known slowdown to check a regression gate: every "
        "workload (a user's factory too) runs one extra, uncounted step after every K steps (K=20 costs 1/21 of the "
        "throughput); "
        "default off",
        lambda text: number_option("--colloc-extra-step-every", 0, 10**6, integer=True)(text) or None, "0")  # 0: off
    colloc_cudnn: str = option("how the named convolutional workloads choose their cuDNN convolution algorithms when "
        "their options do not say: autotune (each worker times them in its first steps, "
        "torch.backends.cudnn.benchmark; the default) or heuristics (cuDNN's choice, PyTorch's own default: "
        "about 4 s less start-up a scenario, a few percent less throughput on launch-bound jobs; their labels "
        "say /cudnn-heuristics)", one_of("--colloc-cudnn", CUDNN_CHOICES), "autotune")
    colloc_spawn: str = option("how workers start: forkserver (forked from one process per session that has imported "
        "torch and torchvision, never CUDA: saves those imports at every start; the default) or fresh (a new "
        "Python interpreter each)", one_of("--colloc-spawn", SPAWN_METHODS), "forkserver")
    colloc_alone: bool = option("measure each distinct job alone once per session, the speedup's reference: on or off "
        "(default on; off leaves speedups out and saves that time, e.g. for gated runs)", parse_flag, "on")
    colloc_telemetry: bool = option("sample GPU telemetry (NVML) over each measurement window: on or off "
        "(default on; always off in CPU smoke mode)", parse_flag, "on")
    mig_layout: str | None = option("MIG layout for scenarios without per-workload profiles, e.g. '3g,2g,1g*2' or "
        "'3g.71gb,2g.35gb' (one instance per workload; default: the paper's layout for N identical jobs)",
        parse_mig_layout, "")
    mig_reconfigure: bool = option("allow the mig mode to reconfigure MIG instances (it checkpoints the current "
        "layout and restores it after each test); without it only an existing matching layout is used",
        parse_flag, "false", flag=True)
    mig_checkpoint_dir: str | None = option("where the MIG layout found before reconfiguring is kept until restored "
        "(default ~/.cache/pytest-gpucolloc)", _path("--mig-checkpoint-dir"), "")
    colloc_gate: bool = option("regression gate: compare each scenario with its saved history (benchmark storage) and "
        "fail the run on a throughput regression; the run is saved there (as --benchmark-autosave) unless it "
        "names its own --benchmark-save", parse_flag, "false", flag=True)
    colloc_gate_threshold: float = option("smallest throughput drop, in percent, that counts as a regression "
        f"(default {100 * DEFAULT_THRESHOLD:g}; per scenario: @pytest.mark.gpucolloc_gate(threshold=5))",
        number_option("--colloc-gate-threshold", 0, MAX_THRESHOLD), f"{100 * DEFAULT_THRESHOLD:g}")
    colloc_gate_runs: int = option("baseline: at most the N most recent comparable saved runs of the scenario's "
        f"current level, since its last level shift (default {DEFAULT_RUNS})",
        number_option("--colloc-gate-runs", 2, MAX_RUNS, integer=True), str(DEFAULT_RUNS))
    colloc_gate_min_runs: int = option(f"fewest comparable runs the gate needs to decide (default {DEFAULT_MIN_RUNS})",
        number_option("--colloc-gate-min-runs", 2, MAX_RUNS, integer=True), str(DEFAULT_MIN_RUNS))
    colloc_gate_alpha: float = option(f"false-alarm rate of the gate per scenario (default {DEFAULT_ALPHA:g})",
        number_option("--colloc-gate-alpha", MIN_ALPHA, MAX_ALPHA), f"{DEFAULT_ALPHA:g}")
    colloc_gate_remeasure: int = option("when a gated scenario's run looks disturbed (its round spread far above the "
        "scenario's usual, its power-cap share far below), measure it again, at most N times, before it is judged "
        f"(default {DEFAULT_REMEASURE}; 0: never)",
        number_option("--colloc-gate-remeasure", 0, 10, integer=True), str(DEFAULT_REMEASURE))
    colloc_machine_warmup: float | None = option("before the first measurement of a session on a GPU, load the GPU "
        "until its power and SM clock are steady, at most this many seconds (default auto: 60 when gating on a GPU, "
        "else off; 0: off)", parse_machine_warmup, "auto")
    colloc_gate_report: str | None = option("also write the gate's verdicts as Markdown to this file (CI job "
        "summaries)", _path("--colloc-gate-report"), "")
    colloc_columns: str | None = option("the summary table's columns, comma-separated (as pytest-benchmark's "
        "--benchmark-columns), among scenario, mode, workers, per-worker, aggregate, cv, speedup, efficiency, sm, "
        "memory, data-wait, energy, rounds, start-up, flags (default all)",
        lambda text: text.strip() or None, "")  # names as given: the session checks them against the table's
    mps_oversubscribe: bool = option("allow mps-partitioned shares that add up to more than 100 percent",
        parse_flag, "false", flag=True)

    def for_device(self, on_gpu: bool) -> DeviceConfig:
        """The device-dependent options, each given or its default on this device."""
        def filled(name: str) -> Any:
            given = getattr(self, name)
            if given is not None:
                return given
            option = next(o for o in OPTIONS if o.name == name)
            return _parse(option, option.gpu_default if on_gpu else option.cpu_default)

        rounds = filled("colloc_rounds")
        max_rounds = filled("colloc_max_rounds")
        # 0: fixed at the fewest; the default never asks for fewer than --colloc-rounds
        if not max_rounds or self.colloc_max_rounds is None:
            max_rounds = max(max_rounds, rounds)
        elif max_rounds < rounds:
            raise ValueError(f"--colloc-max-rounds ({max_rounds}) must be at least --colloc-rounds ({rounds})")
        return DeviceConfig(modes=filled("gpu_mode"), rounds=rounds, max_rounds=max_rounds,
                            round_s=filled("colloc_round_seconds"), warmup_s=filled("colloc_warmup_seconds"),
                            warmup_steps=filled("colloc_warmup_steps"))


OPTIONS = [replace(f.metadata["option"], name=f.name) for f in fields(Config)]


@dataclass(frozen=True)
class DeviceConfig:
    """The options whose default depends on the device, filled in (``Config.for_device``)."""

    modes: list[str]
    rounds: int
    max_rounds: int
    round_s: float
    warmup_s: float
    warmup_steps: int


def read_options(config) -> Config:
    """Parsed values: command line first, then ini, then the default."""
    values: dict[str, Any] = {}
    for option in OPTIONS:
        raw = config.getoption(option.name)  # an explicit empty value on the command line is an error
        if raw is None:
            raw = config.getini(option.name) or option.default
        values[option.name] = None if raw is None else _parse(option, raw)
    return Config(**values)
