"""What carries an ``Agent``'s codec messages between workers: the switch, a torch.distributed group, or
memory. (torch.distributed's own backend, ``lhc``, is another thing: ``torch_backend.py``, a user of the
agent.)

Every backend reduces one message's int32 words across the job's workers, ADD as a sum mod 2^32 and OR
as a bitwise or, and hands the same words back to every worker. The agent calls :meth:`Backend.reduce`
in the same order with the same op and length on every worker (the codec guarantees the lengths agree);
a backend may keep several reductions in flight and completes each future with the reduced words, or
with an :class:`~host_agent.errors.AggregationError`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from host_agent.errors import AggregationError
from lhc_ina.constants import Op


@dataclass(frozen=True)
class LinkEstimate:
    """What mode ``auto`` weighs bytes against: a round trip and a rate, as the backend measured them."""

    rtt_s: float
    bytes_per_s: float


class Backend(ABC):
    """Reduces codec messages across ``world_size`` workers; this process is ``rank``."""

    rank: int
    world_size: int
    #: Which way this backend's reductions go (the stats' ``path``): "switch", "host" or "memory".
    path: str = "memory"
    #: Whether the agent must see the agreement message's result before it sends the rest of a call's
    #: first round: true for a backend whose reductions fail or hang when workers' lengths differ.
    waits_for_agreement: bool = False

    @abstractmethod
    def reduce(self, op: Op, words: torch.Tensor) -> Future[torch.Tensor]:
        """Start reducing ``words`` (1-D int32) with ``op``; the future holds the reduced words."""

    def reduce_round(self, messages: list[tuple[Op, torch.Tensor]],
                     scratch: Sequence[bool] = ()) -> list[Future[torch.Tensor]]:
        """:meth:`reduce` each of a round's ``messages`` (op, words), in order: one future each. A backend
        may reduce several in one operation (the process group packs them into one collective), and may
        reduce a message's words in place where ``scratch`` (per message) says they are nobody else's."""
        return [self.reduce(op, words) for op, words in messages]

    def link_estimate(self) -> LinkEstimate | None:
        """The measured round trip and rate, or None before anything was measured."""
        return None

    def counters(self) -> dict[str, int]:
        """Cumulative transport counters (packets sent, retransmissions, ...); empty when it has none."""
        return {}

    def begin_call(self, number: int, key: Hashable, elements: int, step_end: bool) -> None:  # noqa: B027
        """Call ``number`` (the bucket ``key`` of ``elements``) starts, or starts again after
        :meth:`recover`; ``step_end``: the caller's last call of a training step. Only a backend over
        several paths (``host_agent.paths``) takes note."""

    def end_call(self, number: int, protocol: str) -> None:  # noqa: B027 - see begin_call
        """Call ``number`` completed on this worker; ``protocol``: how the codec sent the bucket (dense,
        sketch or union; dense where a sparse mode found the bucket cheaper whole), the same on every
        worker."""

    def recover(self, number: int, error: AggregationError) -> bool:
        """Call ``number`` failed with ``error`` (not a collective error): True when the backend has
        agreed with every peer to redo it (on another path), False when the agent must fail."""
        return False

    def abandon(self, error: Exception) -> None:  # noqa: B027 - nothing to tell where there are no peers
        """This worker is out of step with its peers (``error``) and takes no further part: fail what is
        pending and let the peers know where the backend can (the switch backend leaves the job)."""

    def close(self) -> None:  # noqa: B027 - a backend with nothing to release need not override it
        """Release sockets, threads and memberships."""
