"""A word-level LSTM language model (Zaremba et al.'s medium model: 2 layers of 650, a 10,000-word
vocabulary, 35 steps of backpropagation through time), on Zipf-distributed tokens. The input embedding's
gradient touches only the rows of the batch's words; the LSTM's and the softmax's are dense."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.models.workload import Workload, batch_generator, seeded, zipf_tokens

CONFIGS = {
    "tiny": {"vocabulary": 64, "width": 16, "layers": 2, "bptt": 8, "batch": 4},
    "full": {"vocabulary": 10_000, "width": 650, "layers": 2, "bptt": 35, "batch": 8},
}


class WordLSTM(nn.Module):
    def __init__(self, vocabulary: int, width: int, layers: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, width)
        self.lstm = nn.LSTM(width, width, num_layers=layers, batch_first=True)
        self.decoder = nn.Linear(width, vocabulary)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embedding(tokens))
        return self.decoder(hidden)


def build(size: str, seed: int) -> Workload:
    config = CONFIGS[size]

    def batch(rank: int, step: int) -> tuple[torch.Tensor, ...]:
        tokens = zipf_tokens(batch_generator(seed, rank, step), config["vocabulary"],
                             (config["batch"], config["bptt"] + 1))
        return tokens[:, :-1], tokens[:, 1:]

    def loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        inputs, targets = batch
        return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())

    module = seeded(seed, lambda: WordLSTM(config["vocabulary"], config["width"], config["layers"]))
    return Workload(name="lstm", config=config, module=module, batch=batch, loss=loss, lr=1.0,
                    dense_gradients=False)
