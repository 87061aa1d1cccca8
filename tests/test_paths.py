"""The path layer's agreement (host_agent/paths.py), in memory: a switch path that breaks at any message,
its last result reaching only some ranks, is survived with every call's total equal to an unbroken run's,
bit for bit, on every rank; the ranks agree which path each call took; a return needs every rank's vote;
a run that started on the hosts returns with memberships kept from the join or made by joining again.
(tests/test_path_faults.py runs the same over softswitch, the controller and Gloo.)"""

from __future__ import annotations

import random
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from unittest.mock import patch

import grpc
import pytest
import torch

from host_agent.agent import Agent
from host_agent.errors import AggregationError
from host_agent.path_join import join_or_fall_back
from host_agent.path_policy import HOST, SWITCH
from host_agent.paths import PathBackend
from lhc_ina.constants import Op
from lhc_ina.jobservice.errors import ControllerError
from tests.harness.faults import float_input
from tests.harness.local_backend import LocalBackend, LocalGroup

CALLS = 6


class BreakingSwitch(LocalBackend):
    """A switch path in memory that breaks at message ``at``: that message's sum reaches the ranks in
    ``reached`` only (a multicast half delivered), and every later message fails. ``reopen`` joins a fresh
    group, as a switch back under a new epoch; ``epoch`` is what this rank would vote to return under."""

    def __init__(self, group: LocalGroup, rank: int, at: int, reached: set[int], fresh: LocalGroup) -> None:
        super().__init__(group, rank)
        self.at, self.reached, self.fresh = at, reached, fresh
        self.epoch = 0
        self.left = False

    def reduce(self, op: Op, words: torch.Tensor) -> Future[torch.Tensor]:
        index = self._sent
        summed = super().reduce(op, words)
        if self.at < 0 or index < self.at or (index == self.at and self.rank in self.reached):
            return summed
        failed: Future[torch.Tensor] = Future()
        failed.set_exception(AggregationError(f"no result for message {index}: the switch is gone"))
        return failed

    job_id = 1

    def leave_path(self) -> None:
        self.left = True

    def return_epoch(self) -> int:
        return self.epoch

    def gone(self) -> str:
        return ""

    def refresh(self) -> None:
        """The epoch is set by the test itself."""

    def reopen(self, epoch: int) -> None:
        self.group, self._sent, self.at = self.fresh, 0, -1


def _run(agents: list[Agent], before=lambda rank, call: None, keys: int = 2,
         marked: bool = True) -> list[list[tuple[torch.Tensor, str]]]:
    """Every rank's calls on its own thread: (total, path) per call; ``sent[call]`` records how many
    switch messages rank 0 had sent once the call completed. Bucket keys cycle through ``keys``; with
    ``marked`` every second call ends a step."""
    out: list[list[tuple[torch.Tensor, str]]] = [[] for _ in agents]

    def member(agent: Agent) -> None:
        for call in range(CALLS):
            before(agent.rank, call)
            bucket = float_input(agent.rank, call, 4000, 200)
            result = agent.allreduce(bucket, key=call % keys, step_end=marked and call % 2 == 1)
            out[agent.rank].append((result.total, result.stats["path"]))
            if agent.rank == 0 and agent.backend.switch is not None:
                sent.append(agent.backend.switch._sent)
        agent.close()

    with ThreadPoolExecutor(len(agents)) as pool:  # each rank on its own thread; a hung one times out
        list(pool.map(member, agents, timeout=60))
    return out


sent: list[int] = []


def _agents(world: int, at: int, reached: set[int]) -> tuple[list[Agent], list[BreakingSwitch]]:
    switch, fresh, hosts = LocalGroup(world), LocalGroup(world), LocalGroup(world).members()
    switches = [BreakingSwitch(switch, rank, at, reached, fresh) for rank in range(world)]
    agents = [Agent(PathBackend(hosts[rank], switches[rank], meet_timeout_s=10), timeout_s=10)
              for rank in range(world)]
    return agents, switches


