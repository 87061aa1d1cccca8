"""A backend for tests: W agents in one process reduce through shared memory, so that the agent's own
logic (call order, the agreement message, seals, failures) is tested without a network.

Each member submits its words; when all W have submitted the same message (the n-th call of every
member), the group reduces them with the codec's ``reduce_words`` and completes every member's future.
A member that submits another op or length than the others fails the message on every member.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

import torch

from host_agent.agent_backend import Backend
from host_agent.codec import reduce_words
from host_agent.codec.gpu import to_host
from host_agent.errors import AggregationError
from lhc_ina.constants import Op


class LocalGroup:
    """The shared side of W in-process members: message n collects every member's words."""

    def __init__(self, world_size: int) -> None:
        if world_size < 1:
            raise ValueError(f"a group needs at least one member, not {world_size}")
        self.world_size = world_size
        self._lock = threading.Lock()
        self._pending: dict[int, dict[int, tuple[Op, torch.Tensor, Future]]] = {}

    def members(self) -> list[LocalBackend]:
        return [LocalBackend(self, rank) for rank in range(self.world_size)]

    def submit(self, rank: int, index: int, op: Op, words: torch.Tensor) -> Future[torch.Tensor]:
        future: Future[torch.Tensor] = Future()
        with self._lock:
            message = self._pending.setdefault(index, {})
            message[rank] = (op, words, future)
            if len(message) < self.world_size:
                return future
            del self._pending[index]
        entries = [message[r] for r in range(self.world_size)]
        shapes = {(int(op), words.numel()) for op, words, _ in entries}
        if len(shapes) > 1:
            error = AggregationError(
                f"message {index}: members sent different ops or lengths {sorted(shapes)}",
                tuple(range(self.world_size)),
            )
            for _, _, pending in entries:
                pending.set_exception(error)
            return future
        total = reduce_words(op, [words for _, words, _ in entries])
        for _, _, pending in entries:
            pending.set_result(total.clone())
        return future


class LocalBackend(Backend):
    """One member of a :class:`LocalGroup`."""

    def __init__(self, group: LocalGroup, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.world_size = group.world_size
        self._sent = 0

    def reduce(self, op: Op, words: torch.Tensor) -> Future[torch.Tensor]:
        index, self._sent = self._sent, self._sent + 1
        return self.group.submit(self.rank, index, op, to_host(words.detach()).clone())
