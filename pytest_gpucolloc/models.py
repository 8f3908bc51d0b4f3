"""Worker-side construction of training steps (imports torch; never imported by the pytest process).

Every workload, built-in or user-supplied, follows one protocol (README.md; as TorchBench's model wrappers do): a
factory ``(*, batch_size, device, precision, **options)`` returns an object whose ``train_step()`` is one optimiser
step on ``device`` (a serving job's ``serve_step()``: one request, no gradients), with an optional
``samples_per_step`` (default ``batch_size``). The worker drives both kinds through ``train_step``;
``cuda_graph=True`` captures either once as a CUDA graph after warm-up (``GraphedStep``).
"""
from __future__ import annotations

import difflib
import importlib
from typing import Any

import torch
from torch import nn

from .workloads import NAMED_WORKLOADS, SMOKE_SEQ_LEN, LanguageModelShape, Workload


def build_network(arch: str, num_classes: int) -> nn.Module:
    from torchvision.models import resnet

    if arch == "resnet26":  # Bottleneck ResNet with [2, 2, 2, 2] blocks: 1 + 3*8 + 1 = 26 layers
        return resnet.ResNet(resnet.Bottleneck, [2, 2, 2, 2], num_classes=num_classes)
    return getattr(resnet, arch)(num_classes=num_classes)  # resnet50, resnet152


class TrainingStep:
    """One optimiser step per ``train_step`` on a synthetic batch resident on the device (no data loader, no
    downloads); with ``extra_step_every`` K, one extra, uncounted step after every K (a known slowdown)."""

    extra_step_every: int | None = None
    steps = 0
    device: torch.device
    bf16 = False
    graph_safe = False  # autocast's weight cache must be off inside a CUDA graph capture

    def _step(self) -> None:
        raise NotImplementedError

    def autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16,
                              cache_enabled=False if self.graph_safe else None)

    def train_step(self) -> None:
        self._step()
        self.steps += 1
        if self.extra_step_every and self.steps % self.extra_step_every == 0:
            self._step()  # uncounted extra work (a known slowdown)


