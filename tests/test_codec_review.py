"""What a review found the codec doing silently, and must not: a stale coarse scale, another bucket's state,
float16 overflow, a zero step that inflates the next one, modes that quantize differently."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from host_agent.codec import CodecState, aggregate_local
from host_agent.codec.quantize import dequantize, quantize
from host_agent.codec.session import DEFAULT_HEADROOM, SCALE_SLACK
from host_agent.errors import AggregationError


def sparse_floats(world: int, n: int, magnitude: float, seed: int, density: float = 0.3,
                  ) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(world):
        x = torch.randn(n, generator=generator) * magnitude
        x[torch.rand(n, generator=generator) > density] = 0
        out.append(x)
    return out


def quantized_sum(inputs: list[torch.Tensor], scale: int) -> torch.Tensor:
    total = torch.stack([quantize(x, scale) for x in inputs]).sum(0, dtype=torch.int64).to(torch.int32)
    return dequantize(total, scale, inputs[0].dtype)


def agreed_scale(inputs: list[torch.Tensor]) -> int:
    """The scale the workers would agree on for these inputs alone (a header round)."""
    return aggregate_local(inputs, "union").stats["scale"]


@pytest.mark.parametrize("mode", ["sketch", "dense", "union"])
def test_a_small_step_after_a_large_one_keeps_its_precision(mode: str) -> None:
    """W = 8, max |x| about 1e4 then about 1e-3: the second step must not reuse the first's scale."""
    state = aggregate_local(sparse_floats(8, 10_000, 1e4 / 4, seed=1), mode).state
    small = sparse_floats(8, 10_000, 1e-3 / 4, seed=2)
    result = aggregate_local(small, mode, state=state)
    assert result.stats["scale"] >= agreed_scale(small) - DEFAULT_HEADROOM - SCALE_SLACK
    assert torch.equal(result.total, quantized_sum(small, result.stats["scale"]))
    exact = torch.stack(small).double().sum(0)
    assert int(((result.total == 0) & (exact != 0)).sum()) == 0, "nonzero sums came back as zero"


@settings(max_examples=12, deadline=None)
@given(st.lists(st.integers(-30, 30), min_size=2, max_size=5), st.sampled_from(["sketch", "dense", "union"]))
def test_the_error_bound_holds_whatever_the_scale_history(exponents: list[int], mode: str) -> None:
    """Scales that jump both ways: each step is the exact sum at a scale no coarser than the agreed one
    by more than headroom + slack binades, and within quantize.py's bound at that scale."""
    world, state = 4, None
    for step, exponent in enumerate(exponents):
        inputs = sparse_floats(world, 600, 2.0**exponent, seed=step)
        result = aggregate_local(inputs, mode, state=state)
        scale = result.stats["scale"]
        assert scale >= agreed_scale(inputs) - DEFAULT_HEADROOM - SCALE_SLACK
        assert torch.equal(result.total, quantized_sum(inputs, scale))
        exact = torch.stack(inputs).double().sum(0)
        bound = world * 2.0 ** (-scale - 1) + 2.0**-23 * result.total.double().abs() + 2.0**-149
        assert bool(((result.total.double() - exact).abs() <= bound).all())
        state = result.state


def test_every_mode_quantizes_a_bucket_alike() -> None:
    """Given the same history, sketch, union and dense return the same floats bit for bit."""
    history = [sparse_floats(4, 5000, m, seed=s) for s, m in enumerate([1.0, 0.5, 2.0, 0.01, 0.01])]
    totals = {}
    for mode in ("sketch", "union", "dense"):
        state, out = None, []
        for inputs in history:
            result = aggregate_local(inputs, mode, state=state)
            state, _ = result.state, out.append(result.total)
        totals[mode] = out
    for step in range(len(history)):
        assert torch.equal(totals["sketch"][step], totals["dense"][step])
        assert torch.equal(totals["union"][step], totals["dense"][step])


def test_another_buckets_state_is_refused() -> None:
    state = aggregate_local(sparse_floats(2, 1000, 1.0, seed=0), "sketch").state
    with pytest.raises(ValueError, match="belongs to a bucket"):
        aggregate_local(sparse_floats(2, 1200, 1.0, seed=1), "sketch", state=state)
    with pytest.raises(ValueError, match="belongs to a bucket"):
        aggregate_local([x.half() for x in sparse_floats(2, 1000, 1.0, seed=1)], "sketch", state=state)
    with pytest.raises(ValueError, match="belongs to a bucket"):
        aggregate_local(sparse_floats(2, 1000, 1.0, seed=1), "sketch", block=2, state=state)


def test_a_float16_sum_that_overflows_raises() -> None:
    inputs = [torch.full((64,), 60000.0, dtype=torch.float16) for _ in range(2)]
    for mode in ("dense", "sketch"):
        with pytest.raises(AggregationError, match="overflows"):
            aggregate_local(inputs, mode)


@pytest.mark.parametrize("mode", ["sketch", "union"])
def test_a_zero_step_does_not_inflate_the_next(mode: str) -> None:
    n, world = 100_000, 4
    zero = [torch.zeros(n) for _ in range(world)]
    state = aggregate_local(zero, mode).state
    after = aggregate_local(sparse_floats(world, n, 1.0, seed=3, density=0.01), mode, state=state)
    dense = aggregate_local(sparse_floats(world, n, 1.0, seed=3, density=0.01), "dense")
    header = 2 * 64 * 4  # the header and count words: at most two more packets
    assert after.stats["bytes_per_worker"] <= dense.stats["bytes_per_worker"] + header


def test_a_state_of_an_all_zero_step_counts_as_unknown() -> None:
    state = CodecState(iteration=3, items=0, exponent=None, elements=500, dtype="torch.float32", block=1)
    result = aggregate_local(sparse_floats(2, 500, 1.0, seed=4), "sketch", state=state)
    assert [s["kind"] for s in result.stats["steps"]][:2] == ["header", "count"]


def test_a_support_that_misses_a_nonzero_is_refused() -> None:
    inputs = sparse_floats(2, 1000, 1.0, seed=5)
    supports = [torch.nonzero(x).squeeze(1)[1:] for x in inputs]  # each misses its first nonzero
    with pytest.raises(ValueError, match="support misses nonzero"):
        aggregate_local(inputs, "sketch", supports=supports)


@pytest.mark.parametrize("options", [{"margin": -0.1}, {"seed": -1}, {"index": "trie"}, {"mode": "foo"}])
def test_options_are_checked_when_the_session_is_made(options: dict) -> None:
    from host_agent.codec import WorkerSession

    with pytest.raises(ValueError):
        WorkerSession(torch.ones(10), 0, 1, **options)
