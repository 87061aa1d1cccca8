"""How the Agent orders and overlaps calls: the next call's first round is encoded while the current one
waits for the network, invisibly on the wire; workers that disagree fail on every backend, also on one
(torch.distributed) that cannot survive messages of different lengths."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
import torch

from host_agent.agent import Agent
from host_agent.codec import aggregate_local
from tests.harness.agents import run_local
from tests.harness.local_backend import LocalGroup


def sparse(seed: int, n: int = 30_000) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=generator)
    x[torch.rand(n, generator=generator) > 0.02] = 0
    return x


def run_members(world: int, calls: list[tuple[str, int]], late_rank: int) -> list[list]:
    """Every member makes ``calls`` (key, seed) with allreduce_async back to back; ``late_rank`` starts
    late, so the others' first call is still waiting for it when the later calls are queued."""

    def work(agent: Agent) -> list:
        if agent.rank == late_rank:
            time.sleep(0.3)
        futures = [agent.allreduce_async(sparse(seed + 100 * agent.rank), key=key, mode="sketch")
                   for key, seed in calls]
        return [future.result(timeout=120) for future in futures]

    results = run_local(world, work)
    for result in results:
        if isinstance(result, Exception):
            raise result
    return results


def test_the_next_bucket_is_encoded_while_the_current_one_is_on_the_network() -> None:
    calls = [("bucket-0", 1), ("bucket-1", 2), ("bucket-2", 3)]
    results = run_members(3, calls, late_rank=2)
    for number, (key, seed) in enumerate(calls):
        expected = aggregate_local([sparse(seed + 100 * rank) for rank in range(3)], mode="sketch").total
        for rank in range(3):
            assert torch.equal(results[rank][number].total, expected), (key, rank)
    # rank 0 queued the later calls while its first waited for the late rank: they were encoded ahead
    assert [r.stats["encoded_ahead"] for r in results[0]] == [False, True, True]


def test_a_call_on_the_same_bucket_waits_for_the_state_of_the_one_before() -> None:
    """The second call of one key needs the first's codec state (its scale and size): never ahead."""
    calls = [("bucket", 1), ("bucket", 2)]
    results = run_members(2, calls, late_rank=1)
    assert [r.stats["encoded_ahead"] for r in results[0]] == [False, False]
    first = aggregate_local([sparse(1 + 100 * rank) for rank in range(2)], mode="sketch")
    second = aggregate_local([sparse(2 + 100 * rank) for rank in range(2)], mode="sketch", state=first.state)
    assert torch.equal(results[0][1].total, second.total) and torch.equal(results[1][1].total, second.total)
    assert results[0][1].stats["codec"]["rounds"] < first.stats["rounds"]  # the state was used


PROCESS_GROUP_MEMBER = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from host_agent.agent import Agent
    from host_agent.errors import AggregationError
    from host_agent.process_group import ProcessGroupBackend
    rank, init = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    agent = Agent(ProcessGroupBackend(), mode="dense")
    try:
        agent.allreduce(torch.ones(1000 + 64 * rank))
        print("no error")
    except AggregationError as error:
        print("AggregationError", error.ranks, error)
    agent.close()
    dist.destroy_process_group()  # else Gloo's threads may abort the exit ("terminate called ...")
""")


def test_workers_that_disagree_fail_together_over_a_process_group(tmp_path) -> None:
    """Gloo collectives of different lengths fail or hang: the agent waits for the agreement first."""
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [subprocess.Popen([sys.executable, "-c", PROCESS_GROUP_MEMBER, str(rank), init],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-2000:]
        assert out.startswith("AggregationError (1,)"), out + err[-2000:]
        assert "disagree on the codec parameters" in out


def test_a_checkpoint_is_refused_while_a_call_is_pending() -> None:
    """A pending call may already hold its bucket's state (encoded ahead): a checkpoint then would not
    match what the workers go on to do."""
    first, second = (Agent(backend, mode="dense") for backend in LocalGroup(2).members())
    try:
        pending = first.allreduce_async(torch.ones(100))  # waits for the second member
        with pytest.raises(RuntimeError, match="1 call\\(s\\) pending"):
            first.state_dict()
        with pytest.raises(RuntimeError, match="pending"):
            first.load_state_dict({"codec_states": {}, "calls": 0, "link": None})
        second.allreduce(torch.ones(100))
        assert torch.equal(pending.result(timeout=60).total, torch.full((100,), 2.0))
        assert first.state_dict()["calls"] == 1
    finally:
        first.close()
        second.close()


def _dense_input(call: int, key: str, rank: int, n: int = 20_000) -> torch.Tensor:
    x = torch.randn(n, generator=torch.Generator().manual_seed(call * 100 + ord(key) * 10 + rank))
    return x * (1e4 if call == 2 else 1.0)  # a scale jump up and back: calls 2 and 3 are redone


def test_each_dense_bucket_writes_its_words_into_one_buffer_kept_between_calls() -> None:
    """Two dense buckets of one length, each call's next one encoded ahead while it waits: each bucket
    keeps one words buffer of its own for every call (no bucket-sized allocation per call), and every
    total equals a fresh in-process aggregation's, also where a scale jump redoes the round into the
    same buffer."""
    calls, keys = 4, "ab"

    def work(agent: Agent) -> list:
        out = []
        for call in range(calls):
            futures = [agent.allreduce_async(_dense_input(call, key, agent.rank), key=key, mode="dense")
                       for key in keys]
            results = [future.result(timeout=60) for future in futures]
            out.append([(r.total, r.stats["codec"]["scale_redo"], agent._words[key].data_ptr())
                        for r, key in zip(results, keys, strict=True)])
        return out

    per_rank = run_local(2, work)
    states = dict.fromkeys(keys)
    for call in range(calls):
        for i, key in enumerate(keys):
            want = aggregate_local([_dense_input(call, key, rank) for rank in range(2)], mode="dense",
                                   state=states[key])
            states[key] = want.state
            for rank in range(2):
                total, redone, _ = per_rank[rank][call][i]
                assert torch.equal(total, want.total), (call, key, rank)
                assert redone == (call in (2, 3))  # up by 1e4, then down again
    for rank in range(2):
        buffers = {key: {per_rank[rank][call][i][2] for call in range(calls)} for i, key in enumerate(keys)}
        assert all(len(held) == 1 for held in buffers.values()) and buffers["a"] != buffers["b"]
