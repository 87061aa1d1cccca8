"""The path policies (host_agent/path_policy.py): the default keeps the switch while it serves; ``fastest``
times each bucket on both paths, agrees the timings over the hosts and keeps the faster path, the same on
every rank and with the same bits as the switch alone."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
import torch

from host_agent.agent import Agent
from host_agent.path_policy import (
    DEFAULT_TRIALS,
    HOST,
    SWITCH,
    CallFacts,
    FastestPath,
    SwitchWhileHealthy,
    make_policy,
)
from host_agent.paths import PathBackend
from lhc_ina.constants import Op
from tests.harness.faults import float_input
from tests.harness.local_backend import LocalBackend, LocalGroup

WORLD, CALLS = 3, 14


def _facts(number: int, key: str = "a", usable: bool = True) -> CallFacts:
    return CallFacts(number, key, 100, switch_usable=usable)


def _no_meeting(words: torch.Tensor, what: str) -> torch.Tensor:
    raise AssertionError(f"the default policy met the other ranks for {what}")


def test_the_default_policy_takes_the_switch_while_it_is_usable_and_never_meets() -> None:
    policy = SwitchWhileHealthy()
    assert policy.choose(_facts(0), _no_meeting) == SWITCH
    assert policy.choose(_facts(1, usable=False), _no_meeting) == HOST


def test_fastest_warms_up_on_the_switch_then_alternates_and_settles_on_the_smaller_sum() -> None:
    policy = FastestPath(world_size=2, trials=2)
    sums: list[list[int]] = []

    def host_sum(words: torch.Tensor, what: str) -> torch.Tensor:
        sums.append(words.tolist())
        assert "bucket 'a'" in what
        return words * 2  # two ranks that measured alike

    paths = []
    took = {SWITCH: iter([0.030, 0.025]), HOST: iter([0.040, 0.010])}  # each path's slow call is dropped
    for number in range(5):
        paths.append(policy.choose(_facts(number), host_sum))
        policy.observe(_facts(number), paths[-1], 0.5 if number == 0 else next(took[paths[-1]]), "sketch")
    assert paths == [SWITCH, SWITCH, HOST, SWITCH, HOST]
    assert sums == []  # no meeting before every trial is in
    assert policy.choose(_facts(5), host_sum) == HOST
    assert sums == [[25_000, 10_000, 0]]  # each path's fastest trial; the warm-up call is not a trial
    assert policy.choose(_facts(6), host_sum) == HOST and len(sums) == 1  # settled: no more meetings
    assert "switch 50.0 ms, hosts 20.0 ms" in policy.reasons["a"]


def test_a_rank_that_could_not_time_both_paths_keeps_the_bucket_on_the_switch() -> None:
    """A fallback moved this rank's host trial (it never observed it): the hosts look free here, so the
    rank says it cannot compare, and every rank keeps the switch whatever the others timed."""
    policy = FastestPath(world_size=2, trials=1)
    for number in range(3):
        path = policy.choose(_facts(number), _no_meeting)
        if path == SWITCH:
            policy.observe(_facts(number), path, 0.050, "sketch")
    sent = []

    def host_sum(words: torch.Tensor, what: str) -> torch.Tensor:
        sent.append(words.tolist())
        return words + torch.tensor([50_000, 1_000, 0], dtype=torch.int32)  # the peer found the hosts fast

    assert policy.choose(_facts(3), host_sum) == SWITCH
    assert sent == [[50_000, 0, 1]]


def test_the_launch_line_sets_the_trials(monkeypatch) -> None:
    monkeypatch.setenv("LHC_PATH_TRIALS", "3")
    assert make_policy("fastest", 4).trials == 3
    monkeypatch.setenv("LHC_PATH_TRIALS", "two")
    with pytest.raises(ValueError, match="LHC_PATH_TRIALS must be an integer"):
        make_policy("fastest", 4)


def test_fastest_keeps_the_switch_when_it_is_faster_or_the_hosts_were_never_timed() -> None:
    for host_s, want in ((0.050, SWITCH), (None, SWITCH)):
        policy = FastestPath(world_size=1, trials=1)
        for number in range(3):
            path = policy.choose(_facts(number), lambda words, what: words)
            if path == SWITCH or host_s is not None:
                policy.observe(_facts(number), path, 0.020 if path == SWITCH else host_s, "sketch")
        assert policy.choose(_facts(3), lambda words, what: words) == want


@pytest.mark.parametrize(("protocol", "switch_s", "want"), [
    ("sketch", 0.0475, SWITCH),  # a compressed bucket: the faster path, however close
    ("sketch", 0.0500, SWITCH),  # a tie stays on the switch
    ("dense", 0.0475, HOST),  # a dense bucket 5% faster on the switch: within the margin
    ("dense", 0.0440, SWITCH),  # 12% faster: the switch keeps it
    ("dense", 0.0550, HOST),
])
def test_a_dense_bucket_keeps_the_switch_only_when_it_is_clearly_faster_there(
        protocol: str, switch_s: float, want: str) -> None:
    policy = FastestPath(world_size=1, trials=1)
    for number in range(3):
        path = policy.choose(_facts(number), lambda words, what: words)
        policy.observe(_facts(number), path, switch_s if path == SWITCH else 0.050, protocol)
    assert policy.choose(_facts(3), lambda words, what: words) == want
    assert ("dense: the switch keeps it 10% faster or more" in policy.reasons["a"]) == (protocol == "dense")


def test_fastest_takes_the_hosts_while_the_switch_is_not_usable_and_caps_its_sum() -> None:
    policy = FastestPath(world_size=1024)
    assert policy.choose(_facts(0, usable=False), lambda w, s: w) == HOST
    assert policy.cap_us * 1024 < 2**31
    policy.choose(_facts(1), lambda w, s: w)
    policy.choose(_facts(2), lambda w, s: w)
    policy.observe(_facts(2), SWITCH, 10_000.0, "dense")  # an hour-long trial saturates, never wraps
    assert policy._best_us["a"][0] == policy.cap_us


def test_a_path_name_the_policies_do_not_know_is_refused() -> None:
    assert isinstance(make_policy("fastest", 4), FastestPath)
    with pytest.raises(ValueError, match="path must be one of"):
        make_policy("quickest", 4)


class SlowSwitch(LocalBackend):
    """A switch path in memory that takes ``delay_s`` per message."""

    def __init__(self, group: LocalGroup, rank: int, delay_s: float) -> None:
        super().__init__(group, rank)
        self.delay_s = delay_s

    def reduce(self, op: Op, words: torch.Tensor) -> Future[torch.Tensor]:
        time.sleep(self.delay_s)
        return super().reduce(op, words)


def _run(switch_delay_s: float, policy: str) -> list[list[tuple[torch.Tensor, str]]]:
    switch, hosts = LocalGroup(WORLD), LocalGroup(WORLD).members()
    agents = [Agent(PathBackend(hosts[rank], SlowSwitch(switch, rank, switch_delay_s),
                                policy=make_policy(policy, WORLD), meet_timeout_s=10), timeout_s=10)
              for rank in range(WORLD)]
    out: list[list[tuple[torch.Tensor, str]]] = [[] for _ in agents]

    def member(agent: Agent) -> None:
        for call in range(CALLS):
            result = agent.allreduce(float_input(agent.rank, call, 4000, 200), key=call % 2)
            out[agent.rank].append((result.total, result.stats["path"]))
        agent.close()

    with ThreadPoolExecutor(WORLD) as pool:
        list(pool.map(member, agents, timeout=60))
    return out


def test_fastest_moves_buckets_to_the_faster_hosts_with_the_switchs_bits() -> None:
    """A switch path 20 ms a message slower than the hosts: after each bucket's warm-up and trials every
    rank sends it over the hosts, at the same call; every total equals the switch-only run's."""
    switch_only = _run(0.020, "switch")
    fastest = _run(0.020, "fastest")
    for rank in range(WORLD):
        for (want, want_path), (got, _) in zip(switch_only[rank], fastest[rank], strict=True):
            assert want_path == SWITCH
            assert torch.equal(want, got)
    paths = [[path for _, path in calls] for calls in fastest]
    assert paths[0] == paths[1] == paths[2]
    trials = 1 + 2 * DEFAULT_TRIALS  # calls per bucket before it settles; two buckets alternate
    per_bucket = [SWITCH] + [SWITCH, HOST] * DEFAULT_TRIALS  # the warm-up call, then the trials
    assert paths[0][: 2 * trials] == [path for path in per_bucket for _ in range(2)]
    assert paths[0][2 * trials:] == [HOST] * (CALLS - 2 * trials)


