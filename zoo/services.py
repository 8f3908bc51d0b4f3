"""Two services written as a user writes them: a forward pass per request, bf16 autocast, eager, nothing tuned.

Each factory follows pytest-gpucolloc's serving protocol (``Workload("zoo.services:vit", rate=50, ...)``):
``factory(*, batch_size, device, precision, **options)`` returns an object whose ``serve_step()`` answers one request
of ``batch_size`` samples on ``device``. On the CPU (the plugin's smoke mode) each model is built small.

Two known changes, for checking latency verdicts against the truth (environment, read when the service is built):
- ``ZOO_SERVICE_EXTRA=f``: each request runs round(f * depth) of its blocks a second time: 0.1 with 10 blocks is one
  block more per request, 10% more of the blocks' GPU work;
- ``ZOO_SERVICE_STALL=share:ms``: every round(1/share)-th request pauses ``ms`` milliseconds on the host before it is
  answered (a rare stall: "0.01:20" pauses 1% of requests 20 ms).
"""
import os
import time

import torch
from torch import nn


def extra_blocks(depth: int) -> int:
    text = os.environ.get("ZOO_SERVICE_EXTRA", "0")
    fraction = float(text)
    if not 0 <= fraction <= 1:
        raise ValueError(f"ZOO_SERVICE_EXTRA must be a fraction from 0 to 1, got {text!r}")
    return round(fraction * depth)


def stall() -> tuple[int, float]:
    """(every how many requests, seconds) of the injected stall; (0, 0) for none."""
    text = os.environ.get("ZOO_SERVICE_STALL", "0")
    if text in ("", "0"):
        return 0, 0.0
    share, ms = (float(part) for part in text.split(":"))
    if not 0 < share <= 1 or not 0 < ms <= 10_000:
        raise ValueError(f"ZOO_SERVICE_STALL must be SHARE:MS (e.g. 0.01:20), got {text!r}")
    return round(1 / share), ms / 1000


class Service:
    """Runs ``model`` on one batch per request; the injected changes of the module docstring."""

    def __init__(self, model: nn.Module, inputs: torch.Tensor, device: torch.device, bf16: bool, batch_size: int):
        self.model, self.inputs, self.device, self.bf16 = model.eval(), inputs, device, bf16
        self.samples_per_step = batch_size
        self.every, self.pause = stall()
        self.requests = 0

    def serve_step(self) -> None:
        with torch.inference_mode(), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            self.model(self.inputs)
        self.requests += 1
        if self.every and self.requests % self.every == 0:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            time.sleep(self.pause)


class Blocks(nn.Module):
    """A stack of transformer blocks; the first ``extra`` of them run twice (the injected extra work)."""

    def __init__(self, d_model: int, heads: int, depth: int, causal: bool):
        super().__init__()
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, batch_first=True,
                                                               norm_first=True) for _ in range(depth))
        self.extra, self.causal = extra_blocks(depth), causal

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device) if self.causal else None
        for block in [*self.blocks, *self.blocks[:self.extra]]:
            x = block(x, src_mask=mask, is_causal=self.causal)
        return x


# (a) A vision transformer classifying 224 px images: 16 px patches, 10 blocks of width 384.
class ViT(nn.Module):
    def __init__(self, image: int, patch: int, d_model: int, heads: int, depth: int, classes: int = 1000):
        super().__init__()
        self.patches = nn.Conv2d(3, d_model, patch, stride=patch)
        self.position = nn.Parameter(torch.zeros(1, (image // patch) ** 2, d_model))
        self.blocks = Blocks(d_model, heads, depth, causal=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, images):
        x = self.patches(images).flatten(2).transpose(1, 2) + self.position
        return self.head(self.blocks(x).mean(dim=1))


def vit(*, batch_size, device, precision="fp32", image=224, patch=16, d_model=384, heads=6, depth=10):
    if device.type == "cpu":
        image, d_model, heads, depth = 32, 32, 2, 2
    model = ViT(image, patch, d_model, heads, depth).to(device)
    images = torch.randn(batch_size, 3, image, image, device=device)
    return Service(model, images, device, precision == "bf16", batch_size)


# (b) A decoder-only language model scoring a prompt: 128 tokens, 10 causal blocks of width 512.
class Decoder(nn.Module):
    def __init__(self, vocab: int, seq_len: int, d_model: int, heads: int, depth: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.zeros(1, seq_len, d_model))
        self.blocks = Blocks(d_model, heads, depth, causal=True)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        return self.head(self.blocks(self.embed(tokens) + self.position))


def decoder(*, batch_size, device, precision="fp32", vocab=8192, seq_len=128, d_model=512, heads=8, depth=10):
    if device.type == "cpu":
        vocab, seq_len, d_model, heads, depth = 256, 16, 32, 2, 2
    model = Decoder(vocab, seq_len, d_model, heads, depth).to(device)
    tokens = torch.randint(vocab, (batch_size, seq_len), device=device)
    return Service(model, tokens, device, precision == "bf16", batch_size)
