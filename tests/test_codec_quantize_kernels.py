"""The compiled quantize and dequantize (``cpu/kernels_quantize.c``) against their torch twins in
``host_agent/codec/quantize.py``, bit for bit: random floats of every magnitude (subnormals, ties at
.5, values that saturate an assumed scale), every scale the codec can agree on, into a new tensor and
into a given one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from host_agent.codec import quantize as q
from host_agent.codec.cpu import native_available
from host_agent.codec.quantize import MAX_FIELD, scale_for

REPO_ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not native_available(), reason="the compiled kernels are not built")

#: Every scale an agreement can give: fields 0..254 and W from 1 to 1024.
SCALES = sorted({scale_for(field, world) for field in range(MAX_FIELD + 1) for world in (1, 2, 1024)})


def _torch_twin(function, *args, **kwargs):
    """``function`` as an install without the kernels runs it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(q, "native", None)
        return function(*args, **kwargs)


def _floats(seed: int, n: int, binade: int) -> torch.Tensor:
    """Floats around 2^binade of both signs, with exact ties, zeros, subnormals and the extremes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 2.0**binade
    ties = (torch.randint(-1000, 1000, (n // 8,), generator=g).float() + 0.5) * 2.0**binade
    specials = torch.tensor([0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, 3.4028235e38, -3.4028235e38, 2.0**31,
                             -(2.0**31), 2.0**31 - 64, 0.5, -0.5, 1.5, 2.5])
    return torch.cat([x, ties, specials])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), scale_index=st.integers(0, len(SCALES) - 1),
       binade=st.integers(-140, 120), depth=st.integers(0, 60), clamp=st.booleans())
def test_quantize_gives_the_torch_bits(seed: int, scale_index: int, binade: int, depth: int,
                                       clamp: bool) -> None:
    scale = SCALES[scale_index]
    if clamp:  # an assumed scale: any magnitude, the ones too large for it saturate
        x = _floats(seed, 1003, binade)
    else:  # an agreed scale: every value fits (quantize.py's bound), as the codec guarantees
        x = _floats(seed, 1003, min(max(26 - scale - depth, -149), 120))  # within float32
        x = x[(x.double().abs() * 2.0**scale) < 2.0**30]
        assert x.numel() >= 900  # the draws the filter keeps are most of them
    want = _torch_twin(q.quantize, x, scale, clamp)
    got = q.quantize(x, scale, clamp)
    assert got.dtype == torch.int32
    assert torch.equal(got, want), (scale, clamp, (got != want).nonzero()[:5])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), scale_index=st.integers(0, len(SCALES) - 1))
def test_dequantize_gives_the_torch_bits_into_a_new_or_a_given_tensor(seed: int, scale_index: int) -> None:
    scale = SCALES[scale_index]
    g = torch.Generator().manual_seed(seed)
    edges = torch.tensor([0, 1, -1, 2**31 - 1, -(2**31), 2**24 + 1, -(2**24) - 1], dtype=torch.int32)
    sums = torch.cat([torch.randint(-(2**31), 2**31, (997,), generator=g, dtype=torch.int64).to(torch.int32),
                      edges])
    want = _torch_twin(q.dequantize, sums, scale, torch.float32)
    assert torch.equal(q.dequantize(sums, scale, torch.float32).view(torch.int32), want.view(torch.int32))
    out = torch.full((sums.numel(),), float("nan"))
    assert q.dequantize(sums, scale, torch.float32, out=out) is out
    assert torch.equal(out.view(torch.int32), want.view(torch.int32))


def test_a_view_or_another_dtype_takes_the_torch_code() -> None:
    """The kernels read contiguous float32 and int32 only; anything else still gives the twin's values."""
    x = torch.randn(64, 2)[:, 0]  # a strided view
    assert torch.equal(q.quantize(x, 20), _torch_twin(q.quantize, x.contiguous(), 20))
    sums = torch.arange(-50, 50, dtype=torch.int32)
    half = q.dequantize(sums, 3, torch.float16, out=torch.empty(100, dtype=torch.float16))
    assert torch.equal(half, (sums.float() / 8).half())


def test_the_clamp_margin_is_one_constant_in_python_and_c() -> None:
    header = (REPO_ROOT / "host_agent/codec/cpu/kernels.h").read_text()
    assert re.search(r"#define CLAMP_MARGIN (\d+)", header).group(1) == str(q.CLAMP_MARGIN)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), scale_index=st.integers(-1, len(SCALES) - 1),
       binade=st.integers(-140, 120),
       special=st.sampled_from([None, float("nan"), float("inf"), -float("inf")]))
def test_scan_quantize_gives_the_torch_twins_results(seed: int, scale_index: int, binade: int,
                                                     special: float | None) -> None:
    """One pass for a dense round's lead and words: the nonzero count (NaN counts, -0.0 does not), the
    exponent field of the largest magnitude, finiteness and, at an assumed scale, the clamped words."""
    scale = None if scale_index < 0 else SCALES[scale_index]
    x = _floats(seed, 1003, binade)
    x[torch.randperm(x.numel(), generator=torch.Generator().manual_seed(seed))[:200]] = 0.0
    if special is not None:
        x[seed % x.numel()] = special
    want = _torch_twin(q.scan_quantize, x, scale)
    got = q.scan_quantize(x, scale)
    assert (got.nonzero, got.field, got.finite) == (want.nonzero, want.field, want.finite)
    assert (got.words is None) == (scale is None)
    if scale is not None and want.finite:  # a bucket that is not finite sends zeros: its words are unread
        assert torch.equal(got.words, want.words)


def test_scan_quantize_adds_its_chunks() -> None:
    """Past one chunk of the C loop (SCAN_CHUNK elements): counts add up and the largest is found in any."""
    x = torch.zeros((1 << 20) * 2 + 7)
    x[::3] = 1.0
    x[-1] = -3.0e5
    got = q.scan_quantize(x, 10)
    assert got.nonzero == int(torch.count_nonzero(x))
    assert got.field == q.exponent_field(x)[0]
    assert torch.equal(got.words, _torch_twin(q.quantize, x, 10, True))
