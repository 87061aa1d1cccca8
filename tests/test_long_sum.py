"""The process group's long sums (``host_agent/long_sum.py``): packed or as one allreduce, every total is
the exact int32 sum mod 2^32 on every rank, for world sizes 2 to 5 and lengths on and off every block and
shard bound, with the compiled kernels or the torch code; the measured choice is the same on every rank
however differently they timed; ranks whose ``LHC_PACKING`` differ all fail alike instead of hanging; no
collective starts while a sum is in flight; and a sum stranded by a peer does not hold the process at
exit. Real Gloo groups, one per thread of this process."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from host_agent import long_sum
from host_agent.codec import word_packing
from host_agent.codec.arith import add_int32
from host_agent.codec.cpu import native_available
from host_agent.errors import AggregationError
from host_agent.long_sum import KEPT, REFRESH_EVERY, TRIAL_SUMS, choose_packing, shard_bounds
from host_agent.process_group import PACKED_ADD_MAX_WORDS, ProcessGroupBackend
from lhc_ina.constants import Op
from tests.harness.gloo import end_together, gloo_groups, in_threads, random_words

REPO = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")


Totals = list[list[tuple[torch.Tensor, dict]]]


def _sums(world: int, lengths: list[int], packing: str, bits: int = 32) -> Totals:
    """Each rank's totals and counter changes for a long ADD of each length, through the backend."""
    groups = gloo_groups(world)

    def member(rank: int) -> list[tuple[torch.Tensor, dict]]:
        backend = ProcessGroupBackend(groups[rank], device=CPU, packing=packing)
        out = []
        for i, n in enumerate(lengths):
            before = backend.counters()
            (total,) = backend.reduce_round([(Op.ADD, random_words(i, rank, n, bits))], [True])
            result = total.result(timeout=60).clone()
            out.append((result, {k: v - before.get(k, 0) for k, v in backend.counters().items()}))
        backend.close()
        return out

    try:
        return in_threads(member, world)
    finally:
        end_together(groups)


@pytest.mark.parametrize("kernels", ["native", "torch"] if native_available() else ["torch"])
@pytest.mark.parametrize("world", [2, 5])
def test_packed_sums_are_exact_at_every_bound(world: int, kernels: str, monkeypatch) -> None:
    """Lengths just off a shard of whole blocks and, with two ranks, shards past one chunk of the torch
    code's 4096 blocks."""
    if kernels == "torch":
        monkeypatch.setattr(word_packing, "native", None)
    block = word_packing.BLOCK_WORDS
    lengths = [PACKED_ADD_MAX_WORDS + 1, block * world * 1100 - 1, block * world * 1100 + 1]
    if world == 2:
        lengths.append(block * 4096 * world + 33)
    per_rank = _sums(world, lengths, "always")
    for i, n in enumerate(lengths):
        want = add_int32([random_words(i, rank, n) for rank in range(world)])
        for rank in range(world):
            total, counters = per_rank[rank][i]
            assert torch.equal(total, want), (n, rank)
            assert counters["packed_words"] == n


@pytest.mark.parametrize("packing", ["always", "never"])
def test_packed_words_send_fewer_bytes_with_the_same_bits(packing: str) -> None:
    """Narrow words (as a quantized gradient's) packed send under 3/4 of the ring's 2(W - 1)/W of their
    bytes; full-width ones about as many; every total exact either way."""
    world, n = 3, 3 * PACKED_ADD_MAX_WORDS + 17
    for bits, most in ((20, 0.75), (32, 1.05)):
        per_rank = _sums(world, [n], packing, bits)
        want = add_int32([random_words(0, rank, n, bits) for rank in range(world)])
        for rank in range(world):
            total, counters = per_rank[rank][0]
            assert torch.equal(total, want), (bits, rank)
            if packing == "never":
                assert (counters["packed_words"], counters["plain_words"]) == (0, n)
                continue
            ratio = counters["packed_bytes_sent"] / (2 * (world - 1) / world * 4 * n)
            assert ratio < most, (bits, ratio)


def test_shards_cover_the_words_in_whole_blocks() -> None:
    for n, parts in ((0, 3), (1, 4), (95, 2), (32 * 7 + 5, 3), (10**6 + 3, 5)):
        bounds = shard_bounds(n, parts)
        assert bounds[0] == 0 and bounds[-1] == n and bounds == sorted(bounds) and len(bounds) == parts + 1
        assert all(bound % word_packing.BLOCK_WORDS == 0 for bound in bounds[:-1])


