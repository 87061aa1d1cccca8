"""Bit arrays: packing flags into words and listing set bits, without per-bit passes.

Bit ``i`` of a bit array lives in int32 word ``i // 32`` at bit ``i % 32``; on a little-endian machine
that is byte ``i // 8``, bit ``i % 8``, which is what lets a word array be read as bytes. Listing the set
bits works byte by byte with two 256-entry tables (popcount and bit positions), so the cost is one
pass over the bytes plus O(set bits), never a pass over every bit.
"""

from __future__ import annotations

import sys

import torch

from .cpu import kernel_threads, native, require_native

if sys.byteorder != "little":  # pragma: no cover - every CPU and GPU torch runs on is little-endian
    raise ImportError("host_agent.codec assumes a little-endian machine (bit arrays are read as bytes)")

_TABLES: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(popcount[256], bit_positions[256 * 8]) on ``device``; positions of byte b are at b*8 .. b*8+pop-1."""
    tables = _TABLES.get(device)
    if tables is None:
        popcount = [bin(b).count("1") for b in range(256)]
        positions = []
        for b in range(256):
            pos = [i for i in range(8) if b >> i & 1]
            positions.extend(pos + [0] * (8 - len(pos)))
        tables = (
            torch.tensor(popcount, dtype=torch.int64, device=device),
            torch.tensor(positions, dtype=torch.int64, device=device),
        )
        _TABLES[device] = tables
    return tables


def pack_flag_bytes(v: torch.Tensor) -> torch.Tensor:
    """Pack int64 values each holding eight 0/1 bytes (a bool tensor viewed as int64) into 8-bit values.

    Each half (four flag bytes, bits 0, 8, 16, 24) is multiplied by 2^24 + 2^17 + 2^10 + 2^3, which moves
    flag j to bit 24 + j; the 16 partial products land on distinct bits, so there are no carries, and the
    product stays below 2^50.
    """
    lo = torch.bitwise_and(v, 0x01010101).mul_(0x01020408)
    hi = torch.bitwise_and(torch.bitwise_right_shift(v, 32), 0x01010101).mul_(0x01020408)
    lo = torch.bitwise_right_shift(lo, 24).bitwise_and_(0xF)
    hi = torch.bitwise_right_shift(hi, 20).bitwise_and_(0xF0)
    return lo.bitwise_or_(hi)


def pack_bits(flags: torch.Tensor) -> torch.Tensor:
    """A bool tensor (length a multiple of 32) packed into int32 words (bit i in word i // 32)."""
    if flags.dtype != torch.bool or flags.numel() % 32:
        raise ValueError("pack_bits takes a bool tensor whose length is a multiple of 32")
    return pack_flag_bytes(flags.view(torch.int64)).to(torch.uint8).view(torch.int32)


def words_from_positions(positions: torch.Tensor, n_words: int) -> torch.Tensor:
    """int32 words with the bits at ``positions`` (int64, distinct, in [0, 32 n_words)) set."""
    if positions.device.type == "cpu" and native is not None:
        return words_from_positions_native(positions, n_words)
    return words_from_positions_torch(positions, n_words)


def words_from_positions_native(positions: torch.Tensor, n_words: int) -> torch.Tensor:
    """:func:`words_from_positions` by the compiled kernel: one pass over the positions."""
    kernels = require_native()
    if positions.dtype != torch.int64 or positions.dim() != 1:
        raise ValueError(f"positions must be 1-D int64, not {positions.dtype} {tuple(positions.shape)}")
    if positions.numel() and not (int(positions.min()) >= 0 and int(positions.max()) < 32 * n_words):
        raise ValueError(f"positions outside [0, {32 * n_words})")
    positions = positions.contiguous()
    words = torch.zeros(n_words, dtype=torch.int32)
    kernels.set_positions(positions.data_ptr(), positions.numel(), words.data_ptr(), n_words)
    return words


def words_from_positions_torch(positions: torch.Tensor, n_words: int) -> torch.Tensor:
    """:func:`words_from_positions` in torch, on any device (distinct positions: then sum == OR)."""
    acc = torch.zeros(n_words, dtype=torch.int64, device=positions.device)
    acc.index_add_(0, torch.bitwise_right_shift(positions, 5), torch.bitwise_left_shift(1, positions & 31))
    # Bits 0..31 of distinct positions: the sum is < 2^32; wrap into int32 two's complement.
    return torch.where(acc >= 1 << 31, acc - (1 << 32), acc).to(torch.int32)


def expand_bytes(byte_index: torch.Tensor, byte_value: torch.Tensor) -> torch.Tensor:
    """Sorted bit positions (int64) of the set bits of bytes ``byte_value`` found at ``byte_index``.

    ``byte_index`` must be increasing and ``byte_value`` nonzero int64 in [1, 255]; O(bytes + set bits).
    """
    popcount, positions = _tables(byte_value.device)
    # gather on 1-D tensors: much faster than advanced indexing on CPU.
    counts = popcount.gather(0, byte_value)
    ends = torch.cumsum(counts, 0)
    total = int(ends[-1]) if ends.numel() else 0
    owner = torch.repeat_interleave(counts, output_size=total)
    rank = torch.arange(total, device=byte_value.device).sub_((ends - counts).gather(0, owner))
    bit = positions.gather(0, byte_value.gather(0, owner).mul_(8).add_(rank))
    return byte_index.gather(0, owner).mul_(8).add_(bit)


def set_bits(words: torch.Tensor) -> torch.Tensor:
    """Sorted positions (int64) of the set bits of an int32 word array."""
    if words.device.type == "cpu" and native is not None:
        return set_bits_native(words)
    return set_bits_bytes(words)


def set_bits_native(words: torch.Tensor, threads: int | None = None) -> torch.Tensor:
    """:func:`set_bits` by the compiled kernel (CPU tensors only); ``threads``: at most this many (default
    :func:`kernel_threads`), the result does not depend on it."""
    kernels = require_native()
    if words.dtype != torch.int32 or words.dim() != 1 or words.device.type != "cpu":
        raise ValueError(f"set_bits wants a 1-D int32 CPU tensor, not {words.dtype} {tuple(words.shape)}")
    words = words.contiguous()
    out = torch.empty(kernels.popcount(words.data_ptr(), words.numel()), dtype=torch.int64)
    kernels.set_bits(words.data_ptr(), words.numel(), out.data_ptr(), out.numel(),
                     kernel_threads() if threads is None else threads)
    return out


def set_bits_bytes(words: torch.Tensor) -> torch.Tensor:
    """:func:`set_bits` in torch, byte by byte through the tables, on any device."""
    as_bytes = words.view(torch.uint8)
    nz = torch.nonzero(as_bytes).squeeze(1)
    return expand_bytes(nz, as_bytes.gather(0, nz).to(torch.int64))


def nonzero_positions(x: torch.Tensor) -> torch.Tensor:
    """Sorted int64 indices of the nonzero elements of a 1-D tensor (NaN counts as nonzero).

    Cheaper than ``torch.nonzero(x)``: one conversion pass to a bool mask, then ``nonzero`` over that mask
    read as int64 (eight flags per element, so 1/8 of the elements), then O(nonzeros) to expand.
    """
    n = x.numel()
    padded = (n + 7) // 8 * 8
    mask = torch.empty(padded, dtype=torch.bool, device=x.device)
    mask[n:].zero_()
    mask[:n].copy_(x)  # conversion to bool is x != 0
    groups = mask.view(torch.int64)
    g = torch.nonzero(groups).squeeze(1)
    return expand_bytes(g, pack_flag_bytes(groups.gather(0, g)))