class SupervisedStep(TrainingStep):
    """An image classifier trained with SGD, on one synthetic batch or on batches from a data loader (copied into
    the same input tensors, so that a CUDA graph of ``compute`` reads each new batch)."""

    def __init__(self, model: nn.Module, batch_size: int, image_size: int, num_classes: int,
                 device: torch.device, precision: str, extra_step_every: int | None = None,
                 graph_safe: bool = False, loader=None):
        self.device, self.graph_safe, self.extra_step_every = device, graph_safe, extra_step_every
        self.loader = loader  # image_data.LoaderFeed, or None: one synthetic batch stays on the device
        self.samples_per_step, self.bf16 = batch_size, precision == "bf16"
        memory_format = torch.channels_last if device.type == "cuda" else torch.contiguous_format
        self.model = model.to(device).to(memory_format=memory_format).train()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss = nn.CrossEntropyLoss()
        generator = torch.Generator(device="cpu").manual_seed(0)
        images = torch.randn(batch_size, 3, image_size, image_size, generator=generator)
        self.images = images.to(device=device, memory_format=memory_format)
        self.labels = torch.randint(0, num_classes, (batch_size,), generator=generator).to(device)

    def fetch(self) -> None:
        if self.loader is not None:
            self.loader.next_into(self.images, self.labels)

    def compute(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            loss = self.loss(self.model(self.images), self.labels)
        loss.backward()
        self.optimizer.step()

    def _step(self) -> None:
        self.fetch()
        self.compute()


class Block(nn.Module):
    """A pre-norm transformer decoder block with causal scaled-dot-product attention."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, length, 3, self.heads, width // self.heads).unbind(2)
        attended = nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                              is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class LanguageModel(nn.Module):
    """Decoder-only, GPT-2-like: token and position embeddings, blocks, a head tied to the token embedding."""

    def __init__(self, shape: LanguageModelShape, seq_len: int):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(shape.vocab, shape.d_model), nn.Embedding(seq_len, shape.d_model)
        self.blocks = nn.Sequential(*[Block(shape.d_model, shape.heads) for _ in range(shape.layers)])
        self.norm = nn.LayerNorm(shape.d_model)
        self.head = nn.Linear(shape.d_model, shape.vocab, bias=False)
        self.head.weight = self.tokens.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.head(self.norm(self.blocks(self.tokens(ids) + self.positions(positions))))


class LanguageModelStep(TrainingStep):
    """Next-token training with AdamW on one batch of random tokens resident on the device."""

    def __init__(self, shape: LanguageModelShape, batch_size: int, seq_len: int, device: torch.device,
                 precision: str, extra_step_every: int | None = None, graph_safe: bool = False):
        self.device, self.graph_safe, self.extra_step_every = device, graph_safe, extra_step_every
        self.samples_per_step, self.bf16 = batch_size, precision == "bf16"
        self.model = LanguageModel(shape, seq_len).to(device).train()
        # capturable: AdamW's step counter stays on the device, so the step can be captured as a CUDA graph
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-4,
                                           capturable=graph_safe and device.type == "cuda")
        generator = torch.Generator(device="cpu").manual_seed(0)
        ids = torch.randint(0, shape.vocab, (batch_size, seq_len + 1), generator=generator).to(device)
        self.inputs, self.targets = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
        self.vocab = shape.vocab

    def _step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            logits = self.model(self.inputs)
            loss = nn.functional.cross_entropy(logits.view(-1, self.vocab), self.targets.view(-1))
        loss.backward()
        self.optimizer.step()


# CPU smoke mode keeps a language model's code path but not its size (a CPU cannot train GPT-2 in a round).
# (its sequence length is capped by scenario.Settings.adapt, so that the label says what ran)
SMOKE_LANGUAGE_MODEL = LanguageModelShape(layers=2, d_model=64, heads=4, vocab=512, seq_len=SMOKE_SEQ_LEN)


class GraphedStep(TrainingStep):
    """A training step captured once as a CUDA graph and replayed. ``step_fn`` is warmed up on a side stream
    (cuDNN autotuning, allocator, optimiser state), then captured. ``fetch``, when given, runs before every replay,
    outside the graph: it puts the next batch into the tensors the graph reads (``loader``: its data loader)."""

    WARMUP_STEPS = 3

    def __init__(self, step_fn, samples_per_step: int, extra_step_every: int | None = None, fetch=None,
                 loader=None):
        self.step_fn, self.samples_per_step, self.extra_step_every = step_fn, samples_per_step, extra_step_every
        self.fetch = fetch or (lambda: None)
        self.loader = loader
        self.graph: torch.cuda.CUDAGraph | None = None  # capture() makes it

    def capture(self) -> None:
        self.fetch()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(self.WARMUP_STEPS):
                self.step_fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.step_fn()
        except Exception as error:
            raise RuntimeError(
                f"cuda_graph=True: the training step cannot be captured as a CUDA graph ({type(error).__name__}: "
                f"{str(error)[:300]}); a captured step must not synchronise with the host, change shapes or do "
                "CPU-side work") from error
        self.graph = graph

    def _step(self) -> None:
        if self.graph is None:
            raise RuntimeError("GraphedStep.capture() must come before train_step()")
        self.fetch()
        self.graph.replay()


def build_named(workload: Workload, device: torch.device, image_size: int | None = None):
    shape = NAMED_WORKLOADS[workload.model]
    extra = None if workload.cuda_graph else workload.options.get("extra_step_every")
    step: LanguageModelStep | SupervisedStep
    if isinstance(shape, LanguageModelShape):
        shape = SMOKE_LANGUAGE_MODEL if image_size is not None else shape  # CPU smoke mode
        seq_len = workload.tokens_per_sample or shape.seq_len  # a language model always has one
        step = LanguageModelStep(shape, workload.batch_size, seq_len, device, workload.precision,
                                 extra, graph_safe=workload.cuda_graph)
    else:
        loader = None
        if workload.uses_loader:
            from .image_data import LoaderFeed  # torch's data loader only where a job reads images

            loader = LoaderFeed(image_size or shape.image_size, shape.num_classes, workload.batch_size,
                                workload.loader_workers, device)
        step = SupervisedStep(build_network(shape.arch, shape.num_classes), batch_size=workload.batch_size,
                              image_size=image_size or shape.image_size, num_classes=shape.num_classes,
                              device=device, precision=workload.precision, extra_step_every=extra,
                              graph_safe=workload.cuda_graph, loader=loader)
        if workload.cuda_graph:
            return GraphedStep(step.compute, step.samples_per_step, workload.options.get("extra_step_every"),
                               fetch=step.fetch, loader=loader)
    if workload.cuda_graph:
        return GraphedStep(step._step, step.samples_per_step, workload.options.get("extra_step_every"))
    return step


class ServingStep(TrainingStep):
    """One request per ``train_step``: the model's forward pass in inference mode (eval, no gradients) on one batch
    resident on the device, in bf16 when asked (autocast); ``extra_step_every`` as for training."""

    def __init__(self, model: nn.Module, inputs: torch.Tensor, device: torch.device, precision: str,
                 graph_safe: bool = False, extra_step_every: int | None = None):
        self.model, self.inputs, self.device = model.to(device).eval(), inputs, device
        self.bf16, self.graph_safe, self.extra_step_every = precision == "bf16", graph_safe, extra_step_every
        self.samples_per_step = inputs.shape[0]

    def _step(self) -> None:
        with torch.inference_mode(), self.autocast():
            self.model(self.inputs)


class UserServingStep:
    """A user's serving object (its ``serve_step()`` answers one request) as the worker drives it."""

    def __init__(self, obj: Any, samples_per_step: int):
        self.obj, self.samples_per_step = obj, samples_per_step

    def train_step(self) -> None:
        self.obj.serve_step()


def build_serving(workload: Workload, device: torch.device, image_size: int | None = None) -> Any:
    """The serving object of a serving job (``Workload(..., rate=...)``): one request per ``train_step``."""
    if workload.is_named:
        shape = workload.shape
        every = workload.options.get("extra_step_every")
        generator = torch.Generator(device="cpu").manual_seed(0)
        if isinstance(shape, LanguageModelShape):
            shape = SMOKE_LANGUAGE_MODEL if image_size is not None else shape  # CPU smoke mode
            seq_len = workload.tokens_per_sample or shape.seq_len
            inputs = torch.randint(0, shape.vocab, (workload.batch_size, seq_len), generator=generator).to(device)
            step = ServingStep(LanguageModel(shape, seq_len), inputs, device, workload.precision, workload.cuda_graph,
                               None if workload.cuda_graph else every)
        else:
            assert shape is not None
            size = image_size or shape.image_size
            memory_format = torch.channels_last if device.type == "cuda" else torch.contiguous_format
            images = torch.randn(workload.batch_size, 3, size, size, generator=generator)
            model = build_network(shape.arch, shape.num_classes).to(memory_format=memory_format)
            step = ServingStep(model, images.to(device=device, memory_format=memory_format), device,
                               workload.precision, workload.cuda_graph, None if workload.cuda_graph else every)
        if workload.cuda_graph:
            return GraphedStep(step._step, step.samples_per_step, every)
        return step
    obj = _user_object(workload, device, "serve_step", " (a serving job, rate=..., answers one request per "
                                                        "serve_step())")
    samples = getattr(obj, "samples_per_step", workload.batch_size)
    every = workload.options.get("extra_step_every")
    if workload.cuda_graph:
        return GraphedStep(obj.serve_step, samples, every)
    served = UserServingStep(obj, samples)
    return Slowed(served, every) if every else served


class Slowed(TrainingStep):
    """A user's step with the injected slowdown (``--colloc-extra-step-every`` K), taken as the built-in steps take
    it; its other attributes (``samples_per_step``, ...) are the user's."""

    def __init__(self, step: Any, every: int):
        self.step, self.extra_step_every = step, every

    def _step(self) -> None:
        self.step.train_step()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.step, name)


