"""The GPU path's encoding kernels: the nonzero scan, the index (bitmap or Bloom filter), the sketch, and
the candidates' values (union mode, a residue), each quantized inside the kernel that reads it. A bucket
is encoded in one pass (:func:`encode_bucket`: index, sketch and the header's figures at once); the
kernels that take a list of items serve a bucket whose support was given.

Each kernel names its torch twin; ``tests/test_codec_gpu.py`` holds them to it bit for bit. Integer
additions into the sketch are int32 atomics: they commute, so the words do not depend on their order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from .. import agreement
from .. import quantize as header
from ..sketch_spec import SketchSpec
from .device import launch, next_pow2, read_back, sizes
from .device_functions import cell_ids, hash_items, quantize, reduce_range

#: Where the lead's words go (``agreement`` then ``quantize``'s header).
DIGEST_LANES = tl.constexpr(agreement.DIGEST_LANES)
LEAD_WORD = tl.constexpr(agreement.LEAD_WORD)
PRESENCE_WORD = tl.constexpr(agreement.PRESENCE_WORD)
COUNT_WORD = tl.constexpr(agreement.COUNT_WORD)
ITEMS_WORD = tl.constexpr(agreement.ITEMS_WORD)
AGREE_WORDS = tl.constexpr(agreement.AGREE_WORDS)
NONFINITE_WORD = tl.constexpr(header.NONFINITE_WORD)
UNSCALABLE_WORD = tl.constexpr(header.UNSCALABLE_WORD)
NOT_FINITE_BITS = tl.constexpr(0x7F800000)  # |x| as float32 bits at or above this: inf or NaN


@triton.jit
def _tile(x, n, n_items, block, ITEMS: tl.constexpr, LANES: tl.constexpr):
    """A program's tile of items: their numbers, lanes, values (zero past the bucket), which lanes lie
    in the bucket, and which items hold a nonzero (``items.nonzero_rows``)."""
    item = tl.program_id(0) * ITEMS + tl.arange(0, ITEMS)
    lane = tl.arange(0, LANES)
    elem = item.to(tl.int64)[:, None] * block + lane[None, :]
    ok = (item[:, None] < n_items) & (lane[None, :] < block) & (elem < n)
    v = tl.load(x + elem, mask=ok, other=0)
    held = tl.max(((v != 0) & ok).to(tl.int32), axis=1) > 0
    return item.to(tl.int64), lane, v, ok, held


@triton.jit
def _tile_stats(v, ok, held, out, IS_FLOAT: tl.constexpr):
    """The header's figures of a tile at ``out``: its nonzero items, and max |x| as float32 bits
    (floats) or max and min (int32)."""
    tl.store(out, tl.sum(held.to(tl.int32), axis=0))
    if IS_FLOAT:
        bits = tl.where(ok, tl.abs(v.to(tl.float32)).to(tl.int32, bitcast=True), 0)
        tl.store(out + 1, tl.max(tl.max(bits, axis=1), axis=0))
        tl.store(out + 2, 0)
    else:
        held_values = tl.where(ok, v, 0)
        tl.store(out + 1, tl.max(tl.max(held_values, axis=1), axis=0))
        tl.store(out + 2, tl.min(tl.min(held_values, axis=1), axis=0))


@triton.jit(do_not_specialize=["n", "n_items", "block"])
def _scan_counts(x, n, n_items, block, out, IS_FLOAT: tl.constexpr, ITEMS: tl.constexpr,
                 LANES: tl.constexpr):
    """Per program: the header's figures of its tile (``quantize.exponent_field``, ``int_in_bound``)."""
    _, _, v, ok, held = _tile(x, n, n_items, block, ITEMS, LANES)
    _tile_stats(v, ok, held, out + tl.program_id(0) * 3, IS_FLOAT)


@dataclass
class Scan:
    """What the scan found: how many nonzero items, and what the header says of them."""

    items: int
    field: int | None  # float32 exponent field of max |x| (floats; None if all zero)
    finite: bool
    lo: int  # smallest and largest value (int32 inputs)
    hi: int


