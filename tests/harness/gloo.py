"""Real Gloo groups for tests, one per thread of the test process over one in-memory store, and the exact
int32 sums their collectives are held to."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


def in_threads(work: Callable[[int], Any], world: int) -> list:
    """``work(rank)`` on one thread per rank; their results in rank order, or the first error raised."""
    results: list = [None] * world
    errors: list[BaseException] = []

    def member(rank: int) -> None:
        try:
            results[rank] = work(rank)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=member, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    return results


def gloo_groups(world: int, wrap: Callable[[dist.ProcessGroup], Any] = lambda group: group) -> list:
    """One Gloo group per rank (``wrap``ped), made together."""
    store = dist.HashStore()
    return in_threads(lambda rank: wrap(dist.ProcessGroupGloo(store, rank, world)), world)


def end_together(groups: list[dist.ProcessGroup]) -> None:
    """A barrier on every rank's group: groups torn down while a peer's are still in use abort the process."""
    in_threads(lambda rank: groups[rank].barrier().wait(), len(groups))


def random_words(seed: int, rank: int, length: int, bits: int = 32) -> torch.Tensor:
    """Rank ``rank``'s words: full-width (wrapping when summed) or below 2^bits in magnitude."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    if bits >= 32:
        return torch.randint(-(2**31), 2**31, (length,), generator=g, dtype=torch.int64).to(torch.int32)
    return torch.randint(-(2**bits), 2**bits, (length,), generator=g, dtype=torch.int32)
