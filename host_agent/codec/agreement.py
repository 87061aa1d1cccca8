"""The agreement message: the first message of every aggregation proves that the workers match.

Every later message's length follows from parameters (world size, mode, block, length, dtype, seed,
margin, the bucket's state...) that each worker holds on its own. Workers that differ would send messages
of different lengths or meanings, and a transport that only reduces words (the switch, torch.distributed)
would sum them without a word of complaint. So the first message of every aggregation is an ADD of
``AGREE_WORDS`` words whose length depends on nothing, and from whose sum every worker reads who took
part and whether they all hold the same parameters::

    words  0..31  DIGEST  worker r adds the 32-bit digest of its parameters at word r
    words 32..47  CLAIMS  worker r adds 1 << (16 * (r % 2)) at word 32 + r // 2: per rank, the number of
                          workers that claimed it (16 bits each, so sums never carry into a neighbour)
    words 48..49  ITEMS   the worker's nonzero item count (0 where it did not count): low 16 bits, rest

The verdict (:func:`check_agreement`) is a function of the summed words alone, and of the world size only
once every digest matched (the world size is part of the digest), so every worker raises the same
AggregationError, with the same ranks, after the same round.

A worker's output range (the shard it decodes, :mod:`.output`) is not among the parameters: it changes
no message, so workers that decode different shards send the same words and need no agreement on it.
"""

from __future__ import annotations

import hashlib

import torch

from host_agent.errors import AggregationError
from lhc_ina.constants import MAX_WORKERS

DIGEST_WORD = 0
CLAIMS_WORD = MAX_WORKERS
ITEMS_WORD = CLAIMS_WORD + MAX_WORKERS // 2
AGREE_WORDS = ITEMS_WORD + 2
_MASK32 = (1 << 32) - 1

PARAMETERS_NAMED = (
    "world size, mode, block, length, dtype, seed, margin, headroom, index, cells, expected_items "
    "or the bucket's state"
)


def parameter_digest(parameters: tuple) -> int:
    """A 32-bit digest of the parameters every worker must share (ints, floats, strings, None)."""
    return int.from_bytes(hashlib.blake2b(repr(parameters).encode(), digest_size=4).digest(), "little")


def signed_word(word: int) -> int:
    """A 32-bit word as the int32 that holds the same bits."""
    return word - (1 << 32) if word >= 1 << 31 else word


def agreement_words(rank: int, digest: int, items: int, device: torch.device) -> torch.Tensor:
    """This worker's agreement message (ADD-aggregated)."""
    words = [0] * AGREE_WORDS
    words[DIGEST_WORD + rank] = digest & _MASK32
    words[CLAIMS_WORD + rank // 2] = 1 << (16 * (rank % 2))
    words[ITEMS_WORD] = items & 0xFFFF
    words[ITEMS_WORD + 1] = items >> 16
    return torch.tensor([signed_word(w) for w in words], dtype=torch.int32, device=device)


def _groups(digests: dict[int, int]) -> list[list[int]]:
    """Ranks grouped by digest, the largest group first (ties: the group of the lowest rank)."""
    by_digest: dict[int, list[int]] = {}
    for rank, digest in sorted(digests.items()):
        by_digest.setdefault(digest, []).append(rank)
    return sorted(by_digest.values(), key=lambda ranks: (-len(ranks), ranks[0]))


def check_agreement(words: torch.Tensor, world_size: int) -> int:
    """Check the summed agreement words; returns the sum of the workers' item counts.

    Raises AggregationError if a rank was claimed by more than one worker, if the workers' parameters
    differ, or if fewer than ``world_size`` workers took part.
    """
    vals = [w & _MASK32 for w in words.tolist()]
    if len(vals) != AGREE_WORDS:
        raise AggregationError(f"the agreement message has {len(vals)} words, not {AGREE_WORDS}")
    claims = [vals[CLAIMS_WORD + r // 2] >> (16 * (r % 2)) & 0xFFFF for r in range(MAX_WORKERS)]
    contributions = sum(claims)
    shared = [r for r in range(MAX_WORKERS) if claims[r] > 1]
    if shared:
        raise AggregationError(
            f"{contributions} workers took part but rank(s) {shared} were claimed by more than one of them: "
            "the workers disagree on their ranks or on the world size",
            tuple(shared),
        )
    present = [r for r in range(MAX_WORKERS) if claims[r]]
    groups = _groups({r: vals[DIGEST_WORD + r] for r in present})
    if len(groups) > 1:
        odd = tuple(sorted(r for group in groups[1:] for r in group))
        listing = " vs ".join(str(group) for group in groups)
        raise AggregationError(
            f"the workers disagree on the codec parameters ({PARAMETERS_NAMED}): ranks {listing}", odd
        )
    missing = tuple(r for r in range(world_size) if not claims[r])
    if missing:  # digests match, so every rank is below world_size and none is claimed twice
        raise AggregationError(
            f"{contributions} of {world_size} workers took part: rank(s) {list(missing)} missing", missing
        )
    return vals[ITEMS_WORD] + (vals[ITEMS_WORD + 1] << 16)