def scan_stats(x: torch.Tensor, block: int) -> torch.Tensor:
    """The per-program figures (:func:`summarize` reads them) of one pass over ``x``: one kernel."""
    programs, tile, lanes = _tiling(x, block)
    stats = torch.empty((programs, 3), dtype=torch.int32, device=x.device)
    launch(_scan_counts, (programs,), x, x.numel(), -(-x.numel() // block), block, stats,
           IS_FLOAT=x.dtype != torch.int32, ITEMS=tile, LANES=lanes, num_warps=sizes()["warps"])
    return stats


def _tiling(x: torch.Tensor, block: int) -> tuple[int, int, int]:
    """(programs, items per program, lanes) of a pass over ``x`` in items of ``block`` elements."""
    lanes = next_pow2(block)
    tile = max(1, sizes()["scan"] // lanes)
    n_items = -(-x.numel() // block)
    return -(-n_items // tile), tile, lanes


def summarize(stats: torch.Tensor, is_float: bool) -> Scan:
    """The figures of a whole bucket from its programs' (read back: a host tensor)."""
    host = stats.numpy().astype(np.int64)
    top = int(host[:, 1].max())
    k = int(host[:, 0].sum())
    if is_float:
        not_finite = NOT_FINITE_BITS.value
        field = None if top == 0 or top >= not_finite else (top >> 23) & 0xFF
        return Scan(k, field, top < not_finite, 0, 0)
    return Scan(k, None, True, int(host[:, 2].min()), top)


def scan_nonzero(x: torch.Tensor, block: int) -> Scan:
    """The nonzero items' number and the header's figures: one kernel and one read-back."""
    return summarize(read_back(scan_stats(x, block)), x.dtype != torch.int32)


@triton.jit(do_not_specialize=["programs", "rank", "digest", "bound", "n_sketch"])
def _lead(stats, programs, out, rank, digest, bound, sketch, n_sketch, IS_FLOAT: tl.constexpr,
          ROWS: tl.constexpr):
    """``agreement.agreement_words`` then ``quantize.header_words`` of the bucket's figures (its programs'
    ``stats``, as :func:`summarize` reads them) into ``out`` (zeroed), by one program. A bucket that is
    not finite also zeroes its ``sketch`` (the header tells every worker to discard those words; the CPU
    sends zeros): a loop of one program, slow but only then."""
    r = tl.arange(0, ROWS)
    count = tl.zeros([ROWS], tl.int64)
    top = tl.full([ROWS], -2147483648, tl.int32)
    low = tl.full([ROWS], 2147483647, tl.int32)
    for first in range(0, programs, ROWS):
        ok = first + r < programs
        row = stats + (first + r) * 3
        count += tl.load(row, mask=ok, other=0).to(tl.int64)
        top = tl.maximum(top, tl.load(row + 1, mask=ok, other=-2147483648))
        low = tl.minimum(low, tl.load(row + 2, mask=ok, other=2147483647))
    k = tl.sum(count, axis=0)
    hi = tl.max(top, axis=0)
    lo = tl.min(low, axis=0)
    tl.store(out + rank % DIGEST_LANES, digest)
    tl.store(out + LEAD_WORD, digest, mask=rank == 0)
    unit = tl.cast(1, tl.uint32)
    tl.store(out + PRESENCE_WORD + rank // 32, (unit << (rank % 32).to(tl.uint32)).to(tl.int32, bitcast=True))
    tl.store(out + COUNT_WORD, (rank * 0 + 1).to(tl.int32))
    tl.store(out + ITEMS_WORD, (k & 0xFFFF).to(tl.int32))
    tl.store(out + ITEMS_WORD + 1, (k >> 16).to(tl.int32))
    worker = (unit << (rank % 32).to(tl.uint32)).to(tl.int32, bitcast=True)  # a flag's two words
    worker_high = (unit << (rank // 32).to(tl.uint32)).to(tl.int32, bitcast=True)
    head = out + AGREE_WORDS
    if IS_FLOAT:
        finite = hi < NOT_FINITE_BITS
        field = (hi >> 23) & 0xFF
        one = (tl.cast(1, tl.uint32) << (field % 32).to(tl.uint32)).to(tl.int32, bitcast=True)
        tl.store(head + field // 32, one, mask=finite & (hi != 0))
        tl.store(head + NONFINITE_WORD, worker, mask=hi >= NOT_FINITE_BITS)
        tl.store(head + NONFINITE_WORD + 1, worker_high, mask=hi >= NOT_FINITE_BITS)
        if hi >= NOT_FINITE_BITS:
            for at in range(0, n_sketch, ROWS):
                tl.store(sketch + at + r, tl.zeros([ROWS], tl.int32), mask=at + r < n_sketch)
    else:
        tl.store(head + UNSCALABLE_WORD, worker, mask=(lo < -bound) | (hi > bound))
        tl.store(head + UNSCALABLE_WORD + 1, worker_high, mask=(lo < -bound) | (hi > bound))


def encode_lead(stats: torch.Tensor, out: torch.Tensor, rank: int, digest: int, world: int, is_float: bool,
                sketch: torch.Tensor | None) -> None:
    """This worker's lead (the agreement message, then the header) into ``out`` (zeroed) from its
    bucket's figures (:func:`encode_bucket`'s ``stats``), on the device: one kernel, nothing read back
    (the host never learns the figures; every worker reads them from the aggregated header)."""
    zeroed = sketch if sketch is not None and sketch.numel() else out  # never an empty view
    launch(_lead, (1,), stats, stats.shape[0], out, rank, agreement.signed_word(digest & 0xFFFFFFFF),
           header.int_bound(world), zeroed, 0 if sketch is None else sketch.numel(), IS_FLOAT=is_float,
           ROWS=sizes()["fill"], num_warps=sizes()["warps"])


def pattern_mask(masks: torch.Tensor | None) -> int:
    """The hash bits that choose a Bloom pattern: the table ``masks`` (``index.bloom_masks``, a power of two
    long) minus one, as the C kernel takes it; 0 for a bitmap (no table)."""
    return 0 if masks is None else masks.numel() - 1


@triton.jit
def _index_or(item, held, group, words, n_words, seed, masks, BLOOM: tl.constexpr,
              PATTERN_MASK: tl.constexpr):
    """OR each held item's entry's bit (bitmap) or pattern (Bloom: the one a hash's low bits choose,
    :func:`pattern_mask`) into its word; an entry met twice (a group of several items) ORs the same bits
    again."""
    entry = item // group
    if BLOOM:
        h = hash_items(entry, seed)
        pattern = tl.load(masks + (h & PATTERN_MASK).to(tl.int64))
        tl.atomic_or(words + reduce_range(h, n_words), pattern, mask=held)
    else:
        bit = tl.cast(1, tl.uint32) << (entry & 31).to(tl.uint32)
        tl.atomic_or(words + (entry >> 5), bit.to(tl.int32, bitcast=True), mask=held)


@triton.jit
def _sketch_add(item, q, both, lane, block, sketch, start_seed, s0, s1, s2, s3, starts, seg,
                ARITY: tl.constexpr):
    """Add each item's row ``q`` (where ``both``) to each of its cells: int32 atomics, which commute and
    wrap mod 2^32 like the torch code's int64 sum and wrap."""
    c0, c1, c2, c3 = cell_ids(item, start_seed, s0, s1, s2, s3, starts, seg, ARITY)
    tl.atomic_add(sketch + c0[:, None] * block + lane[None, :], q, mask=both)
    tl.atomic_add(sketch + c1[:, None] * block + lane[None, :], q, mask=both)
    tl.atomic_add(sketch + c2[:, None] * block + lane[None, :], q, mask=both)
    if ARITY == 4:
        tl.atomic_add(sketch + c3[:, None] * block + lane[None, :], q, mask=both)


@triton.jit(do_not_specialize=["n", "n_items", "block", "group", "n_words", "seed", "start_seed", "s0", "s1",
                               "s2", "s3", "starts", "seg", "scale"])
def _encode_bucket(x, n, n_items, block, stats, words, group, n_words, seed, masks, sketch, start_seed, s0,
                   s1, s2, s3, starts, seg, scale, IS_FLOAT: tl.constexpr, BLOOM: tl.constexpr,
                   PATTERN_MASK: tl.constexpr,
                   SKETCH: tl.constexpr, ARITY: tl.constexpr, QUANTIZE: tl.constexpr, CLAMP: tl.constexpr,
                   ITEMS: tl.constexpr, LANES: tl.constexpr):
    """One pass over the bucket: ``items.nonzero_rows``, then ``index.encode_index`` and
    ``sketch.encode_sketch`` of the rows quantized (``quantize.quantize``) for the held items of each
    tile, and the tile's header figures (:func:`_scan_counts`). No item list is written: the tile's
    items go straight to their index bits and sketch cells."""
    item, lane, v, ok, held = _tile(x, n, n_items, block, ITEMS, LANES)
    _tile_stats(v, ok, held, stats + tl.program_id(0) * 3, IS_FLOAT)
    _index_or(item, held, group, words, n_words, seed, masks, BLOOM, PATTERN_MASK)
    if SKETCH:
        q = quantize(v.to(tl.float32), scale, CLAMP) if QUANTIZE else v
        _sketch_add(item, q, held[:, None] & (lane[None, :] < block), lane, block, sketch, start_seed, s0, s1,
                    s2, s3, starts, seg, ARITY)


def encode_bucket(x: torch.Tensor, block: int, kind: str, group: int, seed: int, masks: torch.Tensor | None,
                  words: torch.Tensor, spec: SketchSpec | None, sketch: torch.Tensor, scale: int | None,
                  clamp: bool) -> torch.Tensor:
    """This worker's index (``kind``, ``group``, ``seed``, ``masks`` as :func:`encode_index` takes them)
    into ``words`` and, where ``spec`` is given, its sketch quantized at ``scale`` (None: int32 rows) into
    ``sketch`` (both zeroed by the caller), straight from ``x`` in one kernel; returns the per-program
    figures of :func:`scan_stats`. (An argument the kernel does not read is given a tensor that is not
    empty: an empty view may point one past its allocation, where Triton's pointer check could fail.)"""
    programs, tile, lanes = _tiling(x, block)
    stats = torch.empty((programs, 3), dtype=torch.int32, device=x.device)
    layout = seed_args(spec) if spec is not None else (0,) * 7
    unread = words  # stands for the masks of a bitmap and the sketch of union mode
    launch(_encode_bucket, (programs,), x, x.numel(), -(-x.numel() // block), block, stats, words, group,
           words.numel(), seed, unread if masks is None else masks, unread if spec is None else sketch,
           *layout, scale or 0, IS_FLOAT=x.dtype != torch.int32, BLOOM=kind == "bloom",
           PATTERN_MASK=pattern_mask(masks),
           SKETCH=spec is not None, ARITY=spec.arity if spec is not None else 3, QUANTIZE=scale is not None,
           CLAMP=clamp, ITEMS=tile, LANES=lanes, num_warps=sizes()["warps"])
    return stats


@triton.jit(do_not_specialize=["k", "group", "n_words", "seed"])
def _index_encode(items, k, group, words, n_words, seed, masks, BLOOM: tl.constexpr,
                  PATTERN_MASK: tl.constexpr, TILE: tl.constexpr):
    """``index.encode_index`` of a list of items."""
    i = tl.program_id(0) * TILE + tl.arange(0, TILE)
    ok = i < k
    _index_or(tl.load(items + i, mask=ok, other=0), ok, group, words, n_words, seed, masks, BLOOM,
              PATTERN_MASK)


def encode_index(kind: str, items: torch.Tensor, group: int, n_words: int, seed: int,
                 masks: torch.Tensor | None, out: torch.Tensor | None = None) -> torch.Tensor:
    """This worker's index words: ``kind`` "bitmap" or "bloom" (``masks``: the k-bit patterns), written
    into ``out`` where given (zeroed by the caller)."""
    words = torch.zeros(n_words, dtype=torch.int32, device=items.device) if out is None else out
    k = items.numel()
    if k:
        tile = sizes()["items"]
        launch(_index_encode, (-(-k // tile),), items, k, group, words, n_words, seed,
               words if masks is None else masks, BLOOM=kind == "bloom", PATTERN_MASK=pattern_mask(masks),
               TILE=tile, num_warps=sizes()["warps"])
    return words


@triton.jit(do_not_specialize=["k", "block", "start_seed", "s0", "s1", "s2", "s3", "starts", "seg", "scale"])
def _sketch_encode(items, rows, k, block, sketch, start_seed, s0, s1, s2, s3, starts, seg, scale,
                   ARITY: tl.constexpr, QUANTIZE: tl.constexpr, CLAMP: tl.constexpr, TILE: tl.constexpr,
                   LANES: tl.constexpr):
    """``sketch.encode_sketch`` of a list of items and their rows, quantized (``quantize.quantize``,
    fused)."""
    i = tl.program_id(0) * TILE + tl.arange(0, TILE)
    ok = i < k
    lane = tl.arange(0, LANES)
    both = ok[:, None] & (lane[None, :] < block)
    item = tl.load(items + i, mask=ok, other=0)
    v = tl.load(rows + i.to(tl.int64)[:, None] * block + lane[None, :], mask=both, other=0)
    q = quantize(v.to(tl.float32), scale, CLAMP) if QUANTIZE else v
    _sketch_add(item, q, both, lane, block, sketch, start_seed, s0, s1, s2, s3, starts, seg, ARITY)


def seed_args(spec: SketchSpec) -> tuple[int, ...]:
    """(start seed, four cell seeds, starts, segment cells): the layout as the kernels take it."""
    start_seed, seeds = spec.seeds()
    padded = (*seeds, *[0] * (4 - len(seeds)))
    return (start_seed, *padded, spec.starts, spec.segment_cells)


def encode_sketch(spec: SketchSpec, items: torch.Tensor, rows: torch.Tensor, scale: int | None,
                  clamp: bool, out: torch.Tensor | None = None) -> torch.Tensor:
    """This worker's sketch words from its items and rows, quantized at ``scale`` (None: int32 rows),
    written into ``out`` where given (zeroed by the caller)."""
    sketch = torch.zeros(spec.words, dtype=torch.int32, device=items.device) if out is None else out
    k = items.numel()
    if k:
        lanes = next_pow2(spec.block)
        tile = max(1, sizes()["items"] // lanes)
        launch(_sketch_encode, (-(-k // tile),), items, rows, k, spec.block, sketch, *seed_args(spec),
               scale or 0, ARITY=spec.arity, QUANTIZE=scale is not None, CLAMP=clamp, TILE=tile, LANES=lanes,
               num_warps=sizes()["warps"])
    return sketch


@triton.jit(do_not_specialize=["n", "k", "block", "scale"])
def _gather_quantize(x, n, cands, k, block, out, scale, QUANTIZE: tl.constexpr, CLAMP: tl.constexpr,
                     TILE: tl.constexpr, LANES: tl.constexpr):
    """``items.gather_items`` then ``quantize.quantize``: the candidates' rows, zero past the bucket."""
    i = tl.program_id(0) * TILE + tl.arange(0, TILE)
    ok = i < k
    lane = tl.arange(0, LANES)
    both = ok[:, None] & (lane[None, :] < block)
    elem = tl.load(cands + i, mask=ok, other=0)[:, None] * block + lane[None, :]
    v = tl.load(x + elem, mask=both & (elem < n), other=0)
    q = quantize(v.to(tl.float32), scale, CLAMP) if QUANTIZE else v
    tl.store(out + i.to(tl.int64)[:, None] * block + lane[None, :], q, mask=both)


def gather_quantize(x: torch.Tensor, cands: torch.Tensor, block: int, scale: int | None) -> torch.Tensor:
    """(K, block) int32: the candidates' rows of ``x``, quantized at ``scale`` (None: int32 input)."""
    k = cands.numel()
    out = torch.empty((k, block), dtype=torch.int32, device=x.device)
    if k:
        lanes = next_pow2(block)
        tile = max(1, sizes()["items"] // lanes)
        launch(_gather_quantize, (-(-k // tile),), x, x.numel(), cands, k, block, out, scale or 0,
               QUANTIZE=scale is not None, CLAMP=False, TILE=tile, LANES=lanes, num_warps=sizes()["warps"])
    return out


@triton.jit(do_not_specialize=["n_words", "entries", "seed", "n_hits", "group", "n_items"])
def _bloom_hits(words, n_words, entries, seed, masks, hits, n_hits, group, n_items, counts,
                PATTERN_MASK: tl.constexpr, WORDS: tl.constexpr):
    """``index.query_bloom_chunks``' test, 32 entries to a word of hit bits (bits of one word add
    without carries, so their sum is their OR); and per program, how many items its hits stand for (an
    entry is ``group`` items, the last one may be fewer): what ``decoding._bits_count`` would count next."""
    w = tl.program_id(0) * WORDS + tl.arange(0, WORDS)
    bit = tl.arange(0, 32)
    entry = w.to(tl.int64)[:, None] * 32 + bit[None, :]
    ok = entry < entries
    h = hash_items(entry, seed)
    pattern = tl.load(masks + (h & PATTERN_MASK).to(tl.int64))
    got = tl.load(words + reduce_range(h, n_words), mask=ok, other=0)
    hit = ok & ((got & pattern) == pattern)
    packed = tl.sum(tl.where(hit, tl.cast(1, tl.int64) << bit[None, :].to(tl.int64), 0), axis=1)
    tl.store(hits + w, packed.to(tl.uint32).to(tl.int32, bitcast=True), mask=w < n_hits)
    per = tl.where(hit, tl.minimum(n_items - entry * group, group), 0)
    tl.store(counts + tl.program_id(0), tl.sum(tl.sum(per, axis=1), axis=0))


def bloom_hits(words: torch.Tensor, entries: int, seed: int, masks: torch.Tensor, group: int, n_items: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """A hit bit per entry of the aggregated filter (the words ``bits.set_bits`` then lists), and per tile
    of ``32 * sizes()["words"]`` entries the items they stand for (``decoding.set_bit_items`` takes them
    instead of counting again), in one kernel."""
    n_hits = -(-entries // 32)
    hits = torch.empty(n_hits, dtype=torch.int32, device=words.device)
    tile = sizes()["words"]
    programs = max(1, -(-n_hits // tile))
    counts = torch.empty(programs, dtype=torch.int64, device=words.device)
    launch(_bloom_hits, (programs,), words, words.numel(), entries, seed, masks, hits, n_hits, group, n_items,
           counts, PATTERN_MASK=pattern_mask(masks), WORDS=tile, num_warps=sizes()["warps"])
    return hits, counts
