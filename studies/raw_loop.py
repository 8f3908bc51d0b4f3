"""A minimal hand-written training loop: the reference the harness must not fall behind.

    python studies/raw_loop.py resnet26 128 --warmup 5 --seconds 10
prints one JSON line: {"model", "batch_size", "samples_per_s", "seconds", "steps"}.
"""
import argparse
import json
import time

import torch
from torch import nn
from torchvision.models import resnet

SHAPES = {"resnet26": (32, 10), "resnet50": (64, 1000), "resnet152": (224, 1000)}


def network(name: str, classes: int) -> nn.Module:
    if name == "resnet26":
        return resnet.ResNet(resnet.Bottleneck, [2, 2, 2, 2], num_classes=classes)
    return getattr(resnet, name)(num_classes=classes)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", choices=sorted(SHAPES))
    parser.add_argument("batch_size", type=int)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()

    size, classes = SHAPES[args.model]
    torch.backends.cudnn.benchmark = True
    device = torch.device("cuda")
    model = network(args.model, classes).to(device, memory_format=torch.channels_last).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(args.batch_size, 3, size, size, device=device).to(memory_format=torch.channels_last)
    y = torch.randint(0, classes, (args.batch_size,), device=device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()

    end = time.monotonic() + args.warmup
    while time.monotonic() < end:
        step()
    torch.cuda.synchronize()
    start = time.monotonic()
    steps = 0
    while time.monotonic() - start < args.seconds:
        step()
        steps += 1
    torch.cuda.synchronize()
    elapsed = time.monotonic() - start
    print(json.dumps({"model": args.model, "batch_size": args.batch_size, "steps": steps, "seconds": elapsed,
                      "samples_per_s": steps * args.batch_size / elapsed}))


if __name__ == "__main__":
    main()