@pytest.fixture(scope="module")
def unbroken() -> tuple[list[list[tuple[torch.Tensor, str]]], list[int]]:
    """The unbroken run's totals, and the number of each call's last switch message."""
    sent.clear()
    totals = _run(_agents(3, -1, set())[0])
    return totals, [count - 1 for count in sent]


@pytest.mark.parametrize("seed", range(6))
def test_a_switch_breaking_at_any_message_gives_the_unbroken_bits(seed: int, unbroken) -> None:
    """The break falls on a seeded message, its sum reaching a seeded subset of the ranks; on even seeds it
    is a call's last message and reaches rank 0 only, which then holds the call's total while its peers
    do not, and must take part in the call again on the hosts. Every call's total equals the unbroken
    run's on every rank, and every rank took the same path for every call (switch up to the agreed call,
    hosts after)."""
    unbroken, last_messages = unbroken
    rng = random.Random(seed)
    reached = {rank for rank in range(3) if rng.random() < 0.5}
    at = rng.randrange(1, last_messages[-1])
    if seed % 2 == 0:
        at, reached = last_messages[rng.randrange(CALLS - 1)], {0}
    agents, switches = _agents(3, at, reached)
    replayed: list[int] = []
    replay = PathBackend._replay
    with patch.object(PathBackend, "_replay", lambda self, n: (replayed.append(self.rank), replay(self, n))):
        got = _run(agents)
    assert replayed == ([0] if seed % 2 == 0 else []), replayed
    for rank in range(3):
        same = [torch.equal(a, b) for (a, _), (b, _) in zip(got[rank], unbroken[rank], strict=True)]
        assert same == [True] * CALLS, (rank, same)
    # Every rank records the same fallback call; a rank's stats show the switch for that call only where
    # it had the switch's total before the meeting (and took part in the call on the hosts again).
    agreed = {tuple((e["event"], e["call"]) for e in agent.backend.events) for agent in agents}
    assert len(agreed) == 1, agreed
    first_host = agreed.pop()[0][1] if agents[0].backend.events else CALLS
    for rank, calls in enumerate(got):
        paths = [path for _, path in calls]
        replay = [SWITCH] if rank in replayed else []
        assert paths == [SWITCH] * first_host + replay + [HOST] * (CALLS - first_host - len(replay)), paths
    assert all(agent.backend.fallbacks == (first_host < CALLS) for agent in agents)
    assert all(switch.left == (first_host < CALLS) for switch in switches)


def test_the_ranks_return_at_a_step_end_only_when_every_rank_votes_for_it(unbroken) -> None:
    unbroken = unbroken[0]
    """Broken in call 0; rank 2 sees the switch back from call 2 on, the others from call 3 on: the first
    vote every rank passes is at the step end after call 3, so calls 0-3 go over the hosts, 4-5 through
    the (fresh) switch, with the unbroken bits."""
    agents, switches = _agents(3, 1, {0})

    def before(rank: int, call: int) -> None:
        if call == (2 if rank == 2 else 3):
            switches[rank].epoch = 7

    got = _run(agents, before)
    for rank in range(3):
        assert [path for _, path in got[rank]] == [HOST] * 4 + [SWITCH] * 2
        assert all(torch.equal(a, b) for (a, _), (b, _) in zip(got[rank], unbroken[rank], strict=True))
        assert (agents[rank].backend.fallbacks, agents[rank].backend.returns) == (1, 1)


def test_without_step_marks_the_ranks_vote_where_a_bucket_key_comes_again() -> None:
    """The ``lhc`` backend marks no step ends (DDP hands it buckets, not steps): with three buckets a
    step (keys 0, 1, 2) the first boundary is call 3, where key 0 comes again, so a switch back from
    call 1 on takes the ranks back there, with the bits of an unbroken run of the same calls."""
    whole = _run(_agents(3, -1, set())[0], keys=3, marked=False)
    agents, switches = _agents(3, 1, {0})

    def before(rank: int, call: int) -> None:
        if call == 1:
            switches[rank].epoch = 7

    got = _run(agents, before, keys=3, marked=False)
    for rank in range(3):
        assert [path for _, path in got[rank]] == [HOST] * 3 + [SWITCH] * 3
        assert all(torch.equal(a, b) for (a, _), (b, _) in zip(got[rank], whole[rank], strict=True))
        events = [(e["event"], e["call"]) for e in agents[rank].backend.events]
        assert events == [("fallback", 0), ("return", 3)], events


