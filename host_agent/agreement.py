"""Workers that disagree on an aggregation must fail, all of them, before any of them uses its result.

Every call starts with one packet in which each worker writes a digest of what it is about to do (length,
dtype, mode, block, world size, codec options) into its own lane. The switch (or any backend) adds the
lanes, so every worker reads every other worker's digest exactly: a different digest, a lane written
twice (two workers with one rank), a lane never written (a missing worker) or a lane past the world size
(a worker that counts more workers) all show, identically on every worker, in the first round trip.
"""

from __future__ import annotations

import zlib
from typing import Any

import torch

from host_agent.errors import AggregationError
from lhc_ina.constants import LANES


def digest(**parameters: Any) -> int:
    """A nonzero 31-bit digest of the parameters (sorted by name): equal parameters, equal digests."""
    text = ";".join(f"{name}={parameters[name]!r}" for name in sorted(parameters))
    return (zlib.crc32(text.encode()) & 0x7FFFFFFF) | 1


def agreement_words(rank: int, value: int) -> torch.Tensor:
    """This worker's contribution: its digest in lane ``rank``."""
    words = torch.zeros(LANES, dtype=torch.int32)
    words[rank] = value
    return words


def check_agreement(summed: torch.Tensor, rank: int, world_size: int, value: int, what: str) -> None:
    """Raise the same :class:`AggregationError` on every worker unless all ``world_size`` lanes hold this
    worker's digest and no other lane is written."""
    lanes = [int(v) for v in summed.tolist()]
    differing = tuple(r for r in range(world_size) if lanes[r] != value)
    extra = [r for r in range(world_size, LANES) if lanes[r] != 0]
    if not differing and not extra:
        return
    problems = []
    if differing:
        seen = ", ".join(f"rank {r}: {lanes[r]:#x}" for r in range(world_size))
        problems.append(f"digests differ or are missing ({seen})")
    if extra:
        problems.append(f"lane(s) {extra} were written by workers that count more than {world_size}")
    raise AggregationError(
        f"workers disagree on the aggregation (this is rank {rank} with {what}): " + "; ".join(problems),
        differing or tuple(range(world_size)),
    )
