"""Parallel peeling of an aggregated sketch over known candidates.

Every worker knows the candidates (from the aggregated index) and the hashes, so it computes each cell's
candidate count and the sum of its candidates' positions locally; nothing of that is transmitted. A cell
whose count is 1 is *pure*: its value is exactly its one candidate's aggregated value (mod 2^32). Each
round takes every pure cell at once, records those candidates, and subtracts them from their cells.

Only cells touched in a round can become pure in the next, so each round works on the touched cells
(O(peeled candidates)), not on the whole sketch: the total work is O(candidates), whatever the number of
rounds. Values are kept in int64 while peeling (no overflow: each subtraction adds at most 2^32 in
magnitude) and wrapped to int32 at the end; any pure cell of a candidate gives the same value, so the
result does not depend on which one is used, on the order of atomics, or on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .arith import wrap_int32
from .sketch import TABLES


@dataclass
class PeelResult:
    values: torch.Tensor  # (K, block) int32: recovered sums, zero where not peeled
    peeled: torch.Tensor  # (K,) bool
    rounds: int

    @property
    def residue(self) -> torch.Tensor:
        """Positions (into the candidate list) of the candidates peeling could not recover."""
        return torch.nonzero(~self.peeled).squeeze(1)


def peel(ids: torch.Tensor, cells: torch.Tensor) -> PeelResult:
    """Peel ``cells`` ((m, block) int32, aggregated) given each candidate's cells ``ids`` ((3, K) int64)."""
    device = cells.device
    k = ids.shape[1]
    m, block = cells.shape
    flat = ids.reshape(-1)
    position = torch.arange(k, device=device).repeat(TABLES)
    count = torch.zeros(m, dtype=torch.int64, device=device).index_add_(
        0, flat, torch.ones_like(flat)
    )
    possum = torch.zeros(m, dtype=torch.int64, device=device).index_add_(0, flat, position)
    acc = cells.to(torch.int64)
    values = torch.zeros((k, block), dtype=torch.int64, device=device)
    peeled = torch.zeros(k, dtype=torch.bool, device=device)
    frontier = torch.nonzero(count == 1).squeeze(1)
    rounds = 0
    while frontier.numel():
        rounds += 1
        who = possum[frontier]
        # A candidate may be alone in two or three cells at once: keep one cell per candidate.
        who, order = torch.sort(who, stable=True)
        first = torch.ones_like(who, dtype=torch.bool)
        first[1:] = who[1:] != who[:-1]
        who = who[first]
        pure = frontier[order[first]]
        v = acc[pure]
        values[who] = v
        peeled[who] = True
        touched = ids[:, who].reshape(-1)
        count.index_add_(0, touched, torch.full_like(touched, -1))
        possum.index_add_(0, touched, -who.repeat(TABLES))
        acc.index_add_(0, touched, -v.repeat(TABLES, 1))
        frontier = touched[count[touched] == 1]
    return PeelResult(wrap_int32(values.view(-1)).view(k, block), peeled, rounds)
