"""The Agent over the in-process backend: half-precision buckets, top-k with error feedback, mode auto's
agreement, and the local backend's own checks."""

from __future__ import annotations

import pytest
import torch

from host_agent.agent import Agent
from host_agent.agent_backend import LinkEstimate
from host_agent.auto import agreed_link, choose_mode, link_words
from host_agent.codec import BucketShape, CodecState
from host_agent.codec.arith import add_int32
from host_agent.codec.items import nonzero_rows
from host_agent.errors import AggregationError
from host_agent.torch_hook import LhcHookState, _sparsify
from lhc_ina.constants import MAX_JOB_WORKERS
from tests.harness.agents import run_local, sparse_inputs
from tests.harness.local_backend import LocalGroup


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_buckets_are_the_sum_at_the_agreed_scale(dtype: torch.dtype) -> None:
    inputs = [torch.randn(3000, generator=torch.Generator().manual_seed(r)).to(dtype) for r in range(3)]
    results = run_local(3, lambda agent: agent.allreduce(inputs[agent.rank], mode="sketch"))
    exact = torch.stack([x.float() for x in inputs]).sum(0)
    for result in results:
        assert result.total.dtype == dtype
        assert torch.equal(result.total, results[0].total)
        scale = result.stats["codec"]["scale"]
        assert float((result.total.float() - exact).abs().max()) <= 3 * 2.0 ** (-scale - 1) + 2**-7 * 8


def test_topk_keeps_what_it_does_not_send() -> None:
    """Error feedback: over steps, what was sent plus what is held back equals every gradient's sum."""
    state = LhcHookState.__new__(LhcHookState)
    state.topk_ratio, state.residuals = 0.1, {}
    generator = torch.Generator().manual_seed(0)
    sent, given = torch.zeros(1000), torch.zeros(1000)
    for _ in range(5):
        gradient = torch.randn(1000, generator=generator)
        given += gradient
        sparse = _sparsify(state, "bucket", gradient)
        assert int((sparse != 0).sum()) == 100
        sent += sparse
    assert torch.allclose(sent + state.residuals["bucket"], given, atol=1e-5)


def test_mode_auto_agrees_on_the_link_and_prices_modes() -> None:
    words = link_words(LinkEstimate(1e-3, 1e7)) + link_words(LinkEstimate(3e-3, 3e7)) + link_words(None)
    link = agreed_link(words, 3)  # the mean of the two that measured
    assert link is not None
    assert abs(link.rtt_s - 2e-3) < 1e-5 and abs(link.bytes_per_s - 2e7) < 1e4
    # 1024 workers, each at the cap of both figures: the sums stay exact in int32 lanes (no carry lost)
    capped = link_words(LinkEstimate(1e3, 1e12))
    summed = add_int32([capped] * MAX_JOB_WORKERS)
    top = agreed_link(summed, MAX_JOB_WORKERS)
    assert top is not None and top.rtt_s == 2**26 / 1e6 and top.bytes_per_s == 2**26 * 1e3
    assert agreed_link(link_words(None), 1) is None
    shape = BucketShape(1_000_000, "float32", 1)
    sparse = CodecState(1, items=100, exponent=None, shape=shape)
    dense = CodecState(1, items=900_000, exponent=None, shape=shape)
    assert choose_mode(1_000_000, 4, 1, sparse, link).mode in ("sketch", "union")
    assert choose_mode(1_000_000, 4, 1, dense, link).mode == "dense"
    assert choose_mode(1_000_000, 4, 1, None, link).mode == "sketch"


def test_auto_picks_the_same_mode_on_every_worker() -> None:
    inputs = [torch.zeros(20_000) for _ in range(3)]
    for rank, x in enumerate(inputs):
        x[rank * 100 : rank * 100 + 50] = 1.0

    def work(agent: Agent) -> list[str]:
        return [agent.allreduce(inputs[agent.rank], key="b").stats["mode"] for _ in range(3)]

    modes = run_local(3, work)
    assert modes[0] == modes[1] == modes[2]


