"""Triton device functions the GPU kernels share, each the twin of a torch function named in its docstring,
computing the same bits: the codec's hashes, quantizing and dequantizing, a popcount.

Integer arithmetic only where bits must match: hashes on uint32 lanes (a uint32 product wraps mod 2^32,
as the torch code's ``& MASK32`` does), the high half of a 32x32-bit product for ``reduce_range``, and
quantizing from the float's bits (no float rounding mode or flush-to-zero setting can change it).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .device import interpreter_scalars, interpreting

if interpreting():
    interpreter_scalars()


@triton.jit
def mix32(h):
    """``hashing.mix32`` on uint32 lanes."""
    h = h ^ (h >> 16)
    h = h * 0x7FEB352D
    h = h ^ (h >> 15)
    h = h * 0x2C1B3C6D
    h = h ^ (h >> 16)
    return h


@triton.jit
def hash_items(items, seed):
    """``hashing.hash_items``: mix32(item ^ seed) for int64 items below 2^32, as uint32."""
    return mix32(items.to(tl.uint32) ^ tl.cast(seed, tl.uint32))


@triton.jit
def reduce_range(h, size):
    """``hashing.reduce_range``: (h * size) >> 32 for uint32 h and size < 2^31, as int64."""
    return tl.umulhi(h, tl.cast(size, tl.uint32)).to(tl.int64)


@triton.jit
def cell_ids(items, start_seed, s0, s1, s2, s3, starts, seg, ARITY: tl.constexpr):
    """``sketch.cell_ids``: the cells of int64 items, cell t in segment start + t (c3 is c0 at arity 3;
    reduce_range(h, 1) is 0, so one start needs no branch)."""
    base = reduce_range(hash_items(items, start_seed), starts) * seg
    c0 = reduce_range(hash_items(items, s0), seg) + base
    c1 = reduce_range(hash_items(items, s1), seg) + base + seg
    c2 = reduce_range(hash_items(items, s2), seg) + base + 2 * seg
    c3 = reduce_range(hash_items(items, s3), seg) + base + 3 * seg if ARITY == 4 else c0
    return c0, c1, c2, c3


@triton.jit
def quantize(v, scale, CLAMP: tl.constexpr):
    """``quantize.quantize``: round(v * 2^scale), ties to even, as int32, for float32 ``v``; with
    ``CLAMP`` saturating at +-(2^31 - 128) as the torch code's clamp does. Computed from the bits:
    |v| = mant * 2^(field - 150), so |v| * 2^scale = mant * 2^t."""
    bits = v.to(tl.int32, bitcast=True)
    field = (bits >> 23) & 0xFF
    mant = (bits & 0x7FFFFF).to(tl.int64)
    mant = tl.where(field > 0, mant | 0x800000, mant)
    t = tl.maximum(field, 1) - 150 + scale
    big = mant << tl.minimum(tl.maximum(t, 0), 39).to(tl.int64)
    down = tl.minimum(tl.maximum(-t, 1), 40).to(tl.int64)
    kept = mant >> down
    rest = mant - (kept << down)
    half = (mant * 0 + 1) << (down - 1)
    odd = (kept & 1) == 1
    kept = kept + ((rest > half) | ((rest == half) & odd)).to(tl.int64)
    mag = tl.where(t >= 0, big, kept)
    if CLAMP:
        mag = tl.minimum(mag, 2147483520)
    return tl.where(bits < 0, -mag, mag).to(tl.int32)


@triton.jit
def dequantize(q, f1, f2, f3):
    """``quantize.dequantize`` before the cast to the output dtype: float32(q) times the factors
    2^step of ``_mul_pow2``, one rounding each, in its order (unused factors are 1.0)."""
    return q.to(tl.float32) * f1 * f2 * f3


@triton.jit
def popcount(w):
    """Set bits of each uint32 lane (``bits`` lists them byte by byte; this counts them)."""
    w = w - ((w >> 1) & 0x55555555)
    w = (w & 0x33333333) + ((w >> 2) & 0x33333333)
    w = (w + (w >> 4)) & 0x0F0F0F0F
    return (w * 0x01010101) >> 24


@triton.jit
def maximum(a, b):
    return tl.maximum(a, b)


@triton.jit
def rows_nonzero(values, rows, ok, block, LANES: tl.constexpr):
    """Whether each (K, block) int32 row at ``rows`` holds a nonzero lane (``granularity._nonzero_rows``),
    in chunks of LANES lanes."""
    lane = tl.arange(0, LANES)
    held = tl.zeros(rows.shape, tl.int32)
    for first in range(0, block, LANES):
        at = first + lane
        v = tl.load(values + rows.to(tl.int64)[:, None] * block + at[None, :],
                    mask=ok[:, None] & (at[None, :] < block), other=0)
        held = tl.maximum(held, tl.max((v != 0).to(tl.int32), axis=1))
    return ok & (held > 0)
