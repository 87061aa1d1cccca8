"""VGG19 for 32x32 images and 10 classes (16 convolutions with batch norm, as CIFAR-10 variants use; one
linear classifier), on random images: each class adds its own fixed pattern to Gaussian noise, so the
loss has something to fall on. Every gradient entry is non-zero: the dense case."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.models.workload import Workload, batch_generator, seeded

#: VGG19's convolution widths, "M" a 2x2 max pool
LAYOUT = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
          512, 512, 512, 512, "M")
CONFIGS = {
    "tiny": {"width_divisor": 32, "classes": 10, "batch": 4},
    "full": {"width_divisor": 1, "classes": 10, "batch": 8},
}


class VGG19(nn.Module):
    def __init__(self, width_divisor: int, classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for entry in LAYOUT:
            if entry == "M":
                layers.append(nn.MaxPool2d(2))
                continue
            width = int(entry) // width_divisor
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
            channels = width
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images).flatten(1))


def build(size: str, seed: int) -> Workload:
    config = CONFIGS[size]
    patterns = torch.randn((config["classes"], 3, 32, 32), generator=torch.Generator().manual_seed(seed + 1))

    def batch(rank: int, step: int) -> tuple[torch.Tensor, ...]:
        generator = batch_generator(seed, rank, step)
        labels = torch.randint(config["classes"], (config["batch"],), generator=generator)
        noise = torch.randn((config["batch"], 3, 32, 32), generator=generator)
        return patterns[labels] + noise, labels

    def loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        images, labels = batch
        return F.cross_entropy(model(images), labels)

    module = seeded(seed, lambda: VGG19(config["width_divisor"], config["classes"]))
    return Workload(name="vgg19", config=config, module=module, batch=batch, loss=loss, lr=0.01,
                    momentum=0.9, dense_gradients=True)
