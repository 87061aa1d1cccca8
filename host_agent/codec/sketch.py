"""The Count Sketch: ``block``-wide int32 cells merged by ADD, peeled over known candidates.

Each candidate item adds its ``block`` values to ``arity`` distinct cells. Signs are omitted (all +1):
the decoder never estimates, it peels, and peeling needs only sums over known candidates.

Two layouts, both derived from the agreed number of cells alone, so every worker derives the same one:

* **plain** (fewer than ``FUSE_MIN_CELLS`` cells): 3 sub-tables, one cell in each. Peeling a random
  3-partite hypergraph succeeds w.h.p. above ``PEEL_THRESHOLD`` ~= 1.2218 cells per candidate (the 2-core
  threshold 1/0.8185).
* **fused** (spatially coupled, the layout of binary fuse filters): ``starts + 3`` segments of equal
  length; an item hashes to a start segment s < ``starts`` and to one cell in each of the segments s..s+3.
  The end segments are lightly loaded, peel first, and peeling then runs as a wave along the chain, down
  to ~1.065 cells per candidate for a million candidates instead of 1.22 (measured: docs/codec.md). The
  segments are also the partitions that keep decoding in cache: an item's cells lie within 4 consecutive
  segments, so items taken in order of their start touch a window of a few segments at a time.

A job may ask for the plain layout at every size (``layout="plain"``, a job property: every worker must
agree): its peeling takes ~30 parallel rounds at the default case where the fused layout's wave takes
~730, which is what bounds a GPU's peel (docs/codec.md), for ~10% more bytes.

Capacity: ``threshold(K) * (1 + margin)`` cells per expected candidate (plus slack), rounded up to fill
whole packets; ``threshold`` is the measured peeling threshold of the layout at that size.
"""

from __future__ import annotations

import math

import torch

from . import gpu
from .arith import wrap_int32
from .cpu import kernel_threads, native
from .hashing import hash_items, reduce_range
from .sketch_spec import FUSE_MIN_CELLS, TABLES, SketchSpec

PEEL_THRESHOLD = 1.2218
DEFAULT_MARGIN = 0.03
#: Fused threshold ~= 1.006 + 2.1 / K^(1/4) cells per candidate, at least 1.065 (fitted to measured
#: peeling, docs/codec.md). Only IEEE-exact operations (sqrt, *, +): every worker gets the same cells.
_FUSE_FLOOR, _FUSE_BASE, _FUSE_SCALE = 1.065, 1.006, 2.1
_FUSE_SLACK = 64
#: The layouts a job may ask for: ``fused`` from FUSE_MIN_CELLS up (plain below), or ``plain`` always.
LAYOUTS = ("fused", "plain")


def resolve_layout(layout: str, device: torch.device) -> str:
    """``auto`` is plain for a CUDA tensor (its peel takes ~30 rounds where the fused wave takes ~730),
    fused otherwise; a named layout stands."""
    if layout != "auto":
        return layout
    return "plain" if device.type == "cuda" else "fused"


def fuse_threshold(candidates: float) -> float:
    """Cells per candidate the fused layout needs to peel at this size (measured, then fitted)."""
    return max(_FUSE_FLOOR, _FUSE_BASE + _FUSE_SCALE / math.sqrt(math.sqrt(max(1.0, candidates))))


def sketch_cells(expected_candidates: float, margin: float, block: int, lanes: int, layout: str = "fused"
                 ) -> int:
    """Cells for ``expected_candidates``: the layout's threshold * (1 + margin) per candidate + slack,
    packet-filled. The fused rule applies where it gives a fused sketch, the plain one below (and
    always in the plain layout)."""
    if margin < 0:
        raise ValueError(f"margin must be >= 0, not {margin}")
    k = max(0.0, expected_candidates)
    want = fuse_threshold(k) * (1.0 + margin) * k + _FUSE_SLACK
    if want < FUSE_MIN_CELLS or layout == "plain":
        want = PEEL_THRESHOLD * (1.0 + margin) * k + 3.0 * math.sqrt(k) + 3 * TABLES
    cells = TABLES * math.ceil(want / TABLES)
    # Whole packets cost the same whether full or not: use the room.
    words = math.ceil(cells * block / lanes) * lanes
    return max(cells, TABLES * (words // block // TABLES))


def cells_per_candidate(expected_candidates: float, margin: float, layout: str = "fused") -> float:
    """Sketch cells per extra candidate at this size (the layout's rate, slack aside), for the index's
    cost model."""
    k = max(0.0, expected_candidates)
    fused = fuse_threshold(k) * (1.0 + margin)
    if layout == "fused" and fused * k + _FUSE_SLACK >= FUSE_MIN_CELLS:
        return fused
    return PEEL_THRESHOLD * (1.0 + margin)


def cell_ids(spec: SketchSpec, items: torch.Tensor) -> torch.Tensor:
    """(arity, K) int64 cell numbers of each item: cell t lies in segment start + t."""
    seg = spec.segment_cells
    start_seed, seeds = spec.seeds()
    out = torch.empty((spec.arity, items.numel()), dtype=torch.int64, device=items.device)
    base = torch.zeros_like(items, dtype=torch.int64)
    if spec.starts > 1:
        base = reduce_range(hash_items(items, start_seed), spec.starts).mul_(seg)
    for t in range(spec.arity):
        out[t] = reduce_range(hash_items(items, seeds[t]), seg).add_(base).add_(t * seg)
    return out


def encode_sketch(spec: SketchSpec, items: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """This worker's sketch words: each item's ``block`` int32 values added to its cells, mod 2^32.

    ``values`` is (K, block) int32; ``items`` distinct. On a CPU the C kernel adds them in order of start
    segment (in cache); on the GPU path a Triton kernel adds them with int32 atomics; otherwise torch
    accumulates in int64 and wraps to int32 at the end (the same words).
    """
    if gpu.on_path():
        return gpu.encode_sketch(spec, items, values, None, False)
    if items.device.type == "cpu" and native is not None:
        return encode_sketch_native(spec, items, values)
    return encode_sketch_torch(spec, items, values)


def encode_sketch_torch(spec: SketchSpec, items: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """:func:`encode_sketch` in torch, on any device (the reference)."""
    cells = torch.zeros((spec.cells, spec.block), dtype=torch.int64, device=items.device)
    if items.numel():
        ids = cell_ids(spec, items)
        v = values.to(torch.int64)
        for t in range(spec.arity):
            cells.index_add_(0, ids[t], v)
    return wrap_int32(cells.view(-1))


def encode_sketch_native(
    spec: SketchSpec, items: torch.Tensor, values: torch.Tensor, threads: int | None = None
) -> torch.Tensor:
    """:func:`encode_sketch` by the compiled kernel (CPU tensors); ``threads`` as in ``peel_native``."""
    k = items.numel()
    if items.dtype != torch.int64 or values.dtype != torch.int32 or values.shape != (k, spec.block):
        raise ValueError(f"encode_sketch wants int64 items and ({k}, {spec.block}) int32 values, not"
                         f" {items.dtype} items and {values.dtype} {tuple(values.shape)} values")
    items, values = items.contiguous(), values.contiguous()
    out = torch.zeros(spec.words, dtype=torch.int32)
    native.encode_sketch(k, spec.geometry(), items.data_ptr(), values.data_ptr(), out.data_ptr(),
                         kernel_threads() if threads is None else threads)
    return out
