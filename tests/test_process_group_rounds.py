"""A round's messages over the process group in one collective (``ProcessGroupBackend.reduce_round``):
each message's words equal what it reduced to alone (ADD mod 2^32, OR exact), whatever mix of ops and
lengths the round holds, and a round of ADDs and short ORs costs one collective; a long OR and a long
scratch ADD (reduced in place, the only words a round may overwrite) one each besides. Real Gloo groups,
one per thread of this process, over one in-memory store."""

from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist

from host_agent.process_group import (
    EXCHANGE_SUM_MAX_WORDS,
    PACKED_ADD_MAX_WORDS,
    PACKED_OR_MAX_WORDS,
    ProcessGroupBackend,
)
from lhc_ina.constants import Op
from tests.harness.gloo import end_together, gloo_groups, in_threads, random_words

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


def _long_add(op: Op, n: int, scratch: bool) -> bool:
    """A long ADD reduced in place: ``LongSum``'s."""
    return op == Op.ADD and scratch and n > PACKED_ADD_MAX_WORDS


def _collectives_alone(op: Op, n: int, scratch: bool, packing: str = "measured") -> int:
    """A message's collectives of its own: one for a long OR, one for a long ADD (a packed sum's where
    ``packing`` is always; ``measured`` votes only from MIN_MEASURED_WORDS, longer than these tests'
    messages), none for the others (they share the round's one)."""
    if _long_add(op, n, scratch):
        return PACKED_SUM_COLLECTIVES if packing == "always" else 1
    return 1 if op == Op.OR and n > PACKED_OR_MAX_WORDS else 0


def _seed(seed: int, round_: int, message: int) -> int:
    return seed * 100 + round_ * 10 + message


def _words(seed: int, rank: int, length: int) -> torch.Tensor:
    return random_words(seed, rank, length)


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
    return in_threads(work, WORLD)


@pytest.fixture(scope="module")
def groups():
    """One Gloo group per rank for the whole module: groups torn down while a peer's are still in use
    abort the process, so they end together, after a barrier."""
    made = gloo_groups(WORLD, _Counting)
    yield made
    end_together([counting.group for counting in made])


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
    agreed = False  # the first long ADD's round also compares the ranks' packing settings
    for number, shapes in enumerate(rounds):
        for i, (op, n, _) in enumerate(shapes):
            want = _expected(op, [_words(_seed(seed, number, i), rank, n) for rank in range(WORLD)])
            for rank in range(WORLD):
                assert torch.equal(per_rank[rank][0][number][i], want), (number, i, op, n, rank)
        own = [_collectives_alone(*shape, packing) for shape in shapes]
        agreement = not agreed and any(_long_add(*shape) for shape in shapes)
        agreed = agreed or agreement
        want_collectives = sum(own) + (len(shapes) > sum(n > 0 for n in own)) + agreement
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

