"""The codec's bounds for jobs of up to MAX_JOB_WORKERS (1024) workers (issue 41): the quantization scale
keeps the sum of W values in int32, integers at the bound sum exactly, the agreement message names who
took part without a word per rank, a non-finite worker is named, and the seal's W x tag argument holds.
Property tests at the extremes, as docs/codec.md states them."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from host_agent.codec import AggregationError, WorkerSession, aggregate_local, reduce_words
from host_agent.codec.agreement import AGREE_WORDS, agreement_words, check_agreement, signed_word
from host_agent.codec.quantize import int_bound, quantize, scale_for
from host_agent.seal import check_seal
from lhc_ina.constants import LANES, MAX_JOB_WORKERS, Op

W = MAX_JOB_WORKERS


def largest_with_field(field: int) -> float:
    """The largest float32 whose exponent field is ``field`` (every bit of its significand set)."""
    return float(torch.tensor((field << 23) | 0x7FFFFF, dtype=torch.int32).view(torch.float32))


@settings(max_examples=300, deadline=None)
@given(world=st.integers(1, W), field=st.integers(1, 254), negative=st.booleans())
def test_w_workers_at_the_quantization_limit_sum_inside_int32(world, field, negative):
    value = largest_with_field(field) * (-1 if negative else 1)
    q = int(quantize(torch.tensor([value]), scale_for(field, world))[0])
    assert world * abs(q) < 1 << 31  # W * max|q| < 2^31: the sum of every worker's q fits int32
    assert abs(q) >= 1 << (30 - world.bit_length())  # and the scale wastes at most one binade


@pytest.mark.parametrize("mode", ["dense", "sketch", "union"])
def test_1024_workers_at_the_integer_bound_sum_exactly(mode):
    bound = int_bound(W)
    assert W * bound <= (1 << 31) - 1
    xs = [torch.zeros(40, dtype=torch.int32) for _ in range(W)]
    for rank, x in enumerate(xs):
        x[rank % 40] = bound if rank % 3 else -bound
        x[39] = bound  # every worker at the bound in one element: the sum is W * bound exactly
    want = torch.stack([x.to(torch.int64) for x in xs]).sum(0)
    assert int(want[39]) == W * bound
    assert torch.equal(aggregate_local(xs, mode=mode).total.to(torch.int64), want)


def test_1024_workers_one_beyond_the_integer_bound_fail_together_naming_it():
    xs = [torch.zeros(8, dtype=torch.int32) for _ in range(W)]
    xs[777][2] = int_bound(W) + 1
    with pytest.raises(AggregationError, match=r"worker\(s\) \[777\] exceed the bound") as failure:
        aggregate_local(xs, mode="dense")
    assert failure.value.ranks == (777,)


@pytest.mark.parametrize("mode", ["dense", "sketch"])
def test_1024_workers_at_the_float_limit_stay_inside_the_error_bound(mode):
    field = 200
    m = largest_with_field(field)
    xs = [torch.full((16,), m if r % 2 else m / 2) for r in range(W)]
    total = aggregate_local(xs, mode=mode).total.double()
    exact = sum(float(x[0]) for x in xs)
    k = W.bit_length()
    bound = W * 2.0 ** (k - 31) * m + 2.0**-23 * abs(exact)  # docs/codec.md's bound with lag 0
    assert float((total - exact).abs().max()) <= bound
    assert bool(torch.isfinite(total).all())


@settings(max_examples=3, deadline=None)
@given(rank=st.integers(0, W - 1))
def test_one_non_finite_worker_among_1024_is_named_and_every_total_is_nan(rank):
    xs = [torch.full((8,), 1.0) for _ in range(W)]
    xs[rank][5] = float("inf") if rank % 2 else float("nan")
    result = aggregate_local(xs, mode="sketch")
    assert bool(torch.isnan(result.total).all())
    assert result.stats["nonfinite_ranks"] == [rank]


def agree(ranks: list[int], digests: dict[int, int] | None = None) -> torch.Tensor:
    digests = digests or {}
    words = [agreement_words(r, digests.get(r, 0xC0FFEE), 3, torch.device("cpu")) for r in ranks]
    return reduce_words(Op.ADD, words)


def test_the_agreement_is_one_packet_whatever_the_job():
    assert AGREE_WORDS + 1 <= LANES  # the seal folds in and it is still one packet
    assert check_agreement(agree(list(range(W))), W) == 3 * W


@settings(max_examples=20, deadline=None)
@given(twice=st.integers(0, W - 1), dropped=st.integers(0, W - 1))
def test_a_rank_claimed_twice_among_1024_is_caught_even_when_the_count_matches(twice, dropped):
    ranks = [r for r in range(W) if r != dropped] + [twice]
    if twice == dropped:  # a plain job after all
        assert check_agreement(agree(ranks), W) == 3 * W
        return
    with pytest.raises(AggregationError, match="claimed by more than one"):
        check_agreement(agree(ranks), W)


@settings(max_examples=20, deadline=None)
@given(odd=st.sets(st.integers(0, W - 1), min_size=1, max_size=3), other=st.integers(0, (1 << 32) - 1))
def test_a_differing_digest_among_1024_is_caught_and_its_rank_is_among_those_named(odd, other):
    if other == 0xC0FFEE:
        other += 1
    digests = {r: other for r in odd}
    with pytest.raises(AggregationError, match="disagree on the codec parameters") as failure:
        check_agreement(agree(list(range(W)), digests), W)
    if 0 not in odd:  # rank 0 is the reference past 16 workers: a differing rank 0 names every lane
        assert set(odd) <= set(failure.value.ranks)


def test_a_missing_rank_among_1024_is_named_exactly():
    with pytest.raises(AggregationError, match=r"1023 of 1024 workers took part: rank\(s\) \[513\] missing"):
        check_agreement(agree([r for r in range(W) if r != 513]), W)


def test_sessions_of_1024_workers_agree_and_name_one_odd_worker():
    x = torch.zeros(8)
    sessions = [WorkerSession(x, r, W, mode="dense", seed=7 if r == 600 else 0) for r in range(W)]
    summed = reduce_words(Op.ADD, [s.next_message().words for s in sessions])
    for s in (sessions[0], sessions[600], sessions[-1]):
        with pytest.raises(AggregationError, match="disagree") as failure:
            s.receive(summed)
        assert 600 in failure.value.ranks and len(failure.value.ranks) == W // 16


@settings(max_examples=200, deadline=None)
@given(world=st.integers(2, W), short=st.integers(1, W - 1), tag=st.integers(0, (1 << 31) - 1))
def test_the_seal_tells_w_workers_from_fewer_for_every_w_up_to_1024(world, short, tag):
    tag = tag << 1 | 1  # round_tag's tags are odd
    short = min(short, world - 1)
    check_seal(torch.tensor([signed_word((world * tag) & 0xFFFFFFFF)], dtype=torch.int32), tag, world, 0, 0)
    fewer = ((world - short) * tag) & 0xFFFFFFFF  # a worker short, its word zero (or another call's)
    with pytest.raises(AggregationError, match="seal"):
        check_seal(torch.tensor([signed_word(fewer)], dtype=torch.int32), tag, world, 0, 0)
