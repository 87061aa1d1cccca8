"""The partitioned Count Sketch: r = 3 sub-tables of ``block``-wide int32 cells, merged by ADD.

Each candidate item lands in one cell of each sub-table (so its three cells are always distinct) and adds
its ``block`` values to all three. Signs are omitted (all +1): the decoder never estimates, it peels, and
peeling needs only sums over known candidates; a sign would cost a hash and change nothing.

Capacity: peeling a random 3-partite hypergraph succeeds with high probability when there are more than
``PEEL_THRESHOLD`` ~= 1.2218 cells per candidate (the 2-core threshold 1/0.8185). The sketch gets
``PEEL_THRESHOLD * (1 + margin)`` cells per expected candidate, plus a slack of a few sqrt(K) cells
that matters only for small K, rounded up to fill whole packets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .arith import wrap_int32
from .hashing import derive_seed, hash_items, reduce_range

TABLES = 3
PEEL_THRESHOLD = 1.2218
DEFAULT_MARGIN = 0.03


@dataclass(frozen=True)
class SketchSpec:
    """The agreed shape of one round's sketch (identical on every worker)."""

    cells: int  # a multiple of TABLES
    block: int
    seed: int

    @property
    def table_cells(self) -> int:
        return self.cells // TABLES

    @property
    def words(self) -> int:
        return self.cells * self.block


def sketch_cells(expected_candidates: float, margin: float, block: int, lanes: int) -> int:
    """Cells for ``expected_candidates``: threshold * (1 + margin) per candidate + slack, packet-filled."""
    if margin < 0:
        raise ValueError(f"margin must be >= 0, not {margin}")
    k = max(0.0, expected_candidates)
    want = PEEL_THRESHOLD * (1.0 + margin) * k + 3.0 * math.sqrt(k) + 3 * TABLES
    cells = TABLES * math.ceil(want / TABLES)
    # Whole packets cost the same whether full or not: use the room.
    words = math.ceil(cells * block / lanes) * lanes
    return max(cells, TABLES * (words // block // TABLES))


def cell_ids(spec: SketchSpec, items: torch.Tensor) -> torch.Tensor:
    """(3, K) int64 cell numbers of each item: table t's cell lies in [t * table_cells, (t+1) * ...)."""
    out = torch.empty((TABLES, items.numel()), dtype=torch.int64, device=items.device)
    for t in range(TABLES):
        h = hash_items(items, derive_seed(spec.seed, t))
        out[t] = reduce_range(h, spec.table_cells).add_(t * spec.table_cells)
    return out


def encode_sketch(spec: SketchSpec, items: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """This worker's sketch words: each item's ``block`` int32 values added to its 3 cells, mod 2^32.

    ``values`` is (K, block) int32. Accumulated in int64 (no overflow), wrapped to int32 at the end.
    """
    cells = torch.zeros((spec.cells, spec.block), dtype=torch.int64, device=items.device)
    if items.numel():
        ids = cell_ids(spec, items)
        v = values.to(torch.int64)
        for t in range(TABLES):
            cells.index_add_(0, ids[t], v)
    return wrap_int32(cells.view(-1))
