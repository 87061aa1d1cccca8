"""BERT-base as a masked language model, defined with torch.nn (no new dependency): token, position and
segment embeddings, 12 post-norm encoder layers (hidden 768, 12 heads, feed-forward 3072, GELU), and the
MLM head (a dense layer, GELU, layer norm, and a decoder tied to the token embeddings). Trained on
Zipf-distributed tokens with 15% of the positions masked. The tied decoder makes every row of the
embedding's gradient non-zero: the dense case."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.models.workload import Workload, batch_generator, seeded, zipf_tokens

CONFIGS = {
    "tiny": {"vocabulary": 128, "hidden": 16, "layers": 2, "heads": 2, "ffn": 32, "sequence": 16, "batch": 2},
    # BERT-mini's geometry (Turc et al. 2019) with BERT-base's vocabulary, sequence and head: what the
    # emulation runs, where BERT-base's 437 MB per step through the emulated switch takes minutes
    "small": {"vocabulary": 30_522, "hidden": 256, "layers": 4, "heads": 4, "ffn": 1024, "sequence": 128,
              "batch": 2},
    "full": {"vocabulary": 30_522, "hidden": 768, "layers": 12, "heads": 12, "ffn": 3072, "sequence": 128,
             "batch": 2},
}
#: the token that replaces a masked one, and the label of a position the loss ignores
MASK_TOKEN, IGNORED = 1, -100
MASKED_FRACTION = 0.15


class BertMLM(nn.Module):
    def __init__(self, vocabulary: int, hidden: int, layers: int, heads: int, ffn: int,
                 sequence: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocabulary, hidden)
        self.positions = nn.Embedding(sequence, hidden)
        self.segments = nn.Embedding(2, hidden)
        self.embedding_norm = nn.LayerNorm(hidden, eps=1e-12)
        layer = nn.TransformerEncoderLayer(hidden, heads, ffn, dropout=0.0, activation="gelu",
                                           batch_first=True, layer_norm_eps=1e-12)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.transform = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.LayerNorm(hidden, eps=1e-12))
        self.decoder_bias = nn.Parameter(torch.zeros(vocabulary))
        for table in (self.tokens, self.positions, self.segments):
            nn.init.normal_(table.weight, std=0.02)  # BERT's initialiser: unit-variance rows, tied to the
            # decoder, would start the logits at hundreds

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1])
        hidden = self.tokens(tokens) + self.positions(positions) + self.segments(torch.zeros_like(tokens))
        hidden = self.encoder(self.embedding_norm(hidden))
        return F.linear(self.transform(hidden), self.tokens.weight, self.decoder_bias)


def build(size: str, seed: int) -> Workload:
    config = CONFIGS[size]
    shape = (config["batch"], config["sequence"])

    def batch(rank: int, step: int) -> tuple[torch.Tensor, ...]:
        generator = batch_generator(seed, rank, step)
        # ids 0 and 1 are reserved (padding, [MASK]): words are 2 and up
        tokens = zipf_tokens(generator, config["vocabulary"] - 2, shape) + 2
        masked = torch.rand(shape, generator=generator) < MASKED_FRACTION
        masked[:, 0] = True  # at least one position per sequence
        labels = torch.where(masked, tokens, torch.full_like(tokens, IGNORED))
        return tokens.masked_fill(masked, MASK_TOKEN), labels

    def loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        tokens, labels = batch
        return F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten(), ignore_index=IGNORED)

    options = {key: config[key] for key in ("vocabulary", "hidden", "layers", "heads", "ffn", "sequence")}
    return Workload(name="bert", config=config, module=seeded(seed, lambda: BertMLM(**options)), batch=batch,
                    loss=loss, lr=0.01, dense_gradients=True)
