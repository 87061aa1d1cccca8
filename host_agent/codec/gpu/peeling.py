"""Peeling on the GPU without rounds: programs take pure cells from one shared work queue as they are
found and meet at no barrier; the twin of ``peeling.peel_parallel``, bit for bit.

Why no rounds: a peel is a chain of dependent steps (a cell becomes pure only once its other candidates
are out), ~30 deep for the plain layout at the default case. Run as rounds with a grid-wide barrier
between them (the kernel before this one), each round cost ~38 us on an H200, mostly waiting for the
slowest program; here a program peels a cell as soon as its count falls to 1, whichever program freed
it, so the chain costs the latency of its steps through L2, not a barrier each.

Two launches, ordered by the stream (the only device-wide wait is a kernel's end):

1. ``_count``: every candidate adds ``2^40 + its position`` to each of its cells' states (int64 atomics:
   a cell's count and the sum of its candidates' positions in one word); the sketch is copied to ``acc``.
2. ``_peel``: each program appends the pure cells of its share of the sketch to the queue, then serves
   the queue until no work is left anywhere. Serving a cell: if its state still says count 1, the
   position names its candidate, claimed by an atomic exchange (a candidate pure in several cells is
   peeled once); the winner reads the value from the cell and takes the candidate out of its other
   cells (``acc`` first, then the state); a cell whose count falls from 2 to 1 is appended to the queue.

Why the result is the CPU's whatever the interleaving. Peeling ends in the same state (the 2-core's
complement) in any order, and a peeled candidate's value is its pure cell's sum less the values taken out
of it, which are exact (the module docstring of ``peeling``); so what must hold is that a program that
reads a state of count 1 also sees every ``acc`` update made before that state: each removal updates
``acc``, passes a CTA barrier, and then updates the state with a release atomic; a server reads the
state with an acquire atomic and passes a CTA barrier before reading ``acc`` (L2, ``.cg``). A cell with
count 1 is touched by nobody else: its other candidates are out, and its own candidate is never taken
out of the cell it was claimed from. A cell may be queued twice (found pure by the scan after a removal
already queued it), never more: the queue has two slots per cell, and a second serving finds the claim
taken or the count 0.

Work and the end. ``tail`` reserves queue slots, ``head`` hands them out (compare-and-swap, up to a tile
at a time), and ``outstanding`` counts cells queued but not yet served: a program adds its cells to it
before it reserves their slots and subtracts a tile only after serving it (its own appends included), so
it is 0 only when no cell is queued or being served, and then no more can come; a program stops when it
sees it so. A slot is written after it is reserved (queue words hold cell + 1, 0 = not yet written), so
a server may wait a moment for a running program's store. Nothing waits for a program that has not
started (programs that hold no work are never waited for), so the grid need not be resident at once and
two peels may share the device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..sketch_spec import SketchSpec
from .device import launch, next_pow2, read_back, sizes, work_programs
from .device_functions import cell_ids
from .encoding import seed_args

ONE = tl.constexpr(1 << 40)  # a candidate's weight in its cells' states: count * 2^40 + position
POSITION = tl.constexpr((1 << 40) - 1)
# ctl words, each on a 128-byte line of its own (idle programs poll the head; the tail and the count of
# outstanding cells are the serving programs' atomics): queue slots handed out, reserved, cells queued and
# not yet served, candidates found
HEAD = tl.constexpr(0)
TAIL = tl.constexpr(32)
OUTSTANDING = tl.constexpr(64)
FOUND = tl.constexpr(96)
_CTL_WORDS = 128


@triton.jit(do_not_specialize=["k", "m", "block", "start_seed", "s0", "s1", "s2", "s3", "starts", "seg"])
def _count(cands, cells, acc, state, k, m, block, start_seed, s0, s1, s2, s3, starts, seg,
           ARITY: tl.constexpr, TILE: tl.constexpr):
    """Every candidate's weight into its cells' states; the sketch copied to ``acc``."""
    at = tl.program_id(0).to(tl.int64) * TILE + tl.arange(0, TILE)
    ok = at < k
    item = tl.load(cands + at, mask=ok, other=0)
    c0, c1, c2, c3 = cell_ids(item, start_seed, s0, s1, s2, s3, starts, seg, ARITY)
    weight = at + ONE
    tl.atomic_add(state + c0, weight, mask=ok, sem="relaxed")
    tl.atomic_add(state + c1, weight, mask=ok, sem="relaxed")
    tl.atomic_add(state + c2, weight, mask=ok, sem="relaxed")
    if ARITY == 4:
        tl.atomic_add(state + c3, weight, mask=ok, sem="relaxed")
    words = at < m * block
    tl.store(acc + at, tl.load(cells + at, mask=words), mask=words)


@triton.jit
def _push(queue, ctl, cells, flags):
    """Append the flagged cells to the queue (one reservation for the tile), counted as outstanding
    before any server can see them."""
    count = tl.sum(flags.to(tl.int32), axis=0)
    if count > 0:
        tl.atomic_add(ctl + OUTSTANDING, count)
        base = tl.atomic_add(ctl + TAIL, count)
        at = base + tl.cumsum(flags.to(tl.int32), axis=0) - 1
        tl.atomic_xchg(queue + at, cells.to(tl.int32) + 1, mask=flags, sem="release")


@triton.jit
def _take_out(acc, state, queue, ctl, cell, pure, win, v, gone, block, lane, lane_ok):
    """Remove the won candidates from ``cell`` (unless it is the pure cell they came from): ``acc``, a CTA
    barrier, then the state (release); queue the cells left with one candidate."""
    update = win & (cell != pure)
    tl.atomic_add(acc + cell[:, None] * block + lane[None, :], -v, mask=update[:, None] & lane_ok[None, :])
    tl.debug_barrier()
    old = tl.atomic_add(state + cell, gone, mask=update, sem="release")
    _push(queue, ctl, cell, update & ((old >> 40) == 2))


@triton.jit
def _serve(cands, acc, state, queue, claimed, values, peeled, ctl, first, n, block, start_seed, s0, s1, s2,
           s3, starts, seg, ARITY: tl.constexpr, TILE: tl.constexpr, LANES: tl.constexpr):
    """Serve queue slots [first, first + n): peel the candidates of the cells still pure. Returns how
    many candidates this program won."""
    lane = tl.arange(0, LANES)
    lane_ok = lane < block
    q = first + tl.arange(0, TILE)
    ok = q < first + n
    slot = tl.where(ok, tl.atomic_add(queue + q, 0, mask=ok, sem="acquire"), 1)
    while tl.sum((slot == 0).to(tl.int32), axis=0) > 0:  # reserved, not yet written: its writer runs
        slot = tl.where(slot == 0, tl.atomic_add(queue + q, 0, mask=ok, sem="acquire"), slot)
    c = (slot - 1).to(tl.int64)
    s = tl.atomic_add(state + c, 0, mask=ok, sem="acquire")
    tl.debug_barrier()
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
    _take_out(acc, state, queue, ctl, c0, c, win, v, gone, block, lane, lane_ok)
    _take_out(acc, state, queue, ctl, c1, c, win, v, gone, block, lane, lane_ok)
    _take_out(acc, state, queue, ctl, c2, c, win, v, gone, block, lane, lane_ok)
    if ARITY == 4:
        _take_out(acc, state, queue, ctl, c3, c, win, v, gone, block, lane, lane_ok)
    return tl.sum(win.to(tl.int32), axis=0)


@triton.jit(do_not_specialize=["m", "block", "start_seed", "s0", "s1", "s2", "s3", "starts", "seg"])
def _peel(cands, acc, state, queue, claimed, values, peeled, ctl, m, block, start_seed, s0, s1, s2, s3,
          starts, seg, ARITY: tl.constexpr, PROGRAMS: tl.constexpr, TILE: tl.constexpr,
          LANES: tl.constexpr):
    pid = tl.program_id(0)
    for first in range(0, m, PROGRAMS * TILE):  # this program's share of the pure cells
        c = first + pid * TILE + tl.arange(0, TILE)
        ok = c < m
        s = tl.load(state + c, mask=ok, other=0, cache_modifier=".cg")
        _push(queue, ctl, c, ok & ((s >> 40) == 1))
    found = pid * 0
    working = pid * 0 + 1
    while working > 0:
        head = tl.load(ctl + HEAD, volatile=True)
        tail = tl.load(ctl + TAIL, volatile=True)
        if head < tail:
            n = tl.minimum(tail - head, TILE)
            if tl.atomic_cas(ctl + HEAD, head, head + n) == head:
                found += _serve(cands, acc, state, queue, claimed, values, peeled, ctl, head, n, block,
                                start_seed, s0, s1, s2, s3, starts, seg, ARITY, TILE, LANES)
                tl.atomic_add(ctl + OUTSTANDING, -n, sem="release")
        elif tl.atomic_add(ctl + OUTSTANDING, 0, sem="acquire") == 0:
            working = 0
    tl.atomic_add(ctl + FOUND, found)


def peel(spec: SketchSpec, cands: torch.Tensor, cells: torch.Tensor
         ) -> tuple[torch.Tensor, torch.Tensor, None, bool]:
    """``peeling.peel`` on the device of ``cands`` and ``cells`` ((spec.cells, block) int32): one zeroed
    scratch buffer, two kernels, one read-back of how many it found. Returns the fields of
    ``peeling.PeelResult`` (values, peeled, rounds, complete), which the reference builds: the kernel does
    not import it. There are no rounds to report (None, as from the CPU kernel)."""
    k = cands.numel()
    m, block = spec.cells, spec.block
    if k >= 1 << 31:
        raise ValueError("too many candidates for one sketch")
    if cells.shape != (m, block) or cells.dtype != torch.int32 or cands.dtype != torch.int64:
        raise ValueError(f"peel wants int64 candidates and ({m}, {block}) int32 cells, not {cands.dtype} and"
                         f" {cells.dtype} {tuple(cells.shape)}")
    device = cands.device
    # one zeroed buffer of int32 words: states (int64), control words, queue (2 slots a cell), claims,
    # values, peeled flags
    at = [0, 2 * m, 2 * m + _CTL_WORDS, 4 * m + _CTL_WORDS, 4 * m + _CTL_WORDS + k]
    at.append(at[-1] + k * block)
    scratch = torch.zeros(at[-1] + -(-k // 4), dtype=torch.int32, device=device)
    state = scratch[: at[1]].view(torch.int64)
    ctl, queue, claimed = scratch[at[1] : at[2]], scratch[at[2] : at[3]], scratch[at[3] : at[4]]
    values = scratch[at[4] : at[5]].view(k, block)
    peeled = scratch[at[5] :].view(torch.uint8)[:k]
    if not k:
        return values, peeled.view(torch.bool), None, True
    acc = torch.empty(m * block, dtype=torch.int32, device=device)
    lanes = next_pow2(block)
    tile = max(1, sizes()["peel"] // lanes)
    cands = cands.contiguous()
    warps = sizes()["warps"]
    count_tile = sizes()["fill"]
    launch(_count, (-(-max(k, m * block) // count_tile),), cands, cells.contiguous(), acc, state, k, m, block,
           *seed_args(spec), ARITY=spec.arity, TILE=count_tile, num_warps=warps)
    programs = work_programs(device)
    launch(_peel, (programs,), cands, acc, state, queue, claimed, values, peeled, ctl, m, block,
           *seed_args(spec), ARITY=spec.arity, PROGRAMS=programs, TILE=tile, LANES=lanes, num_warps=warps)
    (found,) = read_back(ctl[FOUND.value : FOUND.value + 1]).tolist()
    return values, peeled.view(torch.bool), None, found == k
