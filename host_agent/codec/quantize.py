"""Quantization: floats to int32 with one power-of-two scale that every worker agrees on.

Why a power of two: multiplying a float by 2^s is exact, so the only error is the final rounding to an
integer, and it is the same on every device. Why agreed: the switch adds the integers of all workers, so
they must share one scale, and the scale must keep the *sum* in int32: with W workers and ``k =
W.bit_length()`` (so W < 2^k) the codec picks s such that |x| * 2^s <= 2^(31-k) for every worker's x,
hence W * max|q| < 2^31 and every element's sum fits int32.

Agreement costs no extra message: each worker ORs a one-hot 256-bit bitmap of the float32 exponent field
of its max |x| into the header words (OR of one-hot bitmaps = max). Two more header words carry, one bit
per worker, "my input is not finite" and "my integers exceed the bound", so that every worker raises the
same error after the same round instead of some of them waiting forever.

Error bound (per element i, S_i the exact sum of the W workers' floats, s the agreed scale)::

    |total_i - S_i| <= W * 2^(-s-1) + 2^-23 * |total_i| + 2^-149

(each worker's rounding to an integer is off by at most 1/2 of 2^-s; converting the exact integer sum
back to float32 rounds once more, relatively; the last term only matters for results in float32's
subnormal range). Integer inputs are not scaled: their bound W * max|x| <= 2^31 - 1 is checked, and then
the whole path is bit-exact.
"""

from __future__ import annotations

import torch

HEADER_WORDS = 10  # 8 words exponent bitmap, 1 word non-finite workers, 1 word unscalable workers
_EXP_WORDS = 8
_NONFINITE_WORD = 8
_UNSCALABLE_WORD = 9

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INT_DTYPES = (torch.int32,)


def int_bound(world_size: int) -> int:
    """Largest |x| an integer input may hold so that the sum of ``world_size`` of them fits int32."""
    return ((1 << 31) - 1) // world_size


def exponent_bound(field: int) -> int:
    """E such that every float32 with exponent field <= ``field`` has |x| < 2^E."""
    return max(field, 1) - 126


def scale_for(field: int | None, world_size: int) -> int:
    """The scale s (q = round(x * 2^s)) for an agreed max exponent field; 0 when every input is zero."""
    if field is None:
        return 0
    return 31 - world_size.bit_length() - exponent_bound(field)


def exponent_field(values: torch.Tensor) -> tuple[int | None, bool]:
    """(float32 exponent field of max |values| or None if all zero, whether every value is finite)."""
    if values.numel() == 0:
        return None, True
    lo, hi = torch.aminmax(values.float())
    top = torch.maximum(hi, -lo)
    if not bool(torch.isfinite(top)):  # aminmax propagates NaN
        return None, False
    if float(top) == 0.0:
        return None, True
    return (int(top.view(torch.int32)) >> 23) & 0xFF, True


def int_in_bound(values: torch.Tensor, world_size: int) -> bool:
    """Whether every integer in ``values`` satisfies |v| <= int_bound(world_size)."""
    if values.numel() == 0:
        return True
    lo, hi = torch.aminmax(values)
    bound = int_bound(world_size)
    return int(hi) <= bound and int(lo) >= -bound


def header_words(
    field: int | None, rank: int, finite: bool, in_bound: bool, device: torch.device
) -> torch.Tensor:
    """This worker's header (OR-aggregated): exponent one-hot, non-finite bit, unscalable bit."""
    words = [0] * HEADER_WORDS
    if field is not None:
        words[field // 32] |= 1 << (field % 32)
    if not finite:
        words[_NONFINITE_WORD] |= 1 << rank
    if not in_bound:
        words[_UNSCALABLE_WORD] |= 1 << rank
    signed = [w - (1 << 32) if w >= 1 << 31 else w for w in words]
    return torch.tensor(signed, dtype=torch.int32, device=device)


def _workers(mask: int) -> list[int]:
    return [r for r in range(32) if mask >> r & 1]


def parse_header(words: torch.Tensor, world_size: int) -> int | None:
    """The agreed max exponent field from the OR of all headers; raises the agreed error if any.

    Raises ValueError naming the workers whose inputs are not finite or exceed the integer bound.
    """
    vals = [w & 0xFFFFFFFF for w in words[:HEADER_WORDS].tolist()]
    if vals[_NONFINITE_WORD]:
        raise ValueError(f"non-finite values (NaN or inf) in the input of worker(s) {_workers(vals[8])}")
    if vals[_UNSCALABLE_WORD]:
        raise ValueError(
            f"integer values of worker(s) {_workers(vals[9])} exceed the bound |x| <= "
            f"{int_bound(world_size)} (= (2^31-1) // {world_size} workers): the sum could overflow int32"
        )
    for word in range(_EXP_WORDS - 1, -1, -1):
        if vals[word]:
            return word * 32 + vals[word].bit_length() - 1
    return None


def _mul_pow2(x: torch.Tensor, e: int) -> torch.Tensor:
    """x * 2^e in x's float dtype, in steps that keep each factor a normal float32 (exact when no
    underflow: multiplying by a power of two only changes the exponent)."""
    while e > 0:
        step = min(e, 126)
        x = x * float(2.0**step)
        e -= step
    while e < 0:
        step = max(e, -126)
        x = x * float(2.0**step)
        e -= step
    return x


def quantize(values: torch.Tensor, scale: int, clamp: bool = False) -> torch.Tensor:
    """round(values * 2^scale) as int32. ``clamp`` guards a scale that was assumed, not agreed: values
    that do not fit then saturate (the header tells every worker to redo the round at the right scale)."""
    y = _mul_pow2(values.float(), scale)
    if clamp:
        y = y.clamp_(-(2.0**31) + 128, 2.0**31 - 128)
    return torch.round(y).to(torch.int32)


def dequantize(q: torch.Tensor, scale: int, dtype: torch.dtype) -> torch.Tensor:
    """int32 sums back to floats: q * 2^-scale, rounded once to float32 (then to ``dtype``)."""
    return _mul_pow2(q.to(torch.float32), -scale).to(dtype)
