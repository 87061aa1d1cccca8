"""A round's messages over the process group in one collective (``ProcessGroupBackend.reduce_round``):
each message's words equal what it reduced to alone (ADD mod 2^32, OR exact), whatever mix of ops and
lengths the round holds, and a round of ADDs and short ORs costs one collective; a long OR and a long
scratch ADD (reduced in place, the only words a round may overwrite) one each besides. Real Gloo groups,
one per thread of this process, over one in-memory store."""

from __future__ import annotations

import random
import threading

import pytest
import torch
import torch.distributed as dist

from host_agent import long_sum
from host_agent.errors import AggregationError
from host_agent.long_sum import KEPT, REFRESH_EVERY, TRIAL_SUMS, choose_packing
from host_agent.process_group import (
    EXCHANGE_SUM_MAX_WORDS,
    PACKED_ADD_MAX_WORDS,
    PACKED_OR_MAX_WORDS,
    ProcessGroupBackend,
)
from lhc_ina.constants import Op

WORLD = 3


def _round(rng: random.Random) -> list[tuple[Op, int, bool]]:
    """A round's (op, length, scratch): ADDs of any length, ORs short enough to pack and, now and then, a
    long one; some messages' words are scratch (the backend may overwrite them)."""
    lengths = [1, 7, 64, 1000, 40_000, PACKED_ADD_MAX_WORDS, PACKED_ADD_MAX_WORDS + 1 + rng.randrange(9000)]
    shapes = [(rng.choice([Op.ADD, Op.OR]), rng.choice(lengths), rng.random() < 0.5)
              for _ in range(rng.randint(1, 5))]
    if rng.random() < 0.3:
        shapes.insert(rng.randrange(len(shapes) + 1),
                      (Op.OR, PACKED_OR_MAX_WORDS + 1 + rng.randrange(3000), rng.random() < 0.5))
    return shapes


#: A packed sum's collectives: the sizes and the shards of its reduce-scatter, the sizes and the shards of
#: its all-gather.
PACKED_SUM_COLLECTIVES = 4


def _collectives_alone(op: Op, n: int, scratch: bool, packing: str = "measured") -> int:
    """A message's collectives of its own: one for a long OR, one for a long ADD reduced in place (a
    packed sum's where ``packing`` is always; ``measured`` votes only from MIN_MEASURED_WORDS, longer than
    these tests' messages), none for the others (they share the round's one)."""
    if op == Op.ADD and scratch and n > PACKED_ADD_MAX_WORDS:
        return PACKED_SUM_COLLECTIVES if packing == "always" else 1
    return 1 if op == Op.OR and n > PACKED_OR_MAX_WORDS else 0


def _seed(seed: int, round_: int, message: int) -> int:
    return seed * 100 + round_ * 10 + message


