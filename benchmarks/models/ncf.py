"""Neural collaborative filtering (He et al. 2017): GMF (the element-wise product of a user and an item
embedding) beside an MLP over two other embeddings, one logit from both. Trained on the demo's synthetic
Zipf clicks (``lhc_demo.recsys.SyntheticClicks``): a batch touches a few percent of the tables' rows, so
the gradient buckets are mostly zeros."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.models.workload import Workload, seeded
from lhc_demo.recsys import DemoConfig, SyntheticClicks

CONFIGS = {
    "tiny": {"users": 64, "items": 64, "gmf_dim": 4, "mlp_dim": 4, "layers": (8, 4), "batch": 16},
    "full": {"users": 100_000, "items": 50_000, "gmf_dim": 16, "mlp_dim": 32, "layers": (64, 32, 16),
             "batch": 256},
}


class NCF(nn.Module):
    def __init__(self, users: int, items: int, gmf_dim: int, mlp_dim: int, layers: tuple[int, ...]) -> None:
        super().__init__()
        self.gmf_users, self.gmf_items = nn.Embedding(users, gmf_dim), nn.Embedding(items, gmf_dim)
        self.mlp_users, self.mlp_items = nn.Embedding(users, mlp_dim), nn.Embedding(items, mlp_dim)
        stack: list[nn.Module] = []
        width = 2 * mlp_dim
        for out in layers:
            stack += [nn.Linear(width, out), nn.ReLU()]
            width = out
        self.mlp = nn.Sequential(*stack)
        self.predict = nn.Linear(gmf_dim + width, 1)
        for table in (self.gmf_users, self.gmf_items, self.mlp_users, self.mlp_items):
            nn.init.normal_(table.weight, std=0.3)

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        gmf = self.gmf_users(users) * self.gmf_items(items)
        mlp = self.mlp(torch.cat([self.mlp_users(users), self.mlp_items(items)], dim=1))
        return self.predict(torch.cat([gmf, mlp], dim=1)).squeeze(1)


def build(size: str, seed: int) -> Workload:
    config = CONFIGS[size]
    model_options = {key: config[key] for key in ("users", "items", "gmf_dim", "mlp_dim", "layers")}
    clicks = SyntheticClicks(DemoConfig(users=config["users"], items=config["items"], batch=config["batch"],
                                        seed=seed))

    def loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        users, items, clicked = batch
        return F.binary_cross_entropy_with_logits(model(users, items), clicked)

    return Workload(name="ncf", config=config, module=seeded(seed, lambda: NCF(**model_options)),
                    batch=clicks.batch, loss=loss, lr=1.0, dense_gradients=False)
