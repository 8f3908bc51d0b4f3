"""Worker-side data loading for ``Workload(..., data="loader")``: JPEG images generated at start and kept in
memory, decoded and augmented on the CPU for every sample by ``torch.utils.data.DataLoader`` workers, as a real
image-classification job is fed (nothing is downloaded; the CPU work per sample is the real one).
"""
from __future__ import annotations

import io
import time

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

IMAGES = 64  # distinct encoded images (made at start: ~17 ms each at 256 px); drawn with replacement, for ever
SOURCE_SCALE = 8 / 7  # stored images are larger than the crop, as ImageNet's are resized before cropping
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def encoded_images(count: int, size: int, seed: int = 0) -> list[bytes]:
    """``count`` JPEG-encoded ``size`` x ``size`` images: smooth random colour fields with fine noise, so that
    they compress and decode like photographs rather than like white noise."""
    from PIL import Image

    generator = torch.Generator().manual_seed(seed)
    images = []
    for _ in range(count):
        coarse = torch.rand(1, 3, max(2, size // 8), max(2, size // 8), generator=generator)
        smooth = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)[0]
        pixels = ((smooth * 0.9 + torch.rand(3, size, size, generator=generator) * 0.1) * 255).to(torch.uint8)
        encoded = io.BytesIO()
        Image.fromarray(pixels.permute(1, 2, 0).numpy()).save(encoded, format="JPEG", quality=90)
        images.append(encoded.getvalue())
    return images


class JpegImages(Dataset):
    """Encoded images in memory; each item is decoded (Pillow, as torchvision's ImageFolder does), randomly
    resized-cropped to ``crop``, maybe flipped and normalised (torchvision transforms v2), with a label."""

    def __init__(self, crop: int, num_classes: int, count: int = IMAGES):
        from torchvision.transforms import v2

        self.images = encoded_images(count, max(crop + 1, round(crop * SOURCE_SCALE)))
        self.labels = torch.randint(0, num_classes, (count,), generator=torch.Generator().manual_seed(1)).tolist()
        self.transform = v2.Compose([v2.RandomResizedCrop(crop, antialias=True), v2.RandomHorizontalFlip(),
                                     v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        image = Image.open(io.BytesIO(self.images[index])).convert("RGB")
        return self.transform(image), self.labels[index]


class LoaderFeed:
    """Batches from a DataLoader, copied into the step's own input tensors (pinned memory, non-blocking copies).
    ``wait_s``: the time the training process waited for a batch, issuing no work (the loader held the GPU back)."""

    def __init__(self, crop: int, num_classes: int, batch_size: int, workers: int, device: torch.device):
        loader = DataLoader(JpegImages(crop, num_classes), batch_size=batch_size, num_workers=workers,
                            sampler=RandomSampler(range(IMAGES), replacement=True, num_samples=1 << 62),
                            pin_memory=device.type == "cuda", drop_last=True, persistent_workers=workers > 0)
        self.batches = iter(loader)  # one endless epoch: no pipeline drain at epoch ends
        self.wait_s = 0.0

    def next_into(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        began = time.perf_counter()
        batch_images, batch_labels = next(self.batches)
        self.wait_s += time.perf_counter() - began
        images.copy_(batch_images, non_blocking=True)
        labels.copy_(batch_labels, non_blocking=True)
