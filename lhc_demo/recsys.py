"""The demo's workload: an NCF-style recommender trained on synthetic, Zipf-distributed clicks.

Why this model: its gradient is dominated by two embedding tables of which one step touches only the rows
of the users and items in its batch. With Zipf popularity a worker's batch touches about 1% of the rows,
so DDP's dense gradient buckets are about 99% zeros: the case lossless homomorphic compression is for.

Everything is a pure function of the seed, the rank and the step, so the three runs of the demo (DDP
allreduce, dense through the switch, lhc through the switch) see exactly the same batches, and the same
held-out set on which the demo measures what the model learned.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class DemoConfig:
    """Model and data sizes. The defaults give about 1% of embedding rows per worker and step, and a
    held-out AUC near 0.77 after the demo's 20 steps with 4 workers."""

    users: int = 20_000
    items: int = 20_000
    dim: int = 16
    hidden: int = 32
    batch: int = 256
    zipf: float = 0.9
    #: SGD's learning rate for the MLP.
    lr: float = 2.0
    #: SGD's learning rate for the embedding tables. A row's gradient is its few samples' share of a mean
    #: over the whole global batch (W * batch samples), so at the MLP's rate the tables would barely move
    #: in the demo's steps; this rate lets the popular rows learn within them (and stays stable).
    embedding_lr: float = 600.0
    #: samples in the held-out set
    held_out: int = 8192
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


class Recommender(nn.Module):
    """Neural collaborative filtering: user and item embeddings, an MLP over their concatenation."""

    def __init__(self, config: DemoConfig) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(config.seed)
        # Dense (sparse=False) embeddings: DDP puts their gradients into its buckets, mostly zeros.
        self.users = nn.Embedding(config.users, config.dim)
        self.items = nn.Embedding(config.items, config.dim)
        self.mlp = nn.Sequential(
            nn.Linear(2 * config.dim, config.hidden), nn.ReLU(), nn.Linear(config.hidden, 1)
        )
        with torch.no_grad():  # deterministic from the seed, whatever torch's global RNG holds
            for module in self.modules():
                if isinstance(module, nn.Embedding):
                    module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * 0.3)
                elif isinstance(module, nn.Linear):
                    scale = module.in_features**-0.5
                    module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * scale)
                    module.bias.zero_()

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        features = torch.cat([self.users(users), self.items(items)], dim=1)
        return self.mlp(features).squeeze(1)


def make_optimizer(model: Recommender, config: DemoConfig) -> torch.optim.SGD:
    """Plain SGD (linear in the gradients, so the runs' small differences in summing them stay small),
    with the tables at ``config.embedding_lr`` and the MLP at ``config.lr``."""
    tables = [*model.users.parameters(), *model.items.parameters()]
    return torch.optim.SGD(
        [{"params": tables, "lr": config.embedding_lr}, {"params": model.mlp.parameters()}], lr=config.lr
    )


def _zipf_weights(count: int, exponent: float) -> torch.Tensor:
    ranks = torch.arange(1, count + 1, dtype=torch.float64)
    return ranks.pow(-exponent)


class SyntheticClicks:
    """Batches of (user, item, clicked). Popularity follows Zipf; a hidden affinity (an item's quality
    plus how user and item tastes agree) decides the label, so the model has something real to learn: the
    popular items' embeddings first, and the held-out AUC rises within the demo's steps."""

    #: The sample stream of this (never a worker's) rank is the held-out set; workers' ranks lie below it.
    HELD_OUT_RANK = 1023

    def __init__(self, config: DemoConfig) -> None:
        self.config = config
        generator = torch.Generator().manual_seed(config.seed + 1)
        self._user_weights = _zipf_weights(config.users, config.zipf)
        self._item_weights = _zipf_weights(config.items, config.zipf)
        # Popular ids are scattered over the table, as real ids are.
        self._user_ids = torch.randperm(config.users, generator=generator)
        self._item_ids = torch.randperm(config.items, generator=generator)
        self._user_taste = torch.randn(config.users, 4, generator=generator)
        self._item_taste = torch.randn(config.items, 4, generator=generator)
        self._item_quality = torch.randn(config.items, generator=generator) * 2

    def batch(self, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Worker ``rank``'s batch at ``step``: the same on every run."""
        if not 0 <= rank < self.HELD_OUT_RANK:
            raise ValueError(f"rank {rank} outside 0..{self.HELD_OUT_RANK - 1}")
        return self._draw(rank, step, self.config.batch)

    def held_out(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``config.held_out`` samples from the same process on a seed no training batch uses (a popular
        pair may still occur in both, as it would in held-out clicks of real users)."""
        return self._draw(self.HELD_OUT_RANK, 0, self.config.held_out)

    def _draw(self, rank: int, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed((self.config.seed * 1_000_003 + step) * 1024 + rank)
        users = self._user_ids[torch.multinomial(self._user_weights, size, True, generator=generator)]
        items = self._item_ids[torch.multinomial(self._item_weights, size, True, generator=generator)]
        affinity = (self._user_taste[users] * self._item_taste[items]).sum(1) + self._item_quality[items]
        return users, items, (affinity > 0).float()

    def touched_rows(self, rank: int, step: int) -> float:
        """The fraction of embedding rows that worker ``rank``'s batch at ``step`` updates."""
        users, items, _ = self.batch(rank, step)
        touched = users.unique().numel() + items.unique().numel()
        return touched / (self.config.users + self.config.items)