class _Recording(SwitchWhileHealthy):
    """The default policy, noting how the codec sent each call it is told of."""

    def __init__(self) -> None:
        self.protocols: list[str] = []

    def observe(self, facts: CallFacts, path: str, seconds: float, protocol: str) -> None:
        self.protocols.append(protocol)


def test_the_policy_learns_how_each_call_was_sent_dense_also_from_a_sparse_mode() -> None:
    """What a policy's margin for dense buckets reads: ``dense`` for a dense call, and for a sketch call
    whose bucket, known to be full, was cheaper sent whole; ``sketch`` for a sparse one."""
    switch, hosts = LocalGroup(2).members(), LocalGroup(2).members()
    policies = [_Recording() for _ in range(2)]
    agents = [Agent(PathBackend(hosts[rank], switch[rank], policy=policies[rank], meet_timeout_s=10),
                    timeout_s=10) for rank in range(2)]

    def member(agent: Agent) -> None:
        full = float_input(agent.rank, 0, 4000, 4000)
        agent.allreduce(full, key="full", mode="dense")
        for _ in range(2):
            agent.allreduce(full, key="full-sketch", mode="sketch")
        agent.allreduce(float_input(agent.rank, 1, 4000, 40), key="sparse", mode="sketch")
        agent.close()

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(member, agents, timeout=60))
    assert policies[0].protocols == policies[1].protocols == ["dense", "dense", "dense", "sketch"]
