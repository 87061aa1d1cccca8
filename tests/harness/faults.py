"""Faults injected into a worker from inside, and the outcome of each call as the tests judge it.

A worker *fails alone* when its session raises between rounds (``FailingSession``): the peers cannot know,
so they must end in an error, never in a result for that call or a later one. ``outcomes`` runs a fixed
series of calls on one agent and says for each whether it returned the exact sum, a wrong one, or raised.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

import host_agent.agent as agent_module
from host_agent.agent import Agent
from host_agent.codec import WorkerSession
from host_agent.errors import AggregationError


def call_input(rank: int, call: int, n: int = 3000, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A sparse input, the same on every run for (rank, call)."""
    generator = torch.Generator().manual_seed(97 * call + rank)
    x = torch.zeros(n)
    picked = torch.randperm(n, generator=generator)[: n // 50]
    x[picked] = torch.randint(-40, 41, (picked.numel(),), generator=generator).float()
    return x.to(dtype)


def float_input(rank: int, call: int, n: int, nonzeros: int) -> torch.Tensor:
    """A sparse input of real floats (quantized at the agreed scale, so not exactly), the same on every run
    for (rank, call): a run's bits depend on its codec states' history, which the path trials compare."""
    generator = torch.Generator().manual_seed(1000 * call + rank)
    x = torch.zeros(n)
    picked = torch.randperm(n, generator=generator)[:nonzeros]
    x[picked] = torch.randn(nonzeros, generator=generator)
    return x


@contextlib.contextmanager
def failing_session(rank: int, call_number: int, advance: int = 2) -> Iterator[None]:
    """While active, the session of ``rank``'s agent for its call ``call_number`` (its n-th session) raises
    MemoryError on its ``advance``-th computation (2: after the first round's results came back, before the
    second round is sent)."""
    made = [0]

    class FailingSession(WorkerSession):
        def __init__(self, x: torch.Tensor, session_rank: int, *args, **kwargs) -> None:
            super().__init__(x, session_rank, *args, **kwargs)
            self._armed = False
            if session_rank == rank:
                self._armed = made[0] == call_number
                made[0] += 1
            self._advances = 0

        def advance(self) -> bool:
            self._advances += 1
            if self._armed and self._advances == advance:
                raise MemoryError(f"injected: rank {rank} ran out of memory in call {call_number}")
            return super().advance()

    original = agent_module.WorkerSession
    agent_module.WorkerSession = FailingSession  # type: ignore[misc]
    try:
        yield
    finally:
        agent_module.WorkerSession = original  # type: ignore[misc]


def outcomes(agent: Agent, calls: int, mode: str, dtype: torch.dtype = torch.float32) -> list[str]:
    """For each of ``calls`` calls: "exact", "wrong: ..." or "error: ..." (an AggregationError; any other
    exception type is a finding too: "raised: ...")."""
    said = []
    for call in range(calls):
        try:
            # A fresh key per call: no state carries over, so every mode takes at least two rounds and a
            # failure after the first round's results is a failure in the middle of the call.
            result = agent.allreduce(call_input(agent.rank, call, dtype=dtype), mode=mode, key=call)
        except AggregationError as error:
            said.append(f"error: {error}")
            continue
        except Exception as exc:
            said.append(f"raised: {exc!r}")
            continue
        exact = sum(call_input(rank, call, dtype=dtype).double() for rank in range(agent.world_size))
        error = float((result.total.double() - exact).abs().max())
        said.append("exact" if error == 0 else f"wrong: max error {error}")
    return said
