"""Peeling on the GPU in one launch: a persistent Triton kernel that runs the parallel rounds of
``peeling.peel_parallel`` itself, one grid-wide barrier between rounds, with no host round trip.

Why one launch: the torch rounds cost several launches each, and the fused layout needs ~730 rounds at
the default case. Why rounds at all: a peel is a chain of dependent steps (a cell becomes pure only once
its other candidates are out), so its time is at least its depth times the latency of one step through
L2 (~1 us); a layout's depth is a property of the job (docs/codec.md: ~30 rounds for the plain layout,
~730 for the fused one), which is why GPU jobs peel the plain layout by default.

The kernel, with P programs all resident (one per SM):

1. every candidate adds ``2^40 + its position`` to each of its cells' states (int64 atomics: a cell's
   count and the sum of its candidates' positions in one word), and the sketch is copied to ``acc``;
2. every pure cell (count 1) is appended to a queue (one atomic per tile reserves its slots);
3. rounds: each program takes its share of the cells queued in the last round; a cell still pure names
   its candidate, which is claimed with an atomic exchange (a candidate pure in several cells is peeled
   once), its value read from the cell and its other cells updated by atomics; a cell whose count falls
   to 1 is queued for the next round. A barrier ends the round; the queue's new end says whether
   another follows, the same for every program.

A cell is queued at most once (when its count reaches 1, which happens once), so the queue needs one slot
per cell. The result is the 2-core's complement with each candidate's exact value, whatever the order
(the module docstring of ``peeling``): bit for bit the CPU kernels' and the torch rounds'.
"""

from __future__ import annotations

import threading

import torch
import triton
import triton.language as tl

from ..sketch_spec import SketchSpec
from .device import launch, next_pow2, persistent_programs, read_back, sizes
from .device_functions import cell_ids, grid_sync
from .encoding import seed_args

ONE = tl.constexpr(1 << 40)  # a candidate's weight in its cells' states: count * 2^40 + position
POSITION = tl.constexpr((1 << 40) - 1)
# ctl words: the barrier's arrivals, the three rounds' queue counters, candidates found, rounds run
BARRIER = tl.constexpr(0)
COUNTERS = tl.constexpr(1)
FOUND = tl.constexpr(4)
ROUNDS = tl.constexpr(5)
_CTL_WORDS = 8
#: One peel at a time per process: two persistent kernels sharing the SMs could each wait for programs
#: the other keeps from running.
_ONE_AT_A_TIME = threading.Lock()


@triton.jit
def _push(queue, counter, end, cells, flags):
    """Append the flagged cells at ``end`` + the counter's next slots (one atomic for the tile)."""
    count = tl.sum(flags.to(tl.int32), axis=0)
    if count > 0:
        base = tl.atomic_add(counter, count)
        at = end + base + tl.cumsum(flags.to(tl.int32), axis=0) - 1
        tl.store(queue + at, cells.to(tl.int32), mask=flags)


@triton.jit
def _take_out(acc, state, queue, counter, end, cell, pure, win, v, gone, block, lane, lane_ok):
    """Remove the won candidates from ``cell`` (unless it is the pure cell they came from); queue the
    cells left with one candidate."""
    update = win & (cell != pure)
    tl.atomic_add(acc + cell[:, None] * block + lane[None, :], -v, mask=update[:, None] & lane_ok[None, :])
    old = tl.atomic_add(state + cell, gone, mask=update)
    _push(queue, counter, end, cell, update & ((old >> 40) == 2))


