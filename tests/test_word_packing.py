"""Word packing (``host_agent/codec/word_packing.py``): the round trip is exact for any int32 words (every
block width, lengths off the block size, wrapping sums), the compiled kernels (``cpu/kernels_pack.c``)
write the torch twin's bytes and read them back the same, and a malformed buffer is refused by both with
the destination left as it was."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from host_agent.codec import word_packing as wp
from host_agent.codec.cpu import native_available
from host_agent.errors import AggregationError

REPO_ROOT = Path(__file__).resolve().parent.parent
KERNELS = ["torch", "native"] if native_available() else ["torch"]


def _run(kernels: str, function, *args, **kwargs):
    """``function`` with the compiled kernels, or as an install without them runs it."""
    with pytest.MonkeyPatch.context() as patch:
        if kernels == "torch":
            patch.setattr(wp, "native", None)
        return function(*args, **kwargs)


def _words(seed: int, n: int, widest: int) -> torch.Tensor:
    """Words of magnitudes up to 2^widest of both signs, with blocks of zeros and the int32 extremes."""
    g = torch.Generator().manual_seed(seed)
    shifts = torch.randint(0, widest + 1, (n,), generator=g)
    words = torch.randint(-(2**31), 2**31, (n,), generator=g, dtype=torch.int64) >> (32 - shifts.clamp(min=1))
    words[shifts == 0] = 0
    if n >= 96:
        words[32:64] = 0  # a whole block of zeros: width 0
        words[64] = -(2**31)
        words[65] = 2**31 - 1
    return words.to(torch.int32)


@pytest.mark.parametrize("kernels", KERNELS)
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(0, 700), widest=st.integers(0, 32))
def test_round_trip_is_exact(kernels: str, seed: int, n: int, widest: int) -> None:
    words = _words(seed, n, widest)
    packed = _run(kernels, wp.pack, words)
    assert packed.numel() <= wp.capacity(n)
    assert torch.equal(_run(kernels, wp.unpack, packed, n), words)


@pytest.mark.skipif(not native_available(), reason="the compiled kernels are not built")
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(0, 3000), widest=st.integers(0, 32))
def test_kernels_write_the_torch_bytes(seed: int, n: int, widest: int) -> None:
    words = _words(seed, n, widest)
    assert torch.equal(_run("native", wp.pack, words), _run("torch", wp.pack, words))


@pytest.mark.parametrize("kernels", KERNELS)
def test_unpack_adds_mod_2_32(kernels: str) -> None:
    """Summing packed messages into a total wraps as the switch's ADD does."""
    g = torch.Generator().manual_seed(3)
    parts = [torch.randint(-(2**31), 2**31, (1000,), generator=g, dtype=torch.int64).to(torch.int32)
             for _ in range(4)]
    total = parts[0].clone()
    for part in parts[1:]:
        _run(kernels, wp.unpack, _run(kernels, wp.pack, part), 1000, total, add=True)
    want = sum(p.to(torch.int64) for p in parts) & 0xFFFFFFFF
    assert torch.equal(total.to(torch.int64) & 0xFFFFFFFF, want)


@pytest.mark.parametrize("kernels", KERNELS)
def test_narrow_words_take_fewer_bytes(kernels: str) -> None:
    """A block's width follows its widest value: 20-bit magnitudes take 21 bits (sign), zeros none."""
    words = torch.cat([torch.full((64,), -(2**20)), torch.zeros(64, dtype=torch.int64)]).to(torch.int32)
    packed = _run(kernels, wp.pack, words)
    assert packed[:4].tolist() == [21, 21, 0, 0]
    assert packed.numel() == 4 + 2 * 21 * 4


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("damage", ["truncated", "extended", "wide", "short"])
def test_malformed_buffers_are_refused(kernels: str, damage: str) -> None:
    words = _words(7, 200, 24)
    packed = _run(kernels, wp.pack, words).clone()
    if damage == "truncated":
        packed = packed[:-4].clone()
    elif damage == "extended":
        packed = torch.cat([packed, torch.zeros(4, dtype=torch.uint8)])
    elif damage == "wide":
        packed[1] = 33
    else:
        packed = packed[:3].clone()
    out = torch.arange(200, dtype=torch.int32)
    with pytest.raises(AggregationError, match="does not hold 200 words"):
        _run(kernels, wp.unpack, packed, 200, out, add=True)
    assert torch.equal(out, torch.arange(200, dtype=torch.int32))


def test_block_size_matches_the_kernels() -> None:
    header = (REPO_ROOT / "host_agent/codec/cpu/kernels.h").read_text()
    assert re.search(r"#define PACK_BLOCK_WORDS (\d+)", header).group(1) == str(wp.BLOCK_WORDS)


@pytest.mark.skipif(not native_available(), reason="the compiled kernels are not built")
def test_kernels_refuse_a_buffer_too_small() -> None:
    from host_agent.codec.cpu import native

    words = torch.zeros(100, dtype=torch.int32)
    out = torch.empty(wp.capacity(100) - 1, dtype=torch.uint8)
    with pytest.raises(ValueError, match="need"):
        native.pack(words.data_ptr(), 100, out.data_ptr(), out.numel())


def test_buffers_off_the_cpu_are_refused() -> None:
    """The kernels read and write through addresses: a tensor on another device never reaches them."""
    words = torch.zeros(100, dtype=torch.int32)
    with pytest.raises(ValueError, match="CPU"):
        wp.unpack(torch.empty(wp.capacity(100), dtype=torch.uint8, device="meta"), 100)
    with pytest.raises(ValueError, match="CPU"):
        wp.pack(words, torch.empty(wp.capacity(100), dtype=torch.uint8, device="meta"))


@pytest.mark.skipif(not native_available(), reason="the compiled kernels are not built")
def test_kernels_refuse_lengths_whose_room_would_overflow() -> None:
    from host_agent.codec.cpu import native

    with pytest.raises(ValueError, match="at most"):
        native.pack(0, 2**62, 0, 2**62)
    with pytest.raises(ValueError, match="out of range"):
        native.unpack(0, 0, 2**62, 0, False)
