"""Workload specifications: what one training process runs.

Pure data, no torch: the pytest process validates and records these; the worker builds them
(see ``models.py``).
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class WorkloadError(ValueError):
    """A workload specification is invalid."""


@dataclass(frozen=True)
class ModelShape:
    arch: str
    image_size: int
    num_classes: int
    dataset: str


@dataclass(frozen=True)
class LanguageModelShape:
    """A decoder-only transformer language model (GPT-2-like): causal scaled-dot-product attention, AdamW."""

    layers: int
    d_model: int
    heads: int
    vocab: int
    seq_len: int  # default sequence length; Workload(..., options={"seq_len": N}) changes it


# The paper's workloads (Robroek et al., EuroMLSys '24) with synthetic inputs of the datasets' shapes, and two
# language models of the kind users now collocate (random weights and tokens: nothing is downloaded).
NAMED_WORKLOADS: dict[str, ModelShape | LanguageModelShape] = {
    "resnet26-cifar10": ModelShape("resnet26", 32, 10, "CIFAR-10 (3x32x32)"),
    "resnet50-imagenet64": ModelShape("resnet50", 64, 1000, "ImageNet 64px (3x64x64)"),
    "resnet152-imagenet": ModelShape("resnet152", 224, 1000, "ImageNet (3x224x224)"),
    "resnet50-imagenet224": ModelShape("resnet50", 224, 1000, "ImageNet (3x224x224)"),
    "gpt2-small": LanguageModelShape(layers=12, d_model=768, heads=12, vocab=50257, seq_len=1024),
    "gpt-mini": LanguageModelShape(layers=6, d_model=512, heads=8, vocab=50257, seq_len=512),
}
ALIASES = {"resnet26": "resnet26-cifar10", "resnet50": "resnet50-imagenet64", "resnet152": "resnet152-imagenet"}
PRECISIONS = ("fp32", "bf16")
# Options of the named workloads. extra_step_every=K runs one extra, uncounted training step after every
# K counted ones: a genuine, known slowdown of 1/(K+1) (K=20: -4.8%), for testing regression gates.
# cudnn_autotune=False picks convolution algorithms by cuDNN's heuristics instead of timing them in each process
# (torch.backends.cudnn.benchmark, on by default): slightly slower, possibly steadier from process to process.
NAMED_OPTIONS = {"extra_step_every", "cudnn_autotune"}
LANGUAGE_MODEL_OPTIONS = NAMED_OPTIONS | {"seq_len"}  # seq_len: tokens per sample
MAX_SEQ_LEN = 32768
SMOKE_SEQ_LEN = 32  # CPU smoke mode's cap on a language model's sequence length
MAX_BATCH_SIZE = 65536
DATA_SOURCES = ("synthetic", "loader")
ARRIVALS = ("even", "poisson")  # a serving job's arrivals: every 1/rate seconds, or a Poisson process at the rate
MAX_LOADER_WORKERS = 64
MAX_OPTIONS_BYTES = 1 << 16  # a user factory's options travel to the worker as JSON
MAX_OPTION_DEPTH = 32
BACK_TO_BACK = "max"  # a serving job's rate: each request as soon as the one before it has been answered
MAX_RATE = 1e6  # requests per second
_SHARE_OF_ALONE = re.compile(r"^(\d+(\.\d+)?)%$")
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


def autotunes_convolutions(params: Mapping[str, Any]) -> bool:
    """A saved workload (``Workload.to_dict()``) is a named convolutional model whose algorithms cuDNN times in
    each process (``cudnn_autotune``, on by default): two processes may pick different ones."""
    model = params.get("model")
    shape = NAMED_WORKLOADS.get(ALIASES.get(model, model)) if isinstance(model, str) else None
    return isinstance(shape, ModelShape) and (params.get("options") or {}).get("cudnn_autotune", True) is not False


def known_workloads() -> list[str]:
    return sorted(NAMED_WORKLOADS) + sorted(ALIASES)


@dataclass(frozen=True)
class Workload:
    """One training process of a scenario (README.md lists every field)."""

    model: str  # a named workload (``known_workloads()``) or a user factory "package.module:factory"
    batch_size: int = 32
    precision: str = "fp32"
    sm_percent: float | None = None  # per-client MPS limits
    memory_limit_mb: int | None = None
    mig: str | None = None  # a MIG profile ("1g.18gb" or "1g")
    options: Mapping[str, Any] = field(default_factory=dict)  # a user factory's keyword arguments
    cuda_graph: bool = False
    data: str = "synthetic"  # "loader": a DataLoader decoding JPEGs feeds a built-in image workload
    loader_workers: int = 4  # the paper's jobs used 4; only with data="loader"
    rate: float | str | None = None  # a serving job: requests/s, "max" (back to back) or "NN%" of "max" alone
    arrivals: str = "even"  # a serving job's: "even" (every 1/rate s) or "poisson" (random gaps, the same each run)

    def __post_init__(self) -> None:
        name = self.model.strip() if isinstance(self.model, str) else self.model
        if not isinstance(name, str) or not name:
            raise WorkloadError(f"workload model must be a non-empty string, got {self.model!r}")
        name = ALIASES.get(name, name)
        if name not in NAMED_WORKLOADS and not _IMPORT_PATH.match(name):
            near = difflib.get_close_matches(name.lower(), known_workloads())
            raise WorkloadError(f"unknown workload {self.model!r}"
                                + (f": did you mean {' or '.join(map(repr, near))}?" if near else ".")
                                + " Known workloads (pytest_gpucolloc.known_workloads(), the README's Workloads): "
                                f"{', '.join(known_workloads())}, or a factory given as 'package.module:factory'")
        object.__setattr__(self, "model", name)
        if not _is(self.batch_size, int):
            raise WorkloadError(f"batch_size must be an integer, got {self.batch_size!r}")
        if not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            raise WorkloadError(f"batch_size must be between 1 and {MAX_BATCH_SIZE}, got {self.batch_size}")
        if self.precision not in PRECISIONS:
            raise WorkloadError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.sm_percent is not None and not (_is(self.sm_percent, int, float) and 0 < self.sm_percent <= 100):
            raise WorkloadError(f"sm_percent must be a number in (0, 100], got {self.sm_percent!r}")
        if self.memory_limit_mb is not None and not (_is(self.memory_limit_mb, int) and self.memory_limit_mb >= 1):
            raise WorkloadError(f"memory_limit_mb must be a positive integer, got {self.memory_limit_mb!r}")
        if self.mig is not None and (not isinstance(self.mig, str)
                                     or not re.match(r"^\d+g(\.\d+gb)?(\+me)?$", self.mig, re.ASCII)):
            raise WorkloadError(f"mig profile must look like '1g' or '1g.18gb', got {self.mig!r}")
        if not isinstance(self.cuda_graph, bool):
            raise WorkloadError(f"cuda_graph must be True or False, got {self.cuda_graph!r}")
        if self.data not in DATA_SOURCES:
            raise WorkloadError(f"data must be one of {', '.join(DATA_SOURCES)}, got {self.data!r}")
        if not (_is(self.loader_workers, int) and 0 <= self.loader_workers <= MAX_LOADER_WORKERS):
            raise WorkloadError(f"loader_workers must be an integer from 0 to {MAX_LOADER_WORKERS}, "
                                f"got {self.loader_workers!r}")
        if self.data == "loader" and not isinstance(NAMED_WORKLOADS.get(name), ModelShape):
            raise WorkloadError(f"data='loader' feeds the built-in image workloads "
                                f"({', '.join(n for n, s in NAMED_WORKLOADS.items() if isinstance(s, ModelShape))}); "
                                f"{name} brings its own data")
        self._check_rate()
        if not isinstance(self.options, Mapping) or not all(isinstance(k, str) for k in self.options):
            raise WorkloadError("options must be a mapping with string keys")
        for key, value in self.options.items():
            _check_json(key, value)
        if name in NAMED_WORKLOADS:
            known = LANGUAGE_MODEL_OPTIONS if isinstance(NAMED_WORKLOADS[name], LanguageModelShape) else NAMED_OPTIONS
            unknown = set(self.options) - known
            if unknown:
                raise WorkloadError(f"unknown option(s) {sorted(unknown)} for {name}; known: {sorted(known)}")
            seq_len = self.options.get("seq_len")
            if seq_len is not None and not (_is(seq_len, int) and 1 <= seq_len <= MAX_SEQ_LEN):
                raise WorkloadError(f"seq_len must be an integer from 1 to {MAX_SEQ_LEN}, got {seq_len!r}")
            if not isinstance(self.options.get("cudnn_autotune", True), bool):
                raise WorkloadError(f"cudnn_autotune must be True or False, got {self.options['cudnn_autotune']!r}")
            every = self.options.get("extra_step_every")
            if every is not None and not (_is(every, int) and every >= 1):
                raise WorkloadError(f"extra_step_every must be a positive integer, got {every!r}")
        object.__setattr__(self, "options", dict(self.options))

    def _check_rate(self) -> None:
        rate = self.rate
        if rate is None or rate == BACK_TO_BACK:
            pass
        elif isinstance(rate, str):
            share = _SHARE_OF_ALONE.match(rate.strip())
            if not share or not 0 < float(share.group(1)) <= 100:
                raise WorkloadError(f"rate must be requests per second, {BACK_TO_BACK!r} (back to back) or a share "
                                    f"of that like '80%' (above 0, at most 100%), got {rate!r}")
            object.__setattr__(self, "rate", rate.strip())
        elif not (_is(rate, int, float) and 0 < rate <= MAX_RATE):
            raise WorkloadError(f"rate must be a number of requests per second above 0 and at most {MAX_RATE:g}, "
                                f"got {rate!r}")
        if self.arrivals not in ARRIVALS:
            raise WorkloadError(f"arrivals must be one of {', '.join(ARRIVALS)}, got {self.arrivals!r}")
        if self.arrivals != "even" and (rate is None or rate == BACK_TO_BACK):
            raise WorkloadError(f"arrivals={self.arrivals!r} spaces a serving job's requests: give it a rate in "
                                "requests/s or a share like '80%'")
        if rate is not None and self.data == "loader":
            raise WorkloadError("a serving job (rate=...) takes its requests from memory, not a data loader")

    @property
    def serves(self) -> bool:
        """A serving job (inference requests at a rate), not a training one."""
        return self.rate is not None

    @property
    def share_of_alone(self) -> float | None:
        """``rate="80%"``: 0.8 of the rate the job sustains back to back alone; else None."""
        share = _SHARE_OF_ALONE.match(self.rate) if isinstance(self.rate, str) else None
        return float(share.group(1)) / 100 if share else None

    def at_rate(self, rate: float | str) -> Workload:
        return dataclasses.replace(self, rate=rate)

    @property
    def is_named(self) -> bool:
        return self.model in NAMED_WORKLOADS

    @property
    def shape(self) -> ModelShape | LanguageModelShape | None:
        return NAMED_WORKLOADS.get(self.model)

    @property
    def tokens_per_sample(self) -> int | None:
        """A language model's sequence length (its throughput in tokens/s is samples/s times this)."""
        if not isinstance(self.shape, LanguageModelShape):
            return None
        return self.options.get("seq_len", self.shape.seq_len)

    @property
    def label(self) -> str:
        """Short human label, e.g. ``resnet26-cifar10/bs128`` or ``gpt2-small/bs8/seq1024``."""
        text = f"{self.model}/bs{self.batch_size}"
        if self.tokens_per_sample:
            text += f"/seq{self.tokens_per_sample}"
        if self.precision != "fp32":
            text += f"/{self.precision}"
        if self.cuda_graph:
            text += "/graph"
        if self.uses_loader:
            text += f"/loader{self.loader_workers}"
        if self.options.get("cudnn_autotune") is False:
            text += "/cudnn-heuristics"
        if self.serves:
            text += "/serve-" + (f"{self.rate:g}rps" if isinstance(self.rate, (int, float)) else str(self.rate))
            text += "" if self.arrivals == "even" else f"-{self.arrivals}"
        return text

    @property
    def uses_loader(self) -> bool:
        return self.data == "loader"

    @property
    def cores_wanted(self) -> int:
        """CPU cores the job can use: its training process, and one per data-loader worker."""
        return 1 + (self.loader_workers if self.uses_loader else 0)

    def key(self) -> tuple:
        """Identity of the training job itself (what it computes), without sharing limits."""
        options = json.dumps(self.options, sort_keys=True, allow_nan=False)
        key: tuple = (self.model, self.batch_size, self.precision, options, self.cuda_graph)
        if self.serves:
            key += (("rate", self.rate),) + ((("arrivals", self.arrivals),) if self.arrivals != "even" else ())
        return key + (("loader", self.loader_workers),) if self.uses_loader else key

    def with_batch_size(self, batch_size: int) -> Workload:
        return dataclasses.replace(self, batch_size=batch_size)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if not self.uses_loader:  # a synthetic job is saved as it was before loaders existed
            del data["data"], data["loader_workers"]
        if not self.serves:  # a training job is saved as it was before serving jobs existed
            del data["rate"]
        if self.arrivals == "even":  # as saved before arrivals could be chosen
            del data["arrivals"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Workload:
        return cls(**data)


def _is(value: Any, *kinds: type) -> bool:
    """``isinstance`` where a bool is no number: ``True`` is an int to Python, not to a user."""
    return isinstance(value, kinds) and not isinstance(value, bool)


def _check_json(key: str, value: Any) -> None:
    """An option's value is a JSON value (text, finite numbers, true/false, None, lists and dicts with text keys;
    a tuple arrives as a list): it is sent to the worker and saved with the record."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_OPTION_DEPTH:
            raise WorkloadError(f"option {key!r} is nested more than {MAX_OPTION_DEPTH} lists or dicts deep")
        if isinstance(item, (list, tuple)):
            stack += [(v, depth + 1) for v in item]
        elif isinstance(item, dict) and all(isinstance(k, str) for k in item):
            stack += [(v, depth + 1) for v in item.values()]
        elif not (item is None or isinstance(item, (str, bool, int))
                  or isinstance(item, float) and math.isfinite(item)):
            raise WorkloadError(f"option {key!r} must be a JSON value (text, a finite number, True/False, None, or "
                                f"a list or dict with text keys of these); found {type(item).__name__} "
                                f"{repr(item)[:60]}")
    size = len(json.dumps(value))
    if size > MAX_OPTIONS_BYTES:
        raise WorkloadError(f"option {key!r} is {size:,} bytes as JSON, more than {MAX_OPTIONS_BYTES:,}")


def as_workloads(value: Any) -> list[Workload]:
    """collocate()'s argument: a list (or other iterable) of workloads or names. A lone name or Workload is a
    mistake said as one, not read letter by letter."""
    if isinstance(value, (str, bytes)):
        raise WorkloadError(f"collocate() takes a list of workloads; got the string {value[:80]!r} "
                            f"(one job alone: collocate([{value[:80]!r}]))")
    if isinstance(value, Workload):
        raise WorkloadError(f"collocate() takes a list of workloads; got one Workload ({value.label}): "
                            "collocate([workload]) for one job alone")
    if isinstance(value, Mapping) or not hasattr(value, "__iter__"):
        raise WorkloadError(f"collocate() takes a list of workloads; got {type(value).__name__}")
    return [as_workload(w) for w in value]


def as_workload(value: Workload | str) -> Workload:
    """Accept a Workload or a bare name (default batch size)."""
    if isinstance(value, Workload):
        return value
    if isinstance(value, str):
        return Workload(value)
    raise WorkloadError(f"expected a Workload or a workload name, got {type(value).__name__}")
