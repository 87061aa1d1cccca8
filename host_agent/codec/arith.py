"""Modular int32 arithmetic, done deliberately.

The switch adds value words mod 2^32 (two's complement, wrapping). The codec reproduces exactly that, but
never by relying on signed overflow inside a kernel: sums are accumulated in int64, where they cannot
overflow for any realistic number of terms, and then reduced mod 2^32 into int32 by :func:`wrap_int32`.
That keeps every result well defined on every device and in every kernel (C++ leaves signed int32
overflow undefined, even where the hardware happens to wrap).
"""

from __future__ import annotations

import torch

_HALF = 1 << 31
_MASK32 = (1 << 32) - 1


def wrap_int32(t: torch.Tensor) -> torch.Tensor:
    """``t`` (any integer dtype) reduced mod 2^32 into the int32 two's complement range, as int32."""
    if t.dtype == torch.int32:
        return t
    t = t.to(torch.int64)
    return torch.bitwise_and(t + _HALF, _MASK32).sub_(_HALF).to(torch.int32)


def add_int32(words: list[torch.Tensor]) -> torch.Tensor:
    """The switch's ADD over several workers' int32 words: the sum mod 2^32, as int32."""
    acc = words[0].to(torch.int64)
    for w in words[1:]:
        acc.add_(w)
    return wrap_int32(acc)


def or_int32(words: list[torch.Tensor]) -> torch.Tensor:
    """The switch's OR over several workers' int32 words."""
    acc = words[0].clone()
    for w in words[1:]:
        acc.bitwise_or_(w)
    return acc
