"""Fast integer hashes, identical on every worker and every device.

All hashing is done on int64 tensors holding values in [0, 2^32): every multiplication is a 32-bit value
times a constant below 2^31, so products stay below 2^63 and never overflow; the result is masked back
to 32 bits. No Python loops over elements, no floating point, so CPU and CUDA agree bit for bit.

Seeds are derived in Python (splitmix64) from the bucket's seed, the round number and a purpose tag, so
that a bucket that hit an unlucky hash in one round gets fresh hashes in the next.
"""

from __future__ import annotations

import torch

MASK32 = (1 << 32) - 1
_MASK64 = (1 << 64) - 1
# Odd multipliers below 2^31 (so that value * constant < 2^63); xorshift-multiply rounds in the style
# of murmur3's fmix32.
_MUL1 = 0x7FEB352D
_MUL2 = 0x2C1B3C6D


def derive_seed(*parts: int) -> int:
    """A 32-bit seed from integers (bucket seed, round, purpose...), by splitmix64. Pure Python: exact."""
    z = 0x9E3779B97F4A7C15
    for part in parts:
        z = (z + (int(part) & _MASK64) + 0x9E3779B97F4A7C15) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        z ^= z >> 31
    return z & MASK32


def mix32(h: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit mixer over an int64 tensor of values in [0, 2^32). Modifies ``h`` in place."""
    h.bitwise_xor_(torch.bitwise_right_shift(h, 16))
    h.mul_(_MUL1).bitwise_and_(MASK32)
    h.bitwise_xor_(torch.bitwise_right_shift(h, 15))
    h.mul_(_MUL2).bitwise_and_(MASK32)
    h.bitwise_xor_(torch.bitwise_right_shift(h, 16))
    return h


def hash_items(items: torch.Tensor, seed: int) -> torch.Tensor:
    """32-bit hashes (int64) of item numbers (int64, < 2^32) under ``seed``: a new tensor."""
    return mix32(torch.bitwise_xor(items, seed & MASK32))


def reduce_range(h: torch.Tensor, size: int) -> torch.Tensor:
    """Map 32-bit hashes to [0, size) by multiply-shift (Lemire): no division, uses the high bits."""
    if not 0 < size < (1 << 31):
        raise ValueError(f"range size {size} must be in [1, 2^31)")
    return torch.bitwise_right_shift(h * size, 32)
