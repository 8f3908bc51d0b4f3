"""Four training steps written as a user writes them: PyTorch's default options, nothing tuned, no CUDA graphs.

Each factory follows pytest-gpucolloc's workload protocol (``Workload("zoo.models:transformer_encoder", ...)``):
``factory(*, batch_size, device, precision, **options)`` returns an object whose ``train_step()`` performs one
optimiser step on ``device`` and whose ``samples_per_step`` says how many samples that step trained. Inputs are one
synthetic batch on the device. On a GPU each step takes several milliseconds on an H200 (the MLP: launch-bound, well
under one); on the CPU (the plugin's smoke mode) every model is built small, the same code path.

``ZOO_EXTRA_WORK=f`` (environment; default below) injects a known slowdown, to check a regression gate against a
real change: one extra, uncounted training step after every round(1/f) counted ones, so throughput falls by
1/(round(1/f) + 1): 0.04 -> one every 25 -> -3.8%, 0.02 -> one every 50 -> -2.0%. Exact over a long window; a
window of W steps holds W/N rounded up or down, so short windows of slow steps see it lumpily.
"""
import os

import torch
import torch.nn.functional as F
from torch import nn


def extra_step_every() -> int:
    """N of the injected slowdown (one extra step after every N), 0 for none."""
    text = os.environ.get("ZOO_EXTRA_WORK", "0")
    try:
        fraction = float(text)
    except ValueError:
        fraction = -1.0
    if not 0 <= fraction <= 0.5:
        raise ValueError(f"ZOO_EXTRA_WORK must be a fraction of extra work from 0 to 0.5, got {text!r}")
    return round(1 / fraction) if fraction else 0


class Step:
    """Counts steps and adds the injected extra work; subclasses define ``step()`` (returns the loss)."""

    def __init__(self, samples_per_step: int):
        self.samples_per_step = samples_per_step
        self.every = extra_step_every()
        self.steps = 0

    def train_step(self) -> None:
        self.step()
        self.steps += 1
        if self.every and self.steps % self.every == 0:
            self.step()  # the injected slowdown: uncounted work

    def step(self) -> torch.Tensor:
        raise NotImplementedError


# (a) A transformer encoder predicting a token at every position, bf16 autocast, AdamW.
class Encoder(nn.Module):
    def __init__(self, vocab: int, seq_len: int, d_model: int, heads: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.zeros(1, seq_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens) + self.position))


class EncoderStep(Step):
    def __init__(self, batch_size, device, precision, vocab=8192, seq_len=256, d_model=768, heads=12, layers=6):
        super().__init__(batch_size)
        if device.type == "cpu":
            vocab, seq_len, d_model, heads, layers = 512, 32, 64, 4, 2
        self.device, self.bf16 = device, precision == "bf16"
        self.model = Encoder(vocab, seq_len, d_model, heads, layers).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-4)
        self.tokens = torch.randint(vocab, (batch_size, seq_len), device=device)
        self.targets = torch.randint(vocab, (batch_size, seq_len), device=device)

    def step(self):
        self.optimizer.zero_grad()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            logits = self.model(self.tokens)
            loss = F.cross_entropy(logits.flatten(0, 1), self.targets.flatten())
        loss.backward()
        self.optimizer.step()
        return loss


def transformer_encoder(*, batch_size, device, precision="fp32", **options):
    return EncoderStep(batch_size, device, precision, **options)


# (b) A character-level LSTM language model, Adam, gradients clipped as RNN users do.
class CharLSTM(nn.Module):
    def __init__(self, vocab: int, embed: int, hidden: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, chars):
        out, _ = self.lstm(self.embed(chars))
        return self.head(out)


class CharLSTMStep(Step):
    def __init__(self, batch_size, device, precision, vocab=256, seq_len=128, embed=256, hidden=1024, layers=2):
        super().__init__(batch_size)
        if device.type == "cpu":
            seq_len, embed, hidden, layers = 16, 32, 64, 1
        self.device, self.bf16 = device, precision == "bf16"
        self.model = CharLSTM(vocab, embed, hidden, layers).to(device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        text = torch.randint(vocab, (batch_size, seq_len + 1), device=device)
        self.inputs, self.targets = text[:, :-1], text[:, 1:]  # predict the next character

    def step(self):
        self.optimizer.zero_grad()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            logits = self.model(self.inputs)
            loss = F.cross_entropy(logits.flatten(0, 1), self.targets.flatten())
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        return loss


def char_lstm(*, batch_size, device, precision="fp32", **options):
    return CharLSTMStep(batch_size, device, precision, **options)


# (c) A U-Net: a convolutional encoder and decoder with skip connections, per-pixel cross-entropy, Adam.
def double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    def __init__(self, channels: int, classes: int, width: int, depth: int):
        super().__init__()
        widths = [width * 2 ** i for i in range(depth + 1)]
        self.down = nn.ModuleList([double_conv(channels, widths[0])] +
                                  [double_conv(a, b) for a, b in zip(widths, widths[1:])])
        self.up = nn.ModuleList([nn.ConvTranspose2d(b, a, 2, stride=2) for a, b in zip(widths, widths[1:])])
        self.merge = nn.ModuleList([double_conv(2 * a, a) for a in widths[:-1]])
        self.head = nn.Conv2d(widths[0], classes, 1)

    def forward(self, x):
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        x = skips.pop()
        for up, merge in zip(reversed(self.up), reversed(self.merge)):
            x = merge(torch.cat([skips.pop(), up(x)], dim=1))
        return self.head(x)


class UNetStep(Step):
    def __init__(self, batch_size, device, precision, image_size=128, classes=8, width=32, depth=4):
        super().__init__(batch_size)
        if device.type == "cpu":
            image_size, width, depth = 32, 8, 3
        self.device, self.bf16 = device, precision == "bf16"
        self.model = UNet(3, classes, width, depth).to(device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.images = torch.randn(batch_size, 3, image_size, image_size, device=device)
        self.masks = torch.randint(classes, (batch_size, image_size, image_size), device=device)

    def step(self):
        self.optimizer.zero_grad()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            loss = F.cross_entropy(self.model(self.images), self.masks)
        loss.backward()
        self.optimizer.step()
        return loss


def unet(*, batch_size, device, precision="fp32", **options):
    return UNetStep(batch_size, device, precision, **options)


# (d) A small MLP classifier: a few tiny kernels a step, so the CPU issuing them sets the pace (launch-bound).
class MLPStep(Step):
    def __init__(self, batch_size, device, precision, features=64, hidden=256, layers=4, classes=10):
        super().__init__(batch_size)
        self.device, self.bf16 = device, precision == "bf16"
        sizes = [features] + [hidden] * layers
        blocks = [m for a, b in zip(sizes, sizes[1:]) for m in (nn.Linear(a, b), nn.ReLU())]
        self.model = nn.Sequential(*blocks, nn.Linear(hidden, classes)).to(device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.x = torch.randn(batch_size, features, device=device)
        self.y = torch.randint(classes, (batch_size,), device=device)

    def step(self):
        self.optimizer.zero_grad()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            loss = F.cross_entropy(self.model(self.x), self.y)
        loss.backward()
        self.optimizer.step()
        return loss


def mlp(*, batch_size, device, precision="fp32", **options):
    return MLPStep(batch_size, device, precision, **options)
