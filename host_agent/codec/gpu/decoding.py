"""The GPU path's decoding kernels around the peel: listing the index's set bits as candidate items,
writing the output (dequantized inside the kernel), and counting what the next round's granularity
choice reads. Each names its torch twin; ``tests/test_codec_gpu.py`` holds them to it bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from .device import launch, next_pow2, read_back, send, sizes
from .device_functions import dequantize, maximum, rows_nonzero


@triton.jit(do_not_specialize=["n_bits", "group", "n_items"])
def _bits_count(words, n_bits, group, n_items, counts, BITS: tl.constexpr):
    """Per program: how many items its set bits stand for (an entry is ``group`` items, the last one
    may be fewer)."""
    pid = tl.program_id(0)
    entry = pid.to(tl.int64) * BITS + tl.arange(0, BITS)
    ok = entry < n_bits
    w = tl.load(words + (entry >> 5), mask=ok, other=0).to(tl.uint32, bitcast=True)
    held = ok & (((w >> (entry & 31).to(tl.uint32)) & 1) == 1)
    per = tl.minimum(n_items - entry * group, group)
    tl.store(counts + pid, tl.sum(tl.where(held, per, 0), axis=0))


@triton.jit(do_not_specialize=["n_bits", "group", "n_items"])
def _bits_write(words, n_bits, group, n_items, offsets, out, BITS: tl.constexpr, GROUP: tl.constexpr):
    """``bits.set_bits`` and ``index.expand_groups``: every item of every set entry, in order."""
    pid = tl.program_id(0)
    entry = pid.to(tl.int64) * BITS + tl.arange(0, BITS)
    ok = entry < n_bits
    w = tl.load(words + (entry >> 5), mask=ok, other=0).to(tl.uint32, bitcast=True)
    held = ok & (((w >> (entry & 31).to(tl.uint32)) & 1) == 1)
    per = tl.where(held, tl.minimum(n_items - entry * group, group), 0)
    first = tl.load(offsets + pid) + tl.cumsum(per, axis=0) - per
    j = tl.arange(0, GROUP)
    item = entry[:, None] * group + j[None, :]
    tl.store(out + first[:, None] + j[None, :], item, mask=j[None, :] < per[:, None])


def set_bit_items(words: torch.Tensor, n_bits: int, group: int, n_items: int,
                  counts: torch.Tensor | None = None) -> torch.Tensor:
    """Sorted items (int64) of the set bits among the first ``n_bits`` of ``words``, each bit standing
    for ``group`` consecutive items below ``n_items``: two passes, one read-back of their counts (one
    pass where ``counts``, per tile of ``32 * sizes()["words"]`` bits, were made with the words)."""
    bits = 32 * sizes()["words"]
    programs = max(1, -(-n_bits // bits))
    warps = sizes()["warps"]
    if counts is None:
        counts = torch.empty(programs, dtype=torch.int64, device=words.device)
        launch(_bits_count, (programs,), words, n_bits, group, n_items, counts, BITS=bits, num_warps=warps)
    host = read_back(counts).numpy()
    total = int(host.sum())
    out = torch.empty(total, dtype=torch.int64, device=words.device)
    if total:
        offsets = send(torch.from_numpy(np.concatenate(([0], np.cumsum(host)[:-1]))), words.device)
        launch(_bits_write, (programs,), words, n_bits, group, n_items, offsets, out, BITS=bits,
               GROUP=next_pow2(group), num_warps=warps)
    return out


@triton.jit
def _bfloat16_bits(v):
    """float32 to bfloat16, ties to even, as torch rounds it (its bits, as int16): a float cast would be
    the compiler's choice of rounding, and Triton's interpreter truncates."""
    u = v.to(tl.uint32, bitcast=True)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).to(tl.uint16).to(tl.int16, bitcast=True)


@triton.jit(do_not_specialize=["lo", "hi", "block", "k", "fills", "windows", "num", "den"])
def _fill(out, lo, hi, block, cands, values, k, f1, f2, f3, counts, fills, windows, num, den,
          DEQUANTIZE: tl.constexpr, BF16: tl.constexpr, COUNT: tl.constexpr, TILE: tl.constexpr,
          LANES: tl.constexpr, WINDOW: tl.constexpr, WINDOW_LANES: tl.constexpr):
    """``output.OutputRange.fill`` after ``quantize.dequantize``: each candidate's row at its elements
    within [lo, hi) (the output was zeroed; a bfloat16 output is written as its bits), by the first
    ``fills`` programs. With ``COUNT``, what the granularity choice reads (:func:`_group_counts`' figures):
    each of those programs counts its candidates' nonzero rows (all of them, whatever the range), and
    ``windows`` more programs count the windows."""
    pid = tl.program_id(0)
    if pid < fills:
        i = pid * TILE + tl.arange(0, TILE)
        ok = i < k
        lane = tl.arange(0, LANES)
        elem = tl.load(cands + i, mask=ok, other=0)[:, None] * block + lane[None, :]
        inside = ok[:, None] & (lane[None, :] < block) & (elem >= lo) & (elem < hi)
        q = tl.load(values + i.to(tl.int64)[:, None] * block + lane[None, :], mask=inside, other=0)
        if BF16:
            row = _bfloat16_bits(dequantize(q, f1, f2, f3))
        elif DEQUANTIZE:
            row = dequantize(q, f1, f2, f3).to(out.dtype.element_ty)
        else:
            row = q
        tl.store(out + (elem - lo), row, mask=inside)
        if COUNT:
            held = rows_nonzero(values, i, ok, block, LANES)
            tl.store(counts + windows * STATS + pid, tl.sum(held.to(tl.int64), axis=0))
    elif COUNT:
        _window_stats(cands, values, k, block, pid - fills, num, den, counts + (pid - fills) * STATS, WINDOW,
                      WINDOW_LANES)


def pow2_factors(exponent: int) -> tuple[float, float, float]:
    """The factors ``quantize._mul_pow2`` multiplies by, in order, padded with 1.0 (exact)."""
    factors = []
    while exponent:
        step = max(-126, min(126, exponent))
        factors.append(float(2.0**step))
        exponent -= step
    if len(factors) > 3:
        raise ValueError(f"scale 2^{exponent} is beyond any float32 bucket's")
    return (*factors, *[1.0] * (3 - len(factors)))  # type: ignore[return-value]


def fill_output(out: torch.Tensor, lo: int, cands: torch.Tensor, values: torch.Tensor, block: int,
                scale: int | None, windows: tuple[int, int, int, int] | None = None) -> torch.Tensor | None:
    """Write ``out`` (elements lo..lo+len(out) of the total) whole: zeros, then each candidate's row,
    dequantized at ``scale`` (None: int32 sums as they are). Where ``windows`` (count, num, den, window:
    as :func:`group_counts` takes them) is given, the same kernel counts what the granularity choice
    reads: returns those figures on the device (:func:`read_counts` reads them; None without
    candidates)."""
    out.zero_()
    k = cands.numel()
    if not k:
        return None
    lanes = next_pow2(block)
    tile = max(1, sizes()["fill"] // lanes)
    fills = -(-k // tile)
    f1, f2, f3 = pow2_factors(-scale) if scale is not None else (1.0, 1.0, 1.0)
    bf16 = out.dtype == torch.bfloat16
    target = out.view(torch.int16) if bf16 else out
    count, num, den, window = windows or (0, 0, 1, 1)
    counts = torch.empty(count * _STATS + fills if windows else 1, dtype=torch.int64, device=cands.device)
    launch(_fill, (fills + count,), target, lo, lo + out.numel(), block, cands, values, k, f1, f2, f3, counts,
           fills, count, num, den, DEQUANTIZE=scale is not None, BF16=bf16, COUNT=windows is not None,
           TILE=tile, LANES=lanes, WINDOW=window, WINDOW_LANES=min(lanes, 32), num_warps=sizes()["warps"])
    return counts if windows else None


#: ``granularity.GROUPS``, as the counting kernel unrolls them: 2^0 .. 2^6.
GROUP_POWERS = tl.constexpr(7)
#: Per window: first and last kept item, kept count, new groups for each group size.
_STATS = 10
STATS = tl.constexpr(_STATS)


@triton.jit
def _window_stats(cands, values, k, block, w, num, den, row, WINDOW: tl.constexpr, LANES: tl.constexpr):
    """Window ``w`` of candidates (``granularity._sample``; it starts at ``w * num // den``): the first and
    last item whose row is nonzero, how many, and for each group size how many of them start a new group
    (``index.group_entries``) within the window, at ``row``."""
    j = w.to(tl.int64) * num // den + tl.arange(0, WINDOW)
    ok = j < k
    item = tl.load(cands + j, mask=ok, other=0)
    keep = rows_nonzero(values, j, ok, block, LANES)
    back = ok & (tl.arange(0, WINDOW) > 0)
    prev = tl.load(cands + j - 1, mask=back, other=0)
    prev_keep = rows_nonzero(values, j - 1, back, block, LANES)
    before = tl.associative_scan(tl.where(prev_keep, prev, -1), 0, maximum)
    tl.store(row, tl.min(tl.where(keep, item, 1 << 62), axis=0))
    tl.store(row + 1, tl.max(tl.where(keep, item, -1), axis=0))
    tl.store(row + 2, tl.sum(keep.to(tl.int64), axis=0))
    for power in tl.static_range(GROUP_POWERS):
        new = keep & ((before < 0) | ((before >> power) != (item >> power)))
        tl.store(row + 3 + power, tl.sum(new.to(tl.int64), axis=0))


@triton.jit(do_not_specialize=["k", "block", "windows", "num", "den"])
def _group_counts(cands, values, k, block, windows, num, den, out, WINDOW: tl.constexpr, CHUNK: tl.constexpr,
                  LANES: tl.constexpr):
    """The first ``windows`` programs: per window, :func:`_window_stats`. The rest: nonzero rows per chunk
    (the union)."""
    pid = tl.program_id(0)
    if pid < windows:
        _window_stats(cands, values, k, block, pid, num, den, out + pid * STATS, WINDOW, LANES)
    else:
        c = (pid - windows) * CHUNK + tl.arange(0, CHUNK)
        held = rows_nonzero(values, c, c < k, block, LANES)
        tl.store(out + windows * STATS + (pid - windows), tl.sum(held.to(tl.int64), axis=0))


def group_counts(cands: torch.Tensor, values: torch.Tensor, windows: int, num: int, den: int, window: int
                 ) -> tuple[int, int, dict[int, int]]:
    """(union, sample size, {group: entries in the sample}) as ``granularity`` counts them, ``windows``
    windows of ``window`` candidates, window i from candidate ``i * num // den``, in one kernel and one
    read-back (the output kernel counts the same where it runs: :func:`fill_output`)."""
    k = cands.numel()
    block = values.shape[1]
    chunk = sizes()["fill"]
    chunks = -(-k // chunk)
    out = torch.empty(windows * _STATS + chunks, dtype=torch.int64, device=cands.device)
    launch(_group_counts, (windows + chunks,), cands, values, k, block, windows, num, den, out,
           WINDOW=window, CHUNK=chunk, LANES=min(next_pow2(block), 32), num_warps=sizes()["warps"])
    return read_counts(out, windows)


def read_counts(counts: torch.Tensor, windows: int) -> tuple[int, int, dict[int, int]]:
    """(union, sample size, {group: entries in the sample}) from the figures of ``windows`` windows and
    the union's chunks on the device (one read-back)."""
    host = read_back(counts).numpy()
    rows = host[: windows * _STATS].reshape(windows, _STATS)
    union = int(host[windows * _STATS :].sum())
    held = rows[rows[:, 2] > 0]
    grouped = {}
    for power in range(7):
        joins = int(((held[:-1, 1] >> power) == (held[1:, 0] >> power)).sum())
        grouped[1 << power] = int(held[:, 3 + power].sum()) - joins
    return union, int(rows[:, 2].sum()), grouped
