"""A bucket's aggregations in sequence: whatever the previous steps were (scale jumps either way, all-zero
steps, a state from another bucket), each step stays within the documented error bound and costs no more
than sending the bucket densely."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from host_agent.codec import SCALE_SLACK, aggregate_local
from host_agent.codec.options import DEFAULT_HEADROOM
from host_agent.codec.quantize import dequantize, quantize
from lhc_ina.constants import LANES, PAYLOAD_BYTES

SIGNIFICAND_BITS = {torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}
MAGNITUDES = {
    torch.float32: [1e-30, 1e-6, 1e-3, 1.0, 1e3, 1e6, 1e30],
    torch.bfloat16: [1e-30, 1e-3, 1.0, 1e3, 1e30],
    torch.float16: [1e-3, 1e-1, 1.0, 30.0, 1000.0],  # 8 workers' sums of N(0, 1000^2) fit float16
}


def draw(seed: int, world: int, n: int, density: float, magnitude: float, dtype: torch.dtype) -> list:
    g = torch.Generator().manual_seed(seed)
    xs = []
    for _ in range(world):
        held = torch.rand(n, generator=g) < density
        xs.append(torch.where(held, torch.randn(n, generator=g) * magnitude, 0.0).to(dtype))
    return xs


def dense_cost(n: int) -> int:
    """What the dense protocol sends: the agreement, the header and the bucket, one packet each at least."""
    return (1 + 1 + math.ceil(n / LANES)) * PAYLOAD_BYTES


def assert_within_documented_bound(total: torch.Tensor, xs: list[torch.Tensor]) -> None:
    """The bound of host_agent.codec.quantize, from the inputs alone (whatever scale the codec used)."""
    world = len(xs)
    exact = torch.stack([x.double() for x in xs]).sum(0)
    largest = max(float(x.double().abs().max()) for x in xs)
    lag = DEFAULT_HEADROOM + SCALE_SLACK
    p = SIGNIFICAND_BITS[total.dtype]
    tiny = torch.finfo(total.dtype).smallest_normal * torch.finfo(total.dtype).eps
    quant = world * 2.0 ** (lag + world.bit_length() - 31) * max(largest, 2.0**-126)
    bound = quant + 2.0 ** (1 - p) * total.double().abs() + 2 * tiny
    error = (total.double() - exact).abs()
    worst = float((error - bound).max())
    assert worst <= 1e-12 * max(largest, 1e-300), f"error exceeds the documented bound by {worst}"


def assert_quantized_sum(result, xs: list[torch.Tensor]) -> None:
    s = result.stats["scale"]
    q = torch.stack([quantize(x, s).to(torch.int64) for x in xs]).sum(0)
    assert torch.equal(result.total, dequantize(q.to(torch.int32), s, xs[0].dtype))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31),
    world=st.integers(1, 8),
    n=st.integers(1, 3000),
    mode=st.sampled_from(["sketch", "union", "dense"]),
    dtype=st.sampled_from(sorted(SIGNIFICAND_BITS, key=str)),
    density=st.sampled_from([0.01, 0.05, 0.1, 0.5, 1.0]),
    data=st.data(),
)
def test_every_step_after_any_history_is_within_the_bound_and_no_dearer_than_dense(
    seed, world, n, mode, dtype, density, data
):
    # each step's magnitude is free, so the scale jumps both ways; 0 is an all-zero step
    steps = data.draw(st.lists(st.sampled_from([0.0, *MAGNITUDES[dtype]]), min_size=2, max_size=5))
    state = None
    for step, magnitude in enumerate(steps):
        xs = draw(seed + step, world, n, density if magnitude else 0.0, magnitude or 1.0, dtype)
        result = aggregate_local(xs, mode=mode, state=state, seed=seed)
        assert_within_documented_bound(result.total, xs)
        assert_quantized_sum(result, xs)
        limit = dense_cost(n) * (2 if result.stats["scale_redo"] else 1)  # a redo sends one more round
        assert result.stats["bytes_per_worker"] <= limit, result.stats["steps"]
        state = result.state


def test_a_coarse_scale_from_a_large_step_is_not_kept_for_a_small_one():
    # W = 8, n = 10k, max |x| about 1e4 and then about 1e-3: at the stale scale a third of the sums vanished
    for mode in ("sketch", "dense", "union"):
        big = draw(1, 8, 10_000, 0.05, 2500.0, torch.float32)
        state = aggregate_local(big, mode=mode).state
        small = draw(2, 8, 10_000, 0.05, 2.5e-4, torch.float32)
        result = aggregate_local(small, mode=mode, state=state)
        exact = torch.stack([x.double() for x in small]).sum(0)
        assert not bool(((result.total == 0) & (exact != 0)).any()), mode
        assert_within_documented_bound(result.total, small)
        assert result.stats["scale_redo"] == (mode != "union")  # union agrees on the scale first
        assert result.state.exponent == aggregate_local(small, mode=mode).state.exponent


def test_a_scale_within_the_slack_is_kept_without_a_redo():
    xs = draw(3, 4, 5000, 0.05, 1.0, torch.float32)
    state = aggregate_local(xs, mode="sketch").state
    smaller = [x / 2**SCALE_SLACK for x in xs]  # headroom + slack binades below the assumed exponent
    result = aggregate_local(smaller, mode="sketch", state=state)
    assert not result.stats["scale_redo"] and result.stats["rounds"] == 1
    assert_within_documented_bound(result.total, smaller)


def test_an_all_zero_step_leaves_the_size_unknown_instead_of_zero():
    # the next step counts again, instead of sending a tiny sketch behind a saturated filter and then
    # the whole bucket as residue (400,640 bytes where the steady state costs 52,736)
    n, world = 100_000, 8
    xs = draw(4, world, n, 0.01, 1.0, torch.float32)
    steady_state = aggregate_local(xs, mode="sketch").state
    steady = aggregate_local(draw(5, world, n, 0.01, 1.0, torch.float32), mode="sketch", state=steady_state)
    zero = aggregate_local([torch.zeros(n)] * world, mode="sketch", state=steady.state)
    assert zero.state.items is None and not zero.total.any()
    after = aggregate_local(draw(6, world, n, 0.01, 1.0, torch.float32), mode="sketch", state=zero.state)
    assert after.stats["residue"] == 0
    # one counting round more, and a sketch sized from the summed counts (a little above the union)
    assert after.stats["rounds"] == 2
    assert after.stats["bytes_per_worker"] <= 1.05 * steady.stats["bytes_per_worker"] + 2 * PAYLOAD_BYTES


@pytest.mark.parametrize("mode", ["sketch", "union"])
def test_an_estimate_larger_than_the_bucket_sends_it_densely(mode):
    n = 20_000
    full = draw(7, 4, n, 1.0, 1.0, torch.float32)  # every element nonzero: a sketch would outgrow it
    first = aggregate_local(full, mode=mode)
    assert first.stats["protocol"] == "dense" and first.stats["bytes_per_worker"] <= dense_cost(n)
    assert_within_documented_bound(first.total, full)
    again = aggregate_local(draw(8, 4, n, 1.0, 1.0, torch.float32), mode=mode, state=first.state)
    assert again.stats["protocol"] == "dense" and again.stats["bytes_per_worker"] <= dense_cost(n)
    assert_quantized_sum(again, draw(8, 4, n, 1.0, 1.0, torch.float32))
    sparse = draw(9, 4, n, 0.01, 1.0, torch.float32)
    after = aggregate_local(sparse, mode=mode, state=again.state)  # sized from the dense step's count
    assert after.stats["bytes_per_worker"] <= dense_cost(n)
    assert_within_documented_bound(after.total, sparse)
    assert aggregate_local(sparse, mode=mode, state=after.state).stats["bytes_per_worker"] < n


def test_a_state_made_for_another_bucket_is_not_used():
    xs = draw(9, 3, 4000, 0.02, 1.0, torch.float32)
    state = aggregate_local(xs, mode="sketch").state
    assert state.shape is not None and state.shape.length == 4000
    for other, kwargs in [
        (draw(10, 3, 3000, 0.02, 1.0, torch.float32), {}),  # DDP rebuilt its buckets
        ([x.to(torch.float16) for x in xs], {}),
        (xs, {"block": 2}),
    ]:
        result = aggregate_local(other, state=state, **kwargs)
        reason = result.stats["state_reset"]
        assert "the state was made for 4000 float32 elements, block 1" in reason
        assert result.state.iteration == 1  # started afresh
        fresh = aggregate_local(other, **kwargs)
        assert torch.equal(result.total, fresh.total) and result.state == fresh.state
    same = aggregate_local(xs, state=state)
    assert "state_reset" not in same.stats and same.state.iteration == 2
    other_mode = aggregate_local(xs, state=state, mode="union")  # mode auto switches modes per call
    assert "state_reset" not in other_mode.stats and other_mode.state.iteration == 2


def test_every_mode_quantizes_a_bucket_alike_given_the_same_history():
    """One scale rule for every mode: sketch, union and dense return the same floats bit for bit, so the
    host agent's auto may switch modes between steps (and the demo's losses match dense's exactly)."""
    magnitudes = [1.0, 0.5, 2.0, 0.01, 0.01]
    history = [draw(20 + s, 4, 5000, 0.3, m, torch.float32) for s, m in enumerate(magnitudes)]
    totals = {}
    for mode in ("sketch", "union", "dense"):
        state, totals[mode] = None, []
        for xs in history:
            result = aggregate_local(xs, mode=mode, state=state)
            state = result.state
            totals[mode].append(result.total)
    for step in range(len(history)):
        assert torch.equal(totals["sketch"][step], totals["dense"][step]), step
        assert torch.equal(totals["union"][step], totals["dense"][step]), step


@pytest.mark.parametrize("mode", ["sketch", "union"])
def test_a_tiny_bucket_costs_no_more_packets_than_dense(mode):
    """Found by the property above: 3 elements, union's index and values took a packet each where the
    dense bucket takes one; the choice to go dense counts whole packets."""
    xs = [torch.tensor([0.0, 1e-30, 0.0], dtype=torch.bfloat16)]
    result = aggregate_local(xs, mode=mode)
    assert result.stats["bytes_per_worker"] <= dense_cost(3), result.stats["steps"]
    assert_quantized_sum(result, xs)