def data_wait_s(step) -> float | None:
    """Seconds the step has waited for its data loader so far; None for a job without one."""
    from .image_data import LoaderFeed  # torch's data loader only where a job reads images

    loader = getattr(step, "loader", None)  # a user's step may have a "loader" of its own
    return loader.wait_s if isinstance(loader, LoaderFeed) else None


def _user_object(workload: Workload, device: torch.device, method: str, why: str = "") -> Any:
    """What a user's factory (``"package.module:factory"``) returns for ``workload``, which must have ``method``."""
    module_name, _, attr = workload.model.partition(":")
    module = importlib.import_module(module_name)
    try:
        factory = getattr(module, attr)
    except AttributeError:
        near = difflib.get_close_matches(attr, [name for name in vars(module) if not name.startswith("_")], 1)
        raise ImportError(f"module {module_name!r} has no attribute {attr!r}"
                          + (f": did you mean {near[0]!r}?" if near else "")) from None
    options = {k: v for k, v in workload.options.items() if k != "extra_step_every"}  # the plugin's, not the user's
    obj = factory(batch_size=workload.batch_size, device=device, precision=workload.precision, **options)
    if not callable(getattr(obj, method, None)):
        raise TypeError(f"{workload.model} returned {type(obj).__name__}, which has no {method}(){why}")
    return obj


def build(workload: Workload, device: torch.device, image_size: int | None = None) -> Any:
    """The training-step object for ``workload``; ``image_size`` shrinks inputs (CPU smoke mode). A graphed
    step still has to be captured (``GraphedStep.capture``) before it trains."""
    if workload.cuda_graph and device.type != "cuda":
        raise RuntimeError(f"cuda_graph=True needs a CUDA device; this worker trains on {device.type}")
    if workload.is_named and device.type == "cuda":  # one job per process: the flag is the job's
        torch.backends.cudnn.benchmark = workload.options.get("cudnn_autotune", True)
    if workload.serves:
        return build_serving(workload, device, image_size)
    if workload.is_named:
        return build_named(workload, device, image_size)
    step = _user_object(workload, device, "train_step")
    every = workload.options.get("extra_step_every")
    if workload.cuda_graph:
        return GraphedStep(step.train_step, getattr(step, "samples_per_step", workload.batch_size), every)
    return Slowed(step, every) if every else step
