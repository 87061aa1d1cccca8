"""Quantization: floats to int32 with one power-of-two scale that every worker agrees on.

Why a power of two: multiplying a float by 2^s is exact, so the only error is the final rounding to an
integer, and it is the same on every device. Why agreed: the switch adds the integers of all workers, so
they must share one scale, and the scale must keep the *sum* in int32: with W workers and ``k =
W.bit_length()`` (so W < 2^k) the codec picks s such that |x| * 2^s <= 2^(31-k) for every worker's x,
hence W * max|q| < 2^31 and every element's sum fits int32 (k = 11 for W up to ``MAX_JOB_WORKERS`` =
1024: 2^20 per worker).

Agreement costs no extra message: each worker ORs a one-hot 256-bit bitmap of the float32 exponent field
of its max |x| into the header words (OR of one-hot bitmaps = max). Three pairs of header words carry the
flags "my input is not finite", "my integers exceed the bound" and "my support misses a nonzero": rank r
sets bit r % 32 of the pair's first word and bit r // 32 of its second, so up to ``MAX_JOB_WORKERS`` (1024)
ranks fit two words, one flagged worker is named exactly, and several are named among the ranks whose
two bits are both set (a superset only when they differ in both halves):
after the same round every worker raises the same AggregationError for the last two, and ends the
aggregation with an all-NaN total for the first (a NaN or inf is not quantized; see ``nonfinite_ranks``),
instead of some of them waiting forever.

Error bound. Let M be the largest |x| of any worker, k = W.bit_length(), and L the *scale lag*: how
many binades the scale used may be coarser than the finest one M allows. The agreed scale is the finest;
a scale assumed from the previous round is used only if it is at most ``headroom + SCALE_SLACK`` binades
coarser (``scale_holds``), else the round is redone at the agreed scale, so L <= headroom + SCALE_SLACK
(L = 0 in a bucket's first round; every mode, union included, keeps an assumed scale that holds).
Then for every element i, S_i the exact sum of the W workers' values and p the output dtype's
significand bits (24, 11, 8)::

    |total_i - S_i| <= W * 2^(L + k - 31) * max(M, 2^-126) + 2^(1-p) * |total_i| + 2 * tiny(dtype)

Why: the agreed scale s_a satisfies 2^(-s_a - 1) <= max(M, 2^-126) * 2^(k - 31) (M has exponent field F,
M < 2^(F-126) <= 2M); each worker's rounding to an integer is off by at most 2^(-s-1) with s >= s_a - L;
the integer sum is exact; converting it back rounds once to float32 and once more to the output dtype
(relative 2^-24 and 2^-p, and at most the dtype's smallest subnormal ``tiny`` each in the subnormal range).
A sum beyond the output dtype's range (float16: 65504) raises AggregationError on every worker instead of
returning inf. Integer inputs are not scaled: their bound W * max|x| <= 2^31 - 1 is checked, and then the
whole path is bit-exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from host_agent.errors import AggregationError

from .cpu import native

# 8 words exponent bitmap, then two words each (bit rank % 32, bit rank // 32): non-finite input, integers
# beyond the bound, a support that misses a nonzero element
HEADER_WORDS = 14
EXP_WORDS = 8
NONFINITE_WORD = 8
UNSCALABLE_WORD = 10
PARTIAL_SUPPORT_WORD = 12
#: binades a scale assumed from the previous round may be coarser than ``headroom`` allows for
SCALE_SLACK = 2
MAX_FIELD = 254  # the largest exponent field of a finite float32
#: An assumed scale's clamp keeps this far inside int32 (a float32 near 2^31 is a multiple of 128); the
#: CPU kernels' CLAMP_MARGIN (cpu/kernels.h)
CLAMP_MARGIN = 128

#: The float32 bits of +inf: the bits of |x| (sign cleared) are below them exactly where x is finite.
INFINITY_BITS = 0x7F800000
MANTISSA_BITS = 23

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


def scale_holds(agreed: int | None, assumed: int | None, lag: int) -> bool:
    """Whether values quantized at the scale of exponent field ``assumed`` may stand, the agreed field
    being ``agreed``: no value saturated (agreed <= assumed) and the scale is at most ``lag`` binades
    coarser than the agreed one (else the error bound in the module docstring would not hold)."""
    if agreed is None or assumed is None:
        return True  # every value is zero, or the scale was agreed before quantizing
    return assumed - lag <= agreed <= assumed


def sum_may_overflow(field: int | None, world_size: int, dtype: torch.dtype) -> bool:
    """Whether the sum of ``world_size`` values below the bound of ``field`` can exceed ``dtype``'s range
    (every |x| < 2^E, so |sum| <= 2^(E + k), k = W.bit_length(), which rounds to at most 2^(E + k))."""
    if field is None:
        return False
    return 2.0 ** (exponent_bound(field) + world_size.bit_length()) > torch.finfo(dtype).max


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
    return (int(top.view(torch.int32)) >> MANTISSA_BITS) & 0xFF, True


def int_in_bound(values: torch.Tensor, world_size: int) -> bool:
    """Whether every integer in ``values`` satisfies |v| <= int_bound(world_size)."""
    if values.numel() == 0:
        return True
    lo, hi = torch.aminmax(values)
    bound = int_bound(world_size)
    return int(hi) <= bound and int(lo) >= -bound


def header_words(
    field: int | None,
    rank: int,
    *,
    finite: bool,
    in_bound: bool,
    support_complete: bool,
    device: torch.device,
) -> torch.Tensor:
    """This worker's header (OR-aggregated): exponent one-hot, then its bit in each error word."""
    words = [0] * HEADER_WORDS
    if field is not None:
        words[field // 32] |= 1 << (field % 32)
    flags = {NONFINITE_WORD: finite, UNSCALABLE_WORD: in_bound, PARTIAL_SUPPORT_WORD: support_complete}
    for word, ok in flags.items():
        if not ok:
            words[word] |= 1 << rank % 32
            words[word + 1] |= 1 << rank // 32
    signed = [w - (1 << 32) if w >= 1 << 31 else w for w in words]
    return torch.tensor(signed, dtype=torch.int32, device=device)


def _workers(vals: list[int], word: int, world_size: int) -> tuple[int, ...]:
    """The ranks a flag's pair of words names: rank r sets bit r % 32 of the first, r // 32 of the second."""
    low, high = vals[word], vals[word + 1]
    return tuple(r for r in range(world_size) if low >> r % 32 & 1 and high >> r // 32 & 1)


def nonfinite_ranks(words: torch.Tensor, world_size: int) -> tuple[int, ...]:
    """The workers whose input holds a NaN or inf (or their candidates past 32 workers), from the OR of
    all headers (not an error: the protocol then ends the aggregation on every worker with a non-finite
    total, as a float allreduce would propagate it, so that a mixed-precision loss scaler sees the
    overflow)."""
    return _workers([w & 0xFFFFFFFF for w in words[:HEADER_WORDS].tolist()], NONFINITE_WORD, world_size)


def parse_header(words: torch.Tensor, world_size: int) -> int | None:
    """The agreed max exponent field from the OR of all headers; raises the agreed error if any.

    Raises AggregationError naming the workers whose integers exceed the bound or who hold nonzeros
    outside the support they declared (non-finite inputs are no error: :func:`nonfinite_ranks`).
    """
    vals = [w & 0xFFFFFFFF for w in words[:HEADER_WORDS].tolist()]
    if vals[UNSCALABLE_WORD]:
        ranks = _workers(vals, UNSCALABLE_WORD, world_size)
        raise AggregationError(
            f"integer values of worker(s) {list(ranks)} exceed the bound |x| <= {int_bound(world_size)} "
            f"(= (2^31-1) // {world_size} workers): the sum could overflow int32",
            ranks,
            collective=True,
        )
    if vals[PARTIAL_SUPPORT_WORD]:
        ranks = _workers(vals, PARTIAL_SUPPORT_WORD, world_size)
        raise AggregationError(
            f"the support of worker(s) {list(ranks)} misses nonzero elements of their input: a support must "
            "list every nonzero element (elements outside it would be dropped)",
            ranks,
            collective=True,
        )
    for word in range(EXP_WORDS - 1, -1, -1):
        if vals[word]:
            return word * 32 + vals[word].bit_length() - 1
    return None


def check_sum_range(summed: torch.Tensor, scale: int, field: int | None, world_size: int,
                    dtype: torch.dtype) -> None:
    """Raise AggregationError if the integer sums ``summed``, dequantized at ``scale``, overflow ``dtype``
    (only looked at when ``sum_may_overflow``: the inputs are known finite, so an inf can only come from
    the sum). Dequantizing is monotone, so the smallest and largest sums decide: no float copy of all."""
    if not sum_may_overflow(field, world_size, dtype) or summed.numel() == 0:
        return
    extremes = dequantize(torch.stack(torch.aminmax(summed)), scale, dtype)
    if bool(torch.isinf(extremes).any()):
        raise AggregationError(
            f"the sum overflows {dtype} (largest finite {torch.finfo(dtype).max:g}): "
            "aggregate in float32, or scale the values down",
            collective=True,
        )


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


def quantize(values: torch.Tensor, scale: int, clamp: bool = False, kernels: bool = True,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """round(values * 2^scale) as int32. ``clamp`` guards a scale that was assumed, not agreed: values
    that do not fit then saturate (the header tells every worker to redo the round at the right scale).
    ``kernels``: the CPU kernels may run (the GPU path, which Triton's interpreter runs on CPU tensors,
    keeps to torch operations, the ones it counts as the device's). ``out``: where the kernels may write
    the words (:func:`words_buffer`)."""
    if kernels and _native_fits(values, torch.float32):
        out = words_buffer(out, values)
        if native.quantize(values.data_ptr(), values.numel(), scale, clamp, out.data_ptr()):
            return out
    y = _mul_pow2(values.float(), scale)
    if clamp:
        y = y.clamp_(-(2.0**31) + CLAMP_MARGIN, 2.0**31 - CLAMP_MARGIN)
    return torch.round(y).to(torch.int32)


@dataclass(frozen=True)
class Scan:
    """What a dense round's first pass learns of a float bucket."""

    nonzero: int  # elements that are not zero (NaN counts, -0.0 does not)
    field: int | None  # :func:`exponent_field`'s
    finite: bool
    words: torch.Tensor | None  # quantized at the assumed scale, clamped, where one was given


def scan_quantize(values: torch.Tensor, scale: int | None, kernels: bool = True,
                  out: torch.Tensor | None = None) -> Scan:
    """The nonzero count and :func:`exponent_field` of ``values`` and, at an assumed ``scale``, their
    words (``quantize(values, scale, clamp=True)``): one pass over the bucket in C where the kernels are
    built, three in torch (the twin). A dense round needs all three before it sends. ``out``: as for
    :func:`quantize`."""
    if kernels and _native_fits(values, torch.float32):
        words = None if scale is None else words_buffer(out, values)
        found = native.scan_quantize(values.data_ptr(), values.numel(), scale or 0,
                                     0 if words is None else words.data_ptr())
        if found is not None:
            nonzero, largest = found
            finite = largest < INFINITY_BITS
            field = largest >> MANTISSA_BITS if finite and largest else None
            return Scan(nonzero, field, finite, words)
    field, finite = exponent_field(values)
    words = None if scale is None else quantize(values, scale, clamp=True, kernels=kernels)
    return Scan(int(torch.count_nonzero(values)), field, finite, words)


def dequantize(q: torch.Tensor, scale: int, dtype: torch.dtype, out: torch.Tensor | None = None,
               kernels: bool = True) -> torch.Tensor:
    """int32 sums back to floats: q * 2^-scale, rounded once to float32 (then to ``dtype``); written into
    ``out`` (of ``q``'s length) where given, else into a new tensor. ``kernels``: as for
    :func:`quantize`."""
    if kernels and dtype == torch.float32 and _native_fits(q, torch.int32) and (
            out is None or (_native_fits(out, torch.float32) and out.numel() == q.numel())):
        target = torch.empty(q.shape, dtype=torch.float32) if out is None else out
        if native.dequantize(q.data_ptr(), q.numel(), scale, target.data_ptr()):
            return target
    values = _mul_pow2(q.to(torch.float32), -scale).to(dtype)
    return values if out is None else out.copy_(values.reshape(out.shape))


def words_buffer(out: torch.Tensor | None, values: torch.Tensor) -> torch.Tensor:
    """``out`` where it can hold the words of ``values`` (int32, contiguous, on the CPU, of their length),
    else a new tensor. A caller that keeps one per bucket (the agent) spares every call a bucket-sized
    allocation, whose pages the kernel would fault in and zero again."""
    if out is not None and _native_fits(out, torch.int32) and out.numel() == values.numel():
        return out.view(values.shape)
    return torch.empty(values.shape, dtype=torch.int32)


def _native_fits(tensor: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether the CPU kernels take ``tensor`` (built, contiguous on the CPU, of ``dtype``)."""
    return native is not None and tensor.device.type == "cpu" and tensor.dtype == dtype and \
        tensor.is_contiguous()
