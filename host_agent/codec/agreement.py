"""The agreement message: the first message of every aggregation proves that the workers match.

Every later message's length follows from parameters (world size, mode, block, length, dtype, seed,
margin, the bucket's state...) that each worker holds on its own. Workers that differ would send messages
of different lengths or meanings, and a transport that only reduces words (the switch, torch.distributed)
would sum them without a word of complaint. So the first message of every aggregation is an ADD of
``AGREE_WORDS`` words whose length depends on nothing, and from whose sum every worker reads who took
part and whether they all hold the same parameters. Its size does not grow with the job: up to
``MAX_JOB_WORKERS`` (1024) ranks share sums and counts instead of a word each, so it stays one packet::

    words  0..15  DIGEST    worker r adds the 32-bit digest of its parameters at word r % 16
    word  16      LEAD      rank 0 adds its digest: what every lane should hold per member
    words 17..48  PRESENCE  worker r adds 1 << (r % 32) at word 17 + r // 32: one bit per rank
    word  49      COUNT     every worker adds 1
    words 50..51  ITEMS     the worker's nonzero item count (0 where it did not count): low 16 bits, rest

Why this proves what one word per rank did:
- *Ranks claimed once.* A word's sum of powers of two has as many one bits as terms only when no two
  terms are equal (each carry loses a bit; a carry out of bit 31, lost mod 2^32, loses one too). So the
  one bits of PRESENCE equal COUNT exactly when every claimed rank was claimed once.
- *Parameters equal.* Up to 16 workers, each lane holds one worker's digest: the workers group by digest
  exactly and the verdict names the smaller groups (the largest is the reference, ties to rank 0's), as
  with one word per rank. Beyond, lane k holds the sum of the digests of its n_k ranks, which is n_k
  times rank 0's digest when they all hold rank 0's. A differing worker is then caught unless other
  differing workers of its lane cancel it mod 2^32 (a 2^-32 chance for digests that differ at random, as
  for the round seal), and the verdict names the ranks of the lanes that differ: the odd workers are among
  them.
- *Nobody missing.* With digests equal (the world size is part of the digest), PRESENCE must hold
  exactly ranks 0..W-1.

The verdict (:func:`check_agreement`) is a function of the summed words alone, and of the world size only
once every digest matched, so every worker raises the same AggregationError, with the same ranks, after the
same round.

A worker's output range (the shard it decodes, :mod:`.output`) is not among the parameters: it changes
no message, so workers that decode different shards send the same words and need no agreement on it.
"""

from __future__ import annotations

import hashlib

import torch

from host_agent.errors import AggregationError
from lhc_ina.constants import MAX_JOB_WORKERS

DIGEST_LANES = 16
DIGEST_WORD = 0
LEAD_WORD = DIGEST_WORD + DIGEST_LANES
PRESENCE_WORD = LEAD_WORD + 1
COUNT_WORD = PRESENCE_WORD + MAX_JOB_WORKERS // 32
ITEMS_WORD = COUNT_WORD + 1
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
    if not 0 <= rank < MAX_JOB_WORKERS:
        raise ValueError(f"rank {rank} is outside 0..{MAX_JOB_WORKERS - 1}")
    words = [0] * AGREE_WORDS
    words[DIGEST_WORD + rank % DIGEST_LANES] = digest & _MASK32
    if rank == 0:
        words[LEAD_WORD] = digest & _MASK32
    words[PRESENCE_WORD + rank // 32] = 1 << (rank % 32)
    words[COUNT_WORD] = 1
    words[ITEMS_WORD] = items & 0xFFFF
    words[ITEMS_WORD + 1] = items >> 16
    return torch.tensor([signed_word(w) for w in words], dtype=torch.int32, device=device)


def _groups(digests: dict[int, int]) -> list[list[int]]:
    """Ranks grouped by digest, the largest group first (ties: the group of the lowest rank)."""
    by_digest: dict[int, list[int]] = {}
    for rank, digest in sorted(digests.items()):
        by_digest.setdefault(digest, []).append(rank)
    return sorted(by_digest.values(), key=lambda ranks: (-len(ranks), ranks[0]))


def _odd_ranks(vals: list[int], present: list[int]) -> tuple[tuple[int, ...], str]:
    """The ranks whose digest may differ from the reference, and how they were found (empty: all agree)."""
    if len(present) <= DIGEST_LANES:  # one rank per lane: every digest is known
        groups = _groups({r: vals[DIGEST_WORD + r] for r in present})
        listing = " vs ".join(str(group) for group in groups)
        return tuple(sorted(r for group in groups[1:] for r in group)), f"ranks {listing}"
    if 0 not in present:  # no reference: the missing rank 0 is the verdict
        return (), ""
    members = [0] * DIGEST_LANES
    for rank in present:
        members[rank % DIGEST_LANES] += 1
    lead = vals[LEAD_WORD]
    odd = [k for k in range(DIGEST_LANES) if vals[DIGEST_WORD + k] != members[k] * lead & _MASK32]
    suspects = tuple(r for r in present if r % DIGEST_LANES in odd)
    shown = list(suspects) if len(suspects) <= 64 else f"{len(suspects)} ranks"
    return suspects, (f"the digests of ranks = {odd} (mod {DIGEST_LANES}) differ from rank 0's; the odd "
                      f"workers are among ranks {shown}")


def check_agreement(words: torch.Tensor, world_size: int) -> int:
    """Check the summed agreement words; returns the sum of the workers' item counts.

    Raises AggregationError if a rank was claimed by more than one worker, if the workers' parameters
    differ, or if the workers that took part are not ranks 0..``world_size``-1.
    """
    vals = [w & _MASK32 for w in words.tolist()]
    if len(vals) != AGREE_WORDS:
        raise AggregationError(f"the agreement message has {len(vals)} words, not {AGREE_WORDS}")
    contributions = vals[COUNT_WORD]
    claims = [vals[PRESENCE_WORD + word] for word in range(MAX_JOB_WORKERS // 32)]
    present = [32 * word + bit for word, bits in enumerate(claims) for bit in range(32) if bits >> bit & 1]
    if len(present) != contributions:
        raise AggregationError(
            f"{contributions} workers took part but claimed only {len(present)} distinct ranks: some ranks "
            "were claimed by more than one of them: the workers disagree on their ranks or on the world size"
        )
    odd, how = _odd_ranks(vals, present)
    if odd:
        raise AggregationError(f"the workers disagree on the codec parameters ({PARAMETERS_NAMED}): {how}",
                               odd)
    seen = set(present)
    missing = tuple(r for r in range(world_size) if r not in seen)
    beyond = [r for r in present if r >= world_size]
    if missing or beyond:  # with digests equal, every worker holds this world size
        raise AggregationError(
            f"{contributions} of {world_size} workers took part: rank(s) {list(missing)} missing"
            + (f", rank(s) {beyond} beyond the world size" if beyond else ""),
            missing,
        )
    return vals[ITEMS_WORD] + (vals[ITEMS_WORD + 1] << 16)
