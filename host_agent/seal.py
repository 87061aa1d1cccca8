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
sent a zero there (padding of another message) is caught too.

The seal costs nothing on the wire where the round's last message is an ADD whose last packet has room:
the tag then rides as that message's last word (``SealedRound``), still after every other position of
the round. Otherwise (an OR last, a full last packet, or a message so long that copying it would cost
more than a packet) it is a one-word message of its own: one packet.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from host_agent.codec import Message
from host_agent.errors import AggregationError
from lhc_ina.constants import LANES, Op

#: The longest last message the tag is folded into: beyond it the copy costs more than a packet.
FOLD_MAX_WORDS = 1 << 16


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


@dataclass
class SealedRound:
    """A round as it goes to the backend: ``wire`` is (op, words) per reduction, in order; the seal is the
    last word of the last message (``folded``) or a message of its own after the round's."""

    call: int
    round: int
    tag: int
    messages: list[Message]
    wire: list[tuple[Op, torch.Tensor]]
    folded: bool
    scratch: list[bool]  # per wire message: a backend may reduce its words in place (Message.scratch)

    @classmethod
    def of(cls, call: int, round_: int, messages: list[Message]) -> SealedRound:
        tag = round_tag(call, round_, messages)
        wire = [(m.op, m.words) for m in messages]
        scratch = [m.scratch for m in messages]
        last = messages[-1].words
        folded = messages[-1].op == Op.ADD and last.numel() % LANES != 0 and last.numel() <= FOLD_MAX_WORDS
        if folded:
            wire[-1] = (Op.ADD, torch.cat([last, seal_words(tag).to(last.device)]))
            scratch[-1] = True
        else:
            wire.append((Op.ADD, seal_words(tag)))
            scratch.append(True)
        return cls(call, round_, tag, messages, wire, folded, scratch)

    def take(self, index: int, words: torch.Tensor, world_size: int) -> torch.Tensor | None:
        """The reduced ``words`` of wire message ``index``: the codec's part (None for the seal's own
        message), after checking the seal where it rides."""
        if index == len(self.wire) - 1:
            check_seal(words[-1:], self.tag, world_size, self.call, self.round)
            return words[:-1] if self.folded else None
        return words

    @property
    def packets(self) -> int:
        return sum(-(-words.numel() // LANES) for _, words in self.wire)

    @property
    def words(self) -> int:
        return sum(words.numel() for _, words in self.wire)