def test_the_measured_choice_tries_both_ways_then_keeps_the_faster_and_refreshes_the_other() -> None:
    choices = [choose_packing(n, 0 if n == 0 else 900, 0 if n == 0 else 1000) for n in range(TRIAL_SUMS)]
    assert choices == [True, False] * (TRIAL_SUMS // 2)
    after = [choose_packing(TRIAL_SUMS + i, 900, 1000) for i in range(2 * REFRESH_EVERY)]
    assert after.count(False) == 2 and after[REFRESH_EVERY - 1] is False  # one refresh each period
    assert not any(choose_packing(TRIAL_SUMS + i, 1000, 900) for i in range(REFRESH_EVERY - 1))
    assert choose_packing(TRIAL_SUMS + REFRESH_EVERY - 1, 1000, 900)
    unmeasured = [choose_packing(TRIAL_SUMS + i, 0, 900) for i in range(2)]
    assert unmeasured == [True, False]  # a way never timed: alternate


def test_measured_sums_are_exact_and_every_rank_takes_the_way_the_votes_give(monkeypatch) -> None:
    """Ranks that measured differently still choose alike (the vote adds their costs): trials alternate,
    then every sum goes the way whose summed cost is lower, and each total is the exact sum."""
    monkeypatch.setattr(long_sum, "MIN_MEASURED_WORDS", 4096)
    world, n, sums = 3, PACKED_ADD_MAX_WORDS + 5000, TRIAL_SUMS + 3
    # after the trials: rank 0 finds packing 8 ps/word faster, the others 1 ps/word slower: packed wins
    skew = {0: (1.0e-12, 9.0e-12), 1: (5.0e-12, 4.0e-12), 2: (5.0e-12, 4.0e-12)}
    groups = gloo_groups(world)

    def member(rank: int) -> list[tuple[torch.Tensor, dict[str, int]]]:
        backend = ProcessGroupBackend(groups[rank], device=CPU, packing="measured")
        sums_of = backend._long_sums
        assert sums_of is not None
        out = []
        for i in range(sums):
            if i == TRIAL_SUMS:
                for way, cost in zip((True, False), skew[rank], strict=True):
                    sums_of._timings[way].extend([cost] * KEPT)
            before = backend.counters()
            (total,) = backend.reduce_round([(Op.ADD, random_words(i, rank, n))], [True])
            result = total.result(timeout=60).clone()
            out.append((result, {k: v - before.get(k, 0) for k, v in backend.counters().items()}))
        backend.close()
        return out

    try:
        per_rank = in_threads(member, world)
    finally:
        end_together(groups)
    for i in range(sums):
        want = add_int32([random_words(i, rank, n) for rank in range(world)])
        ways = set()
        for rank in range(world):
            total, counters = per_rank[rank][i]
            assert torch.equal(total, want), (i, rank)
            assert counters["packed_words"] + counters["plain_words"] == n
            ways.add(counters["packed_words"] == n)
        assert len(ways) == 1, i  # every rank the same way
        assert ways.pop() == (i % 2 == 0 if i < TRIAL_SUMS else True), i


def test_ranks_whose_packing_differs_all_fail_alike() -> None:
    """One rank set to never, the others to always: at the first long sum every rank raises the same
    AggregationError naming each rank's setting, instead of issuing collectives the others do not."""
    world, settings = 3, ["always", "never", "always"]
    groups = gloo_groups(world)

    def member(rank: int) -> str:
        backend = ProcessGroupBackend(groups[rank], device=CPU, packing=settings[rank])
        (total,) = backend.reduce_round([(Op.ADD, random_words(0, rank, PACKED_ADD_MAX_WORDS + 1))], [True])
        with pytest.raises(AggregationError) as raised:
            total.result(timeout=60)
        backend.close()
        return str(raised.value)

    try:
        messages = in_threads(member, world)
    finally:
        end_together(groups)
    assert len(set(messages)) == 1
    assert "rank 0 always, rank 1 never, rank 2 always" in messages[0] and "LHC_PACKING" in messages[0]


class _Stalled:
    """A two-rank group whose collectives never finish until ``release`` (a peer that has not come)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 2

    def alltoall_base(self, *args):
        return self

    allreduce = allgather = alltoall_base

    def wait(self) -> None:
        self.release.wait(timeout=30)
        raise RuntimeError("the peer never came")


def test_no_collective_starts_while_a_long_sum_is_in_flight() -> None:
    """A caller that gave up on a long sum (its deadline passed) and goes on is refused, instead of
    issuing a collective that a peer could pair with one of the sum's."""
    group = _Stalled()
    backend = ProcessGroupBackend(group, device=CPU, packing="always")  # type: ignore[arg-type]
    (stalled,) = backend.reduce_round([(Op.ADD, torch.zeros(PACKED_ADD_MAX_WORDS + 1, dtype=torch.int32))],
                                      [True])
    with pytest.raises(AggregationError, match="still in flight"):
        backend.reduce(Op.ADD, torch.zeros(4, dtype=torch.int32))
    group.release.set()
    with pytest.raises(RuntimeError, match="never came"):
        stalled.result(timeout=30)
    backend.close()


def test_a_stranded_sum_does_not_hold_the_process_at_exit() -> None:
    """A sum whose peer never comes (its collective would wait for Gloo's timeout) is left behind when the
    process ends: the interpreter exits at once instead of joining the sum's thread."""
    script = f"""
import sys, threading
sys.path.insert(0, {str(REPO)!r})
import torch
from host_agent.long_sum import LongSum

entered = threading.Event()

class Stalled:
    def rank(self): return 0
    def size(self): return 2
    def alltoall_base(self, *args): return self
    def wait(self):
        entered.set()
        threading.Event().wait(60)

LongSum(Stalled(), "always").start(torch.zeros(100, dtype=torch.int32))
entered.wait(20)  # the sum is waiting for its peer
print("leaving", flush=True)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "leaving"