@triton.jit(do_not_specialize=["k", "m", "block", "start_seed", "s0", "s1", "s2", "s3", "starts", "seg"])
def _peel(cands, cells, acc, state, queue, claimed, values, peeled, ctl, k, m, block, start_seed, s0, s1, s2,
          s3, starts, seg, ARITY: tl.constexpr, PROGRAMS: tl.constexpr, TILE: tl.constexpr,
          LANES: tl.constexpr):
    pid = tl.program_id(0)  # loops stride over the grid (PROGRAMS * TILE) from bounds that are not the pid's
    lane = tl.arange(0, LANES)
    lane_ok = lane < block
    for first in range(0, k, PROGRAMS * TILE):
        x = first + pid * TILE + tl.arange(0, TILE)
        ok = x < k
        item = tl.load(cands + x, mask=ok, other=0)
        c0, c1, c2, c3 = cell_ids(item, start_seed, s0, s1, s2, s3, starts, seg, ARITY)
        weight = x.to(tl.int64) + ONE
        tl.atomic_add(state + c0, weight, mask=ok, sem="relaxed")
        tl.atomic_add(state + c1, weight, mask=ok, sem="relaxed")
        tl.atomic_add(state + c2, weight, mask=ok, sem="relaxed")
        if ARITY == 4:
            tl.atomic_add(state + c3, weight, mask=ok, sem="relaxed")
    for first in range(0, m * block, PROGRAMS * TILE):
        w = first + pid * TILE + tl.arange(0, TILE)
        tl.store(acc + w, tl.load(cells + w, mask=w < m * block), mask=w < m * block)
    grid_sync(ctl + BARRIER, PROGRAMS)
    for first in range(0, m, PROGRAMS * TILE):
        c = first + pid * TILE + tl.arange(0, TILE)
        ok = c < m
        s = tl.load(state + c, mask=ok, other=0, cache_modifier=".cg")
        _push(queue, ctl + COUNTERS, 0, c, ok & ((s >> 40) == 1))
    grid_sync(ctl + BARRIER, PROGRAMS * 2)
    hi = tl.load(ctl + COUNTERS, volatile=True)
    lo = hi * 0
    rounds = hi * 0
    barriers = hi * 0 + 2
    found = hi * 0
    while lo < hi:
        rounds += 1
        counter = ctl + COUNTERS + rounds % 3
        if pid == 0:  # the counter the next round fills: every program read it two barriers ago
            tl.store(ctl + COUNTERS + (rounds + 1) % 3, 0)
        for first in range(lo, hi, PROGRAMS * TILE):
            q = first + pid * TILE + tl.arange(0, TILE)
            ok = q < hi
            c = tl.load(queue + q, mask=ok, other=0, cache_modifier=".cg").to(tl.int64)
            s = tl.load(state + c, mask=ok, other=0, cache_modifier=".cg")
            live = ok & ((s >> 40) == 1)
            x = s & POSITION
            old = tl.atomic_xchg(claimed + x, 1, mask=live)
            win = live & (old == 0)
            both = win[:, None] & lane_ok[None, :]
            v = tl.load(acc + c[:, None] * block + lane[None, :], mask=both, other=0, cache_modifier=".cg")
            tl.store(values + x[:, None] * block + lane[None, :], v, mask=both)
            tl.store(peeled + x, tl.full([TILE], 1, tl.uint8), mask=win)
            item = tl.load(cands + x, mask=win, other=0)
            c0, c1, c2, c3 = cell_ids(item, start_seed, s0, s1, s2, s3, starts, seg, ARITY)
            gone = -(x + ONE)
            _take_out(acc, state, queue, counter, hi, c0, c, win, v, gone, block, lane, lane_ok)
            _take_out(acc, state, queue, counter, hi, c1, c, win, v, gone, block, lane, lane_ok)
            _take_out(acc, state, queue, counter, hi, c2, c, win, v, gone, block, lane, lane_ok)
            if ARITY == 4:
                _take_out(acc, state, queue, counter, hi, c3, c, win, v, gone, block, lane, lane_ok)
            found += tl.sum(win.to(tl.int32), axis=0)
        barriers += 1
        grid_sync(ctl + BARRIER, PROGRAMS * barriers)
        lo = hi
        hi = hi + tl.load(counter, volatile=True)
    tl.atomic_add(ctl + FOUND, found)
    if pid == 0:
        tl.store(ctl + ROUNDS, rounds)


def peel(spec: SketchSpec, cands: torch.Tensor, cells: torch.Tensor
         ) -> tuple[torch.Tensor, torch.Tensor, int, bool]:
    """``peeling.peel`` on the device of ``cands`` and ``cells`` ((spec.cells, block) int32): one zeroed
    scratch buffer, one kernel, one read-back of what it found. Returns the fields of ``peeling.PeelResult``
    (values, peeled, rounds, complete), which the reference builds: the kernel does not import it."""
    k = cands.numel()
    m, block = spec.cells, spec.block
    if k >= 1 << 31:
        raise ValueError("too many candidates for one sketch")
    if cells.shape != (m, block) or cells.dtype != torch.int32 or cands.dtype != torch.int64:
        raise ValueError(f"peel wants int64 candidates and ({m}, {block}) int32 cells, not {cands.dtype} and"
                         f" {cells.dtype} {tuple(cells.shape)}")
    device = cands.device
    # one zeroed buffer of int32 words: states (int64), control words, claims, values, peeled flags
    at = [0, 2 * m, 2 * m + _CTL_WORDS, 2 * m + _CTL_WORDS + k, 2 * m + _CTL_WORDS + k + k * block]
    scratch = torch.zeros(at[-1] + -(-k // 4), dtype=torch.int32, device=device)
    state = scratch[: at[1]].view(torch.int64)
    ctl, claimed = scratch[at[1] : at[2]], scratch[at[2] : at[3]]
    values = scratch[at[3] : at[4]].view(k, block)
    peeled = scratch[at[4] :].view(torch.uint8)[:k]
    if not k:
        return values, peeled.view(torch.bool), 0, True
    acc = torch.empty(m * block, dtype=torch.int32, device=device)
    queue = torch.empty(m, dtype=torch.int32, device=device)
    lanes = next_pow2(block)
    programs = persistent_programs(device)
    with _ONE_AT_A_TIME:
        launch(_peel, (programs,), cands.contiguous(), cells.contiguous(), acc, state, queue,
               claimed, values, peeled, ctl, k, m, block, *seed_args(spec), ARITY=spec.arity,
               PROGRAMS=programs, TILE=max(1, sizes()["peel"] // lanes), LANES=lanes,
               num_warps=sizes()["warps"])
        found, rounds = read_back(ctl[FOUND.value : ROUNDS.value + 1]).tolist()
    return values, peeled.view(torch.bool), rounds, found == k