@pytest.mark.parametrize("block", [1, 4])
def test_a_dense_bucket_stays_dense_under_auto(block: int) -> None:
    """A dense call counts the bucket's items as a sparse one does, so the next call knows its density:
    without that, every other call of a dense bucket went back to sketch mode to measure it."""
    g = torch.Generator().manual_seed(3)
    inputs = [torch.randn(30_001, generator=g) for _ in range(2)]

    def work(agent: Agent) -> list[tuple[str, object]]:
        calls = [agent.allreduce(inputs[agent.rank], key="b", block=block) for _ in range(4)]
        return [(call.stats["mode"], call.stats["codec"]["items"]) for call in calls]

    first, second = run_local(2, work)
    assert first == second
    assert [mode for mode, _ in first] == ["sketch", "dense", "dense", "dense"]
    assert {items for _, items in first[1:]} == {-(-30_001 // block)}  # every item nonzero, capped at n


def test_a_first_call_lists_its_items_only_when_it_sends_them_sparse(monkeypatch) -> None:
    """A bucket's first call sizes it by counting its items; only a sparse index round lists them (a
    dense bucket's millions of positions and values were listed and dropped)."""
    from host_agent.codec import protocol

    listed: list[int] = []

    def counting(x: torch.Tensor, block: int):
        listed.append(x.numel())
        return nonzero_rows(x, block)

    monkeypatch.setattr(protocol, "nonzero_rows", counting)
    dense = [torch.randn(30_000, generator=torch.Generator().manual_seed(r)) for r in range(2)]
    results = run_local(2, lambda agent: agent.allreduce(dense[agent.rank], key="dense"))
    assert [r.stats["mode"] for r in results] == ["sketch", "sketch"]
    assert [r.stats["codec"]["protocol"] for r in results] == ["dense", "dense"] and listed == []
    assert torch.equal(results[0].total, results[1].total)
    sparse = sparse_inputs(2, 30_000, 0.01, torch.float32, seed=5)
    results = run_local(2, lambda agent: agent.allreduce(sparse[agent.rank], key="sparse"))
    assert [r.stats["codec"]["protocol"] for r in results] != ["dense", "dense"] and listed == [30_000] * 2


@pytest.mark.parametrize("mode", ["dense", "sketch", "union", "auto"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_in_place_writes_the_same_total_into_the_input(mode: str, dtype: torch.dtype) -> None:
    """``in_place``: the input holds the total afterwards, the very bits a new tensor would have held,
    in every mode (each reads its input in its first rounds, and writes the total only at the end)."""
    inputs = sparse_inputs(3, 20_000, 0.05, dtype, seed=7)

    def work(agent: Agent) -> tuple[torch.Tensor, torch.Tensor, bool]:
        mine = inputs[agent.rank].clone()
        apart = agent.allreduce(mine, mode=mode, key="apart").total
        result = agent.allreduce(mine, mode=mode, key="in place", in_place=True)
        return apart, mine, result.total.data_ptr() == mine.data_ptr()

    for apart, overwritten, same_storage in run_local(3, work):
        assert same_storage
        assert torch.equal(overwritten, apart)


def test_in_place_is_refused_for_a_strided_input_or_a_range() -> None:
    agent = Agent(LocalGroup(1).members()[0])
    try:
        with pytest.raises(ValueError, match="in_place needs a contiguous tensor"):
            agent.allreduce(torch.ones(10, 2)[:, 0], in_place=True)
        with pytest.raises(ValueError, match="no output_range"):
            agent.allreduce(torch.ones(10), in_place=True, output_range=(0, 5))
    finally:
        agent.close()


def test_local_backend_fails_every_member_on_a_length_mismatch() -> None:
    results = run_local(2, lambda agent: agent.allreduce(torch.ones(100 + agent.rank), mode="dense"))
    assert all(isinstance(r, AggregationError) for r in results), results