def test_a_run_that_fell_back_at_the_join_joins_again_when_any_rank_says_it_is_time(unbroken) -> None:
    """Every rank starts on the hosts without a membership; rank 0's retry period has passed, the others'
    (an hour) has not: at the first step boundary (call 2) every rank joins again, because the vote
    carries rank 0's clock, and they return together; the bits are the unbroken run's."""
    fresh, hosts = LocalGroup(3), LocalGroup(3).members()
    joins: list[int] = []

    def rejoin(rank: int) -> BreakingSwitch:
        joins.append(rank)
        member = BreakingSwitch(fresh, rank, -1, set(), fresh)
        member.epoch = 4
        return member

    agents = [Agent(PathBackend(hosts[rank], None, why_host="the job is unknown", meet_timeout_s=10,
                                rejoin=lambda rank=rank: rejoin(rank),
                                rejoin_every_s=0 if rank == 0 else 3600), timeout_s=10) for rank in range(3)]
    got = _run(agents)
    assert sorted(joins) == [0, 1, 2]
    for rank in range(3):
        assert [path for _, path in got[rank]] == [HOST] * 2 + [SWITCH] * 4
        assert all(torch.equal(a, b) for (a, _), (b, _) in zip(got[rank], unbroken[0][rank], strict=True))
        backend = agents[rank].backend
        assert (backend.fallbacks, backend.returns, backend.why_host) == (1, 1, "")


class NotInstalled(BreakingSwitch):
    """A membership whose job every rank joined but no switch holds yet (its switch is down)."""

    stream = None

    def wait_installed(self, timeout_s: float) -> None:
        raise ControllerError(grpc.StatusCode.DEADLINE_EXCEEDED, f"not installed within {timeout_s:g} s")


def test_a_join_whose_switch_is_down_keeps_the_memberships_and_returns_once_installed(unbroken) -> None:
    """Every rank joins, none sees the job installed: the run starts on the hosts with each rank keeping
    its membership (nothing to join again), and when the job is installed (epoch 4, seen before call 2)
    every rank returns at call 2's boundary, with the unbroken bits."""
    fresh, hosts = LocalGroup(3), LocalGroup(3).members()
    members: dict[int, NotInstalled] = {}

    def enrol(controller: str, job: str, **options) -> tuple[NotInstalled, str]:
        return members[threading.get_ident()], ""

    def make_agent(rank: int) -> Agent:
        members[threading.get_ident()] = NotInstalled(fresh, rank, -1, set(), fresh)
        return Agent(join_or_fall_back("nowhere", "j", hosts[rank], join_timeout_s=1, meet_timeout_s=10),
                     timeout_s=10)

    with patch("host_agent.path_join._enrol", enrol), ThreadPoolExecutor(3) as pool:
        agents = list(pool.map(make_agent, range(3), timeout=30))
    for agent in agents:  # on the hosts, each membership kept
        assert agent.backend.switch is not None and "not installed" in agent.backend.why_host

    def before(rank: int, call: int) -> None:
        if call == 2:
            agents[rank].backend.switch.epoch = 4

    got = _run(agents, before)
    for rank in range(3):
        assert [path for _, path in got[rank]] == [HOST] * 2 + [SWITCH] * 4
        assert all(torch.equal(a, b) for (a, _), (b, _) in zip(got[rank], unbroken[0][rank], strict=True))
        assert (agents[rank].backend.fallbacks, agents[rank].backend.returns) == (1, 1)
