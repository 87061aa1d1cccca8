"""The round seal: one ADD word after each round that proves the round's messages are one round's.

A backend reduces messages by position (the switch adds packet p of every worker, whatever it carries),
so a worker out of step with its peers (one that failed alone mid-call and went on to its next call, a
second run that joined the same job) would have its words added to another call's. The seal catches it:
after the messages of round r of call n, every worker sends one more message, an ADD of one word, the
*tag* of (n, r, the round's ops, kinds and lengths). Every worker checks that the sum is W times its own
tag. Positions are laid end to end in call order, so a worker whose stream diverged anywhere in the round
has something else (or nothing: then no result comes at all) in the seal's position, and the sum differs
unless that word equals the tag by chance (2^-32 for any word the worker did not compute as this seal).

The tag is odd, so ``W * tag`` differs from ``(W - k) * tag`` for every 0 < k < W <= 2^31: a worker that
sent a zero there (padding of another message) is caught too. The cost is one packet per round.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from host_agent.codec import Message
from host_agent.errors import AggregationError


def round_tag(call: int, round_: int, messages: Sequence[Message]) -> int:
    """The odd 32-bit tag of one round: every worker in step computes the same."""
    shape = ";".join(f"{m.op.name}:{m.kind}:{m.words.numel()}" for m in messages)
    digest = hashlib.blake2b(f"{call}/{round_}/{shape}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") | 1


def seal_words(tag: int) -> torch.Tensor:
    """The seal message's one int32 word."""
    return torch.tensor([tag - (1 << 32) if tag >= 1 << 31 else tag], dtype=torch.int32)


def check_seal(summed: torch.Tensor, tag: int, world_size: int, call: int, round_: int) -> None:
    """Raise if the reduced seal is not ``world_size`` times ``tag`` (mod 2^32)."""
    got = int(summed[0]) & 0xFFFFFFFF
    want = (world_size * tag) & 0xFFFFFFFF
    if got != want:
        raise AggregationError(
            f"call {call}, round {round_}: the round's seal summed to {got:#010x}, not {world_size} x "
            f"{tag:#010x}: another worker's messages in this round's positions belong to another call or "
            "round (a worker that failed alone and went on, or two runs joined to one job)"
        )
