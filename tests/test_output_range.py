"""Decoding only an output range (a reduce_scatter's shard): the same messages on the wire as a whole
decode, each range the same slice of the whole total bit for bit, and only the range dequantized where
the mode allows (union, dense; sketch peels every candidate)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from host_agent.agent import Agent
from host_agent.codec import AggregationError, WorkerSession, reduce_words
from tests.harness.agents import run_local
from tests.harness.local_backend import LocalGroup

W = 4
N = 1003  # not a multiple of W nor of a block
RANGES = [(0, 250), (251, 500), (499, N), (7, 7)]  # unaligned to a block, overlapping, to the end, empty


def inputs(seed: int, dtype: torch.dtype = torch.float32, n: int = N, density: float = 0.05,
           scale: float = 100.0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.where(torch.rand(n, generator=g) < density, torch.randn(n, generator=g) * scale, 0.0)
            .to(dtype) for _ in range(W)]


def drive(sessions: list[WorkerSession]) -> list[tuple[str, str, list[torch.Tensor]]]:
    """Run the sessions to the end (every worker's words reduced, as the switch does); what each sent."""
    sent = []
    while (msgs := [s.next_message() for s in sessions])[0] is not None:
        sent.append((msgs[0].op.name, msgs[0].kind, [m.words.clone() for m in msgs]))
        total = reduce_words(msgs[0].op, [m.words for m in msgs])
        for s in sessions:
            s.receive(total)
    return sent


def whole_and_ranges(xs: list[torch.Tensor], ranges: list[tuple[int, int]], **options):
    """The whole decode's sessions and the ranged ones', after checking that both sent the same words."""
    whole = [WorkerSession(x, r, W, **options) for r, x in enumerate(xs)]
    ranged = [WorkerSession(x, r, W, output_range=ranges[r], **options) for r, x in enumerate(xs)]
    whole_sent, ranged_sent = drive(whole), drive(ranged)
    assert [(op, kind) for op, kind, _ in whole_sent] == [(op, kind) for op, kind, _ in ranged_sent]
    for (_, _, a), (_, _, b) in zip(whole_sent, ranged_sent, strict=True):
        assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    return [s.result() for s in whole], [s.result() for s in ranged]


def assert_slices(whole, ranged, ranges: list[tuple[int, int]]) -> None:
    for (lo, hi), result in zip(ranges, ranged, strict=True):
        expected = whole[0].total[lo:hi]
        assert result.total.shape == (hi - lo,) and result.total.dtype == expected.dtype
        assert torch.equal(result.total.view(torch.uint8), expected.view(torch.uint8))  # bit for bit, NaN too
        assert result.state == whole[0].state  # the next round's sizes and scale do not depend on the range


@pytest.mark.parametrize("mode", ["sketch", "union", "dense"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32])
@pytest.mark.parametrize("block", [1, 3])
def test_each_range_is_the_slice_of_the_whole_total(mode: str, dtype: torch.dtype, block: int) -> None:
    xs = inputs(1, dtype)
    whole, ranged = whole_and_ranges(xs, RANGES, mode=mode, block=block, index="bitmap")
    assert_slices(whole, ranged, RANGES)
    decoded = [r.stats["decoded_elements"] for r in ranged]
    everything = whole[0].stats["decoded_elements"]
    if mode == "dense":
        assert everything == N and decoded == [hi - lo for lo, hi in RANGES]
    elif mode == "union":  # the candidates (with a bitmap: the union) that overlap the range, whole items
        assert everything == whole[0].stats["candidates"] * block
        in_ranges = [len({i // block for i in range(lo, hi)} & set(_candidate_items(xs, block))) * block
                     for lo, hi in RANGES]
        assert decoded == in_ranges and decoded[-1] == 0
    else:  # peeling recovers every candidate, whatever the range
        assert decoded == [everything] * W and everything == whole[0].stats["candidates"] * block


def _candidate_items(xs: list[torch.Tensor], block: int) -> list[int]:
    """The items some worker holds a nonzero in: the bitmap index's candidates (the union)."""
    held = torch.stack([x != 0 for x in xs]).any(0)
    padded = torch.cat([held, held.new_zeros(-held.numel() % block)])
    return padded.view(-1, block).any(1).nonzero().view(-1).tolist()


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), block=st.integers(1, 5), ends=st.tuples(st.floats(0, 1), st.floats(0, 1)),
       mode=st.sampled_from(["sketch", "union", "dense"]), seed=st.integers(0, 1000))
def test_any_range_of_any_bucket_is_its_slice(n: int, block: int, ends: tuple[float, float], mode: str,
                                              seed: int) -> None:
    lo, hi = sorted(round(end * n) for end in ends)
    whole, ranged = whole_and_ranges(inputs(seed, n=n, density=0.2), [(lo, hi)] * W, mode=mode, block=block)
    assert_slices(whole, ranged, [(lo, hi)] * W)


@pytest.mark.parametrize("mode", ["sketch", "union"])
def test_a_bloom_index_and_a_redone_scale_and_a_residue_keep_the_slices(mode: str) -> None:
    """Candidates that are false positives, the values round after a scale that did not hold, and (sketch)
    a residue round after a failed peel: every path that ends a sparse decode."""
    xs = inputs(2, n=20000, density=0.02)
    whole, ranged = whole_and_ranges(xs, RANGES, mode=mode, index="bloom")
    assert_slices(whole, ranged, RANGES)
    assert whole[0].stats["index"] == "bloom"
    louder = [x * 2.0**20 for x in xs]  # the scale assumed from the state does not hold
    whole, ranged = whole_and_ranges(louder, RANGES, mode=mode, index="bloom", state=whole[0].state)
    assert_slices(whole, ranged, RANGES)
    if mode == "sketch":  # the values round after a redone scale: no peeling, only the range decoded
        assert whole[0].stats["scale_redo"]
        assert ranged[0].stats["decoded_elements"] < whole[0].stats["decoded_elements"]
        whole, ranged = whole_and_ranges(xs, RANGES, mode=mode, cells=64, expected_items=1500)
        assert whole[0].stats["residue"] > 0
        assert_slices(whole, ranged, RANGES)


def test_a_non_finite_input_makes_every_range_nan() -> None:
    xs = inputs(3)
    xs[2][900] = float("inf")  # outside ranks 0 and 1's ranges
    for mode in ("sketch", "union", "dense"):
        whole, ranged = whole_and_ranges(xs, RANGES, mode=mode)
        assert_slices(whole, ranged, RANGES)
        for result in ranged:
            assert result.total.isnan().all() and result.stats["nonfinite_ranks"] == [2]
            assert result.stats["decoded_elements"] == 0


def test_an_overflow_outside_a_range_fails_every_worker_alike() -> None:
    """The float16 sum overflows only at element 900: a worker whose range misses it raises the same
    error as the others, so that no worker goes on alone."""
    xs = [torch.zeros(N, dtype=torch.float16) for _ in range(W)]
    for x in xs:
        x[900], x[10] = 30000.0, 1.0
    for mode in ("sketch", "union", "dense"):
        sessions = [WorkerSession(x, r, W, mode=mode, output_range=RANGES[r]) for r, x in enumerate(xs)]
        with pytest.raises(AggregationError, match="overflows"):
            drive(sessions)  # the first worker raises; the others, once they decode:
        errors = []
        for session in sessions:
            with pytest.raises(AggregationError, match="overflows") as failure:
                session.next_message()
            errors.append(str(failure.value))
        assert len(set(errors)) == 1


@pytest.mark.parametrize("bad", [(-1, 3), (5, 3), (0, N + 1), [0, 3], (0.0, 3), (True, 3), (1, 2, 3)])
def test_a_bad_range_fails_clearly(bad: object) -> None:
    x = inputs(4)[0]
    with pytest.raises(ValueError, match="output_range"):
        WorkerSession(x, 0, W, output_range=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="out must have the output range's length"):
        WorkerSession(x, 0, W, output_range=(0, 10), out=torch.zeros(N))
    agent = Agent(LocalGroup(1).members()[0])
    with pytest.raises(ValueError, match="output_range"):
        agent.allreduce(x, output_range=bad)  # type: ignore[arg-type]
    assert agent.allreduce(x, output_range=(3, 9)).total.shape == (6,)  # the agent did not fail
    agent.close()


@pytest.mark.parametrize("mode", ["union", "dense", "sketch", "auto"])
def test_a_reduce_scatter_through_the_agent_is_the_all_reduce_sliced(mode: str) -> None:
    """W=4 agents over the in-memory backend: each keeps the shard of a 4 x 2500 bucket, call after
    call (the state carries over; sparse, then dense, so that auto picks sketch, then dense), and gets
    the all_reduce's slice bit for bit; union and dense decode only the shard."""
    shard = 2500
    densities = [0.02, 0.02, 0.9, 0.9]
    steps = [inputs(10 + step, n=W * shard, density=density) for step, density in enumerate(densities)]

    def work(agent: Agent) -> list:
        out = []
        for xs in steps:
            full = agent.allreduce(xs[agent.rank], mode=mode, key="full")
            lo = agent.rank * shard
            part = agent.allreduce(xs[agent.rank], mode=mode, key="shard", output_range=(lo, lo + shard))
            out.append((full, part))
        return out

    results = run_local(W, work)
    if mode == "auto":
        assert {part.stats["mode"] for _, part in results[0]} == {"sketch", "dense"}
    for rank, calls in enumerate(results):
        assert not isinstance(calls, Exception), calls
        for full, part in calls:
            lo = rank * shard
            assert torch.equal(part.total, full.total[lo : lo + shard])
            assert part.stats["mode"] == full.stats["mode"] and part.stats["output_range"] == (lo, lo + shard)
            assert part.stats["bytes_sent"] == full.stats["bytes_sent"]
            chosen, codec = part.stats["mode"], part.stats["codec"]
            if codec["protocol"] == "dense":  # dense mode, or a sparse mode that sent the bucket densely
                assert part.stats["decoded_elements"] == shard
            elif chosen == "union" or codec["scale_redo"]:
                held = (full.total[lo : lo + shard] != 0).sum()
                assert held <= part.stats["decoded_elements"] < full.stats["decoded_elements"]
            else:
                assert part.stats["decoded_elements"] == full.stats["decoded_elements"]