def _words(seed: int, rank: int, length: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    return torch.randint(-(2**31), 2**31, (length,), generator=g, dtype=torch.int64).to(torch.int32)


def _expected(op: Op, parts: list[torch.Tensor]) -> torch.Tensor:
    out = parts[0].to(torch.int64)
    for part in parts[1:]:
        out = out + part.to(torch.int64) if op == Op.ADD else out | part.to(torch.int64)
    out &= 0xFFFFFFFF
    return (out - ((out >> 31) << 32)).to(torch.int32)


class _Counting:
    """A Gloo group whose collectives are counted, ring allreduces and all-to-alls apart."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group, self.collectives, self.exchanges = group, 0, 0

    def rank(self) -> int:
        return self.group.rank()

    def size(self) -> int:
        return self.group.size()

    def allreduce(self, tensors, options):
        self.collectives += 1
        return self.group.allreduce(tensors, options)

    def alltoall_base(self, output, input, output_splits, input_splits, options):
        self.collectives += 1
        self.exchanges += 1
        return self.group.alltoall_base(output, input, output_splits, input_splits, options)

    def allgather(self, outputs, inputs):
        self.collectives += 1
        return self.group.allgather(outputs, inputs)


def _in_threads(work) -> list:
    """``work(rank)`` on one thread per rank; their results in rank order, or the first error raised."""
    results: list = [None] * WORLD
    errors: list[BaseException] = []

    def member(rank: int) -> None:
        try:
            results[rank] = work(rank)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=member, args=(rank,)) for rank in range(WORLD)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    return results


@pytest.fixture(scope="module")
def groups():
    """One Gloo group per rank for the whole module: groups torn down while a peer's are still in use
    abort the process, so they end together, after a barrier."""
    store = dist.HashStore()
    made = _in_threads(lambda rank: _Counting(dist.ProcessGroupGloo(store, rank, WORLD)))
    yield made
    _in_threads(lambda rank: made[rank].group.barrier().wait())


@pytest.mark.parametrize(("seed", "packing"), [(0, "measured"), (1, "always"), (2, "measured"), (3, "never")])
def test_a_round_packs_into_one_collective_and_every_message_reduces_exactly(groups, seed: int,
                                                                             packing: str) -> None:
    rng = random.Random(seed)
    rounds = [_round(rng) for _ in range(6)]

    def member(rank: int) -> tuple[list[list[torch.Tensor]], list[int]]:
        group = groups[rank]
        backend = ProcessGroupBackend(group, device=torch.device("cpu"), packing=packing)  # type: ignore[arg-type]
        results, counts = [], []
        for number, shapes in enumerate(rounds):
            before = group.collectives
            messages = [(op, _words(_seed(seed, number, i), rank, n)) for i, (op, n, _) in enumerate(shapes)]
            scratch = [spare for _, _, spare in shapes]
            futures = backend.reduce_round(messages, scratch)
            results.append([future.result(timeout=30) for future in futures])
            counts.append(group.collectives - before)
            for i, (op, n, spare) in enumerate(shapes):  # only a long scratch ADD is overwritten, in place
                in_place = op == Op.ADD and spare and n > PACKED_ADD_MAX_WORDS
                assert (results[-1][i].data_ptr() == messages[i][1].data_ptr()) == in_place, (op, n, spare)
                if not in_place:
                    assert torch.equal(messages[i][1], _words(_seed(seed, number, i), rank, n))
        return results, counts

    per_rank = _in_threads(member)
    for number, shapes in enumerate(rounds):
        for i, (op, n, _) in enumerate(shapes):
            want = _expected(op, [_words(_seed(seed, number, i), rank, n) for rank in range(WORLD)])
            for rank in range(WORLD):
                assert torch.equal(per_rank[rank][0][number][i], want), (number, i, op, n, rank)
        own = [_collectives_alone(*shape, packing) for shape in shapes]
        want_collectives = sum(own) + (len(shapes) > sum(n > 0 for n in own))
        assert {per_rank[rank][1][number] for rank in range(WORLD)} == {want_collectives}, shapes


def test_a_short_sum_is_one_exchange_and_a_longer_one_a_ring_with_the_same_bits(groups) -> None:
    """Lengths on both sides of the exchange's bound, words that wrap mod 2^32: every sum exact, and
    only the short ones go as an all-to-all."""
    bound = EXCHANGE_SUM_MAX_WORDS // WORLD
    lengths = [1, 3, 50, bound - 1, bound, bound + 1, 4 * bound]

    def member(rank: int) -> list[tuple[torch.Tensor, int]]:
        group = groups[rank]
        backend = ProcessGroupBackend(group, device=torch.device("cpu"))  # type: ignore[arg-type]
        out = []
        for i, n in enumerate(lengths):
            before = group.exchanges
            total = backend.reduce(Op.ADD, _words(_seed(7, 0, i), rank, n)).result(timeout=30)
            out.append((total, group.exchanges - before))
        return out

    per_rank = _in_threads(member)
    for i, n in enumerate(lengths):
        want = _expected(Op.ADD, [_words(_seed(7, 0, i), rank, n) for rank in range(WORLD)])
        for rank in range(WORLD):
            total, exchanges = per_rank[rank][i]
            assert torch.equal(total, want), (n, rank)
            assert exchanges == (1 if n <= bound else 0), n


def _narrow_words(seed: int, rank: int, length: int, bits: int) -> torch.Tensor:
    """Words of magnitudes below 2^bits, as a quantized gradient's: what packing saves bytes on."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    return torch.randint(-(2**bits), 2**bits, (length,), generator=g, dtype=torch.int32)


@pytest.mark.parametrize("packing", ["always", "never"])
def test_a_long_sum_moves_packed_words_with_the_same_bits(groups, packing: str) -> None:
    """Long scratch ADDs of lengths off every block and shard bound, full-width words that wrap and narrow
    ones: each total equals the exact sum on every rank whether the words go packed or as one
    allreduce, and packed narrow words send fewer bytes than the ring's 2(W - 1)/W of the words."""
    lengths = [PACKED_ADD_MAX_WORDS + 1, PACKED_ADD_MAX_WORDS + 95, 3 * PACKED_ADD_MAX_WORDS + 17]
    widths = [32, 20]

    def member(rank: int) -> list[tuple[torch.Tensor, dict[str, int]]]:
        backend = ProcessGroupBackend(groups[rank], device=torch.device("cpu"),  # type: ignore[arg-type]
                                      packing=packing)
        out = []
        for i, n in enumerate(lengths):
            for bits in widths:
                before = backend.counters()
                words = _narrow_words(i, rank, n, bits) if bits < 32 else _words(_seed(9, 0, i), rank, n)
                (total,) = backend.reduce_round([(Op.ADD, words)], [True])
                result = total.result(timeout=60)
                counters = {name: value - before.get(name, 0) for name, value in backend.counters().items()}
                out.append((result.clone(), counters))
        backend.close()
        return out

    per_rank = _in_threads(member)
    index = 0
    for i, n in enumerate(lengths):
        for bits in widths:
            parts = [_narrow_words(i, rank, n, bits) if bits < 32 else _words(_seed(9, 0, i), rank, n)
                     for rank in range(WORLD)]
            want = _expected(Op.ADD, parts)
            for rank in range(WORLD):
                total, counters = per_rank[rank][index]
                assert torch.equal(total, want), (n, bits, rank)
                if packing == "never":
                    assert counters == {}
                    continue
                assert counters["packed_words"] == n
                ring_bytes = 2 * (WORLD - 1) / WORLD * 4 * n
                ratio = counters["packed_bytes_sent"] / ring_bytes
                assert ratio < (0.75 if bits == 20 else 1.05), (n, bits, ratio)
            index += 1


def test_the_measured_choice_tries_both_ways_then_keeps_the_faster_and_refreshes_the_other() -> None:
    choices = [choose_packing(n, 0 if n == 0 else 900, 0 if n == 0 else 1000) for n in range(TRIAL_SUMS)]
    assert choices == [True, False] * (TRIAL_SUMS // 2)
    after = [choose_packing(TRIAL_SUMS + i, 900, 1000) for i in range(2 * REFRESH_EVERY)]
    assert after.count(False) == 2 and after[REFRESH_EVERY - 1] is False  # one refresh each period
    assert not any(choose_packing(TRIAL_SUMS + i, 1000, 900) for i in range(REFRESH_EVERY - 1))
    assert choose_packing(TRIAL_SUMS + REFRESH_EVERY - 1, 1000, 900)
    unmeasured = [choose_packing(TRIAL_SUMS + i, 0, 900) for i in range(2)]
    assert unmeasured == [True, False]  # a way never timed: alternate


def test_measured_sums_are_exact_and_every_rank_takes_the_way_the_votes_give(groups, monkeypatch) -> None:
    """Ranks that measured differently still choose alike (the vote adds their costs): trials alternate,
    then every sum goes the way whose summed cost is lower, and each total is the exact sum."""
    monkeypatch.setattr(long_sum, "MIN_MEASURED_WORDS", 4096)
    n, sums = PACKED_ADD_MAX_WORDS + 5000, TRIAL_SUMS + 3
    # after the trials: rank 0 finds packing 8 ps/word faster, the others 1 ps/word slower: packed wins
    skew = {0: (1.0e-12, 9.0e-12), 1: (5.0e-12, 4.0e-12), 2: (5.0e-12, 4.0e-12)}

    def member(rank: int) -> list[tuple[torch.Tensor, dict[str, int]]]:
        backend = ProcessGroupBackend(groups[rank], device=torch.device("cpu"),  # type: ignore[arg-type]
                                      packing="measured")
        out = []
        for i in range(sums):
            if i == TRIAL_SUMS:
                for way, cost in zip((True, False), skew[rank], strict=True):
                    backend._long_sums._timings[way].clear()  # type: ignore[union-attr]
                    backend._long_sums._timings[way].extend([cost] * KEPT)  # type: ignore[union-attr]
            before = backend.counters()
            (total,) = backend.reduce_round([(Op.ADD, _words(_seed(11, i, 0), rank, n))], [True])
            result = total.result(timeout=60).clone()
            out.append((result, {k: v - before.get(k, 0) for k, v in backend.counters().items()}))
        backend.close()
        return out

    per_rank = _in_threads(member)
    for i in range(sums):
        want = _expected(Op.ADD, [_words(_seed(11, i, 0), rank, n) for rank in range(WORLD)])
        ways = set()
        for rank in range(WORLD):
            total, counters = per_rank[rank][i]
            assert torch.equal(total, want), (i, rank)
            ways.add(counters["packed_words"] == n)
            assert counters["packed_words"] + counters["plain_words"] == n
        assert len(ways) == 1, i  # every rank the same way
        packed = ways.pop()
        assert packed == (i % 2 == 0 if i < TRIAL_SUMS else True), i


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
    backend = ProcessGroupBackend(group, device=torch.device("cpu"), packing="always")  # type: ignore[arg-type]
    (stalled,) = backend.reduce_round([(Op.ADD, torch.zeros(PACKED_ADD_MAX_WORDS + 1, dtype=torch.int32))],
                                      [True])
    with pytest.raises(AggregationError, match="still in flight"):
        backend.reduce(Op.ADD, torch.zeros(4, dtype=torch.int32))
    group.release.set()
    with pytest.raises(RuntimeError, match="never came"):
        stalled.result(timeout=30)
    backend.close()
