"""What every model of the training benchmark offers its worker: the module, a batch per (rank, step), the
loss of a batch and the optimizer, all fixed by one seed, so that every way of aggregating the gradients
sees the same weights and the same batches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

#: "small" only where a model defines it (BERT: the emulation's size)
SIZES = ("tiny", "small", "full")
#: The batch generator's seed for (seed, rank, step); ranks of a run lie below this.
_MAX_RANKS = 1024


@dataclass
class Workload:
    """One model family at one size: ``batch(rank, step)`` is the same on every run, ``loss(batch)`` is
    computed by ``module`` (or its DDP wrapper, passed as ``model``)."""

    name: str
    #: the model's layout, as reported (sizes, widths, batch)
    config: dict[str, Any]
    module: nn.Module
    batch: Callable[[int, int], tuple[torch.Tensor, ...]]
    loss: Callable[[nn.Module, tuple[torch.Tensor, ...]], torch.Tensor]
    lr: float
    #: True when every gradient entry is (almost) always non-zero: top-k is offered for these
    dense_gradients: bool
    momentum: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """SGD over ``model``'s parameters (the DDP wrapper's are the module's)."""
        return torch.optim.SGD(model.parameters(), lr=self.lr, momentum=self.momentum)

    def parameters(self) -> int:
        return sum(p.numel() for p in self.module.parameters())


def seeded(seed: int, make: Callable[[], nn.Module]) -> nn.Module:
    """``make()`` with torch's default initialisers drawing from ``seed`` (torch's global generator is
    left as it was), so every rank and every run starts from the same weights."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def batch_generator(seed: int, rank: int, step: int) -> torch.Generator:
    """The generator of rank ``rank``'s batch at ``step``."""
    if not 0 <= rank < _MAX_RANKS:
        raise ValueError(f"rank {rank} outside 0..{_MAX_RANKS - 1}")
    return torch.Generator().manual_seed((seed * 1_000_003 + step) * _MAX_RANKS + rank)


def zipf_tokens(generator: torch.Generator, vocabulary: int, shape: tuple[int, ...],
                exponent: float = 1.0) -> torch.Tensor:
    """Token ids drawn from a Zipf law over ``vocabulary`` (id 0 the most frequent), as words are."""
    weights = torch.arange(1, vocabulary + 1, dtype=torch.float64).pow(-exponent)
    count = 1
    for size in shape:
        count *= size
    return torch.multinomial(weights, count, True, generator=generator).view(shape)
