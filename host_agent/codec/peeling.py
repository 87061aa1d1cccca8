"""Parallel peeling of an aggregated sketch over known candidates.

Every worker knows the candidates (from the aggregated index) and the hashes, so it computes each cell's
candidate count and the sum of its candidates' positions locally; nothing of that is transmitted. A cell
whose count is 1 is *pure*: its value is exactly its one candidate's aggregated value (mod 2^32). Each
round takes every pure cell at once, records those candidates, and subtracts them from their cells.

Only cells touched in a round can become pure in the next, so each round works on the touched cells
(O(peeled candidates)), not on the whole sketch: the total work is O(candidates), whatever the number of
rounds. Values are kept in int64 while peeling (no overflow: each subtraction adds less than 2^32 in
magnitude) and wrapped to int32 at the end. A candidate alone in two or three cells at once is peeled
once: any of its pure cells holds the same value, so the result does not depend on which one is used,
on the order of atomics, or on the device.

Peeling ends in the same state (the 2-core of the hypergraph) in any order, and a peeled candidate's
value does not depend on which of its pure cells gave it; so two implementations give the same candidates
and values (tested against each other):

* the parallel rounds here, in torch, for CUDA and as the portable fallback (the reference). On CPU,
  ``gather``, ``scatter_add_`` and ``index_select`` on 1-D tensors are several times faster than advanced
  indexing (``t[idx]``) and a sort, so the loop uses only those. In the fused layout the rounds follow
  the wave along the chain of segments: hundreds of small rounds;
* ``gpu/peeling.py``, on the GPU path: no rounds; Triton programs serve one queue of pure cells, each
  peeling a cell as soon as it is found pure, with no barrier between them (``rounds`` is None);
* ``kernels_peel.c``, a compiled kernel for CPU tensors, built when the package is installed with a C
  compiler present: candidates inserted start segment by start segment, and each segment peeled as soon
  as no later candidate can touch it, so that the peeling follows the insertion as a wave through a
  window of a few segments (in cache); the chain's two halves on two threads. It has no rounds
  (``rounds`` is None). Its 8-byte records count at most 31 candidates per cell and 2^26 in all; beyond
  that (never at random, a bucket of 64M candidates at least) the torch rounds run instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import gpu
from .arith import wrap_int32
from .cpu import kernel_threads, native, require_native
from .sketch import cell_ids
from .sketch_spec import SketchSpec


@dataclass
class PeelResult:
    values: torch.Tensor  # (K, block) int32: recovered sums, zero where not peeled
    peeled: torch.Tensor  # (K,) bool
    rounds: int | None  # parallel rounds of the torch code; None from the CPU and the GPU kernels
    complete: bool | None = None  # whether every candidate was peeled, where already counted

    @property
    def residue(self) -> torch.Tensor:
        """Positions (into the candidate list) of the candidates peeling could not recover."""
        if self.complete:
            return torch.empty(0, dtype=torch.int64, device=self.peeled.device)
        return torch.nonzero(~self.peeled).squeeze(1)


_SHIFT = 40  # a cell's state is count * 2^40 + sum of its candidates' positions (< 2^40)
_POS_MASK = (1 << _SHIFT) - 1


def peel(spec: SketchSpec, items: torch.Tensor, cells: torch.Tensor) -> PeelResult:
    """Peel the aggregated sketch ``cells`` ((spec.cells, block) int32) over the candidate ``items`` (int64,
    distinct). Neither input is modified."""
    if gpu.on_path():
        return PeelResult(*gpu.peel(spec, items, cells))
    if cells.device.type == "cpu" and native is not None:
        return peel_native(spec, items, cells)
    return peel_parallel(cell_ids(spec, items), cells)


def peel_native(spec: SketchSpec, items: torch.Tensor, cells: torch.Tensor, threads: int | None = None
                ) -> PeelResult:
    """:func:`peel` by the compiled kernel (CPU tensors only); it hashes the items itself. ``threads``:
    at most this many (default :func:`kernel_threads`); the results do not depend on it."""
    kernels = require_native()
    k = items.numel()
    if items.dtype != torch.int64 or cells.dtype != torch.int32 or cells.shape != (spec.cells, spec.block):
        raise ValueError(
            f"peel wants int64 items and ({spec.cells}, {spec.block}) int32 cells, not {items.dtype} items"
            f" and {cells.dtype} {tuple(cells.shape)} cells"
        )
    if items.device.type != "cpu" or cells.device.type != "cpu":
        raise ValueError("peel_native runs on CPU tensors only")
    if k >= 1 << 31:
        raise ValueError("too many candidates for one sketch")
    items = items.contiguous()
    cells = cells.contiguous()
    values = torch.empty((k, spec.block), dtype=torch.int32)
    peeled = torch.empty(k, dtype=torch.bool)
    found = kernels.peel(
        k, spec.geometry(), items.data_ptr(), cells.data_ptr(), values.data_ptr(), peeled.data_ptr(),
        kernel_threads() if threads is None else threads,
    )
    if found is None:  # more candidates than its records count: the torch rounds, same result, slower
        return peel_parallel(cell_ids(spec, items), cells)
    return PeelResult(values, peeled, None, found == k)


def peel_parallel(ids: torch.Tensor, cells: torch.Tensor) -> PeelResult:
    """:func:`peel` in parallel rounds of torch operations, on any device."""
    device = cells.device
    k = ids.shape[1]
    m, block = cells.shape
    if k >= 1 << 31:
        raise ValueError("too many candidates for one sketch")
    arity = ids.shape[0]
    ids = ids.contiguous()
    # count and position sum in one int64 per cell: one scatter and one gather per access, not two.
    state = torch.zeros(m, dtype=torch.int64, device=device)
    one = torch.arange(k, device=device).add_(1 << _SHIFT)
    for t in range(arity):
        state.scatter_add_(0, ids[t], one)
    acc = cells.to(torch.int64)
    values = torch.zeros((k, block), dtype=torch.int64, device=device)
    stamp = torch.full((k,), -1, dtype=torch.int64, device=device)
    frontier = torch.nonzero(torch.bitwise_right_shift(state, _SHIFT) == 1).squeeze(1)
    rounds = 0
    while True:
        # A cell queued as pure may have lost its last candidate since (in the fused layout one cell is
        # cell t of some items and cell t' of others, updated at different steps t of a round).
        still = torch.bitwise_right_shift(state.gather(0, frontier), _SHIFT) == 1
        frontier = torch.masked_select(frontier, still)
        if not frontier.numel():
            break
        rounds += 1
        who = state.gather(0, frontier).bitwise_and_(_POS_MASK)
        # Keep one pure cell per candidate: every entry stamps its candidate, the last stamp wins.
        key = torch.arange(frontier.numel(), device=device).add_(rounds << _SHIFT)
        stamp.scatter_(0, who, key)
        first = stamp.gather(0, who) == key
        who = torch.masked_select(who, first)
        pure = torch.masked_select(frontier, first)
        gone = who.add(1 << _SHIFT).neg_()
        if block == 1:
            v = acc.view(-1).gather(0, pure)
            values.view(-1).scatter_(0, who, v)
        else:
            v = acc.index_select(0, pure)
            values.index_copy_(0, who, v)
        v.neg_()
        # Update the candidate's other cells only: its pure cell is never touched or read again.
        nxt = []
        for t in range(arity):
            c = ids[t].gather(0, who)
            other = c != pure
            c = torch.masked_select(c, other)
            state.scatter_add_(0, c, torch.masked_select(gone, other))
            if block == 1:
                acc.view(-1).scatter_add_(0, c, torch.masked_select(v.view(-1), other))
            else:
                acc.index_add_(0, c, v[other])
            nxt.append(torch.masked_select(c, torch.bitwise_right_shift(state.gather(0, c), _SHIFT) == 1))
        frontier = torch.cat(nxt)
    return PeelResult(wrap_int32(values.view(-1)).view(k, block), stamp >= 0, rounds)
