"""Seeded fault trials of the path layer (issue 42) on real parts: softswitch and the controller as
processes, every rank's process-group codec on a real Gloo group, the ranks on threads of this process.

Each trial runs the same calls (sparse float buckets, two keys, a step end every second call) as one
uninterrupted run through the switch, with one fault at a seeded call: the switch killed (-9) for good;
killed and restarted after the fallback; the controller refusing the job at the join (unknown); the
controller killed while the switch lives; and the ways back to the switch a run on the hosts takes by
joining again: the job created after a join that found it unknown, the controller started after a join
that found none, the job deleted mid-run and created again under its name. Every call's total equals the
uninterrupted run's bit for bit on every rank, every rank records the same path changes, and no call
waits past the documented deadline (docs/pytorch.md: the stall deadline, the controller's diagnosis and
the meeting's deadline).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo

from host_agent.agent import Agent
from host_agent.path_join import join_or_fall_back
from host_agent.paths import DEFAULT_REJOIN_EVERY_S
from host_agent.process_group import ProcessGroupBackend
from host_agent.transport.switch import COURTESY_RPC_S
from lhc_launch.processes import ControllerProcess, SoftswitchProcess, free_tcp_port
from tests.harness.faults import float_input

WORLD, CALLS = 2, 10
SWITCH_TIMEOUT_S, MEET_TIMEOUT_S, JOIN_TIMEOUT_S = 2.0, 15.0, 5.0
#: The documented bound on one call's wait when the switch path fails in it.
DEADLINE_S = SWITCH_TIMEOUT_S + COURTESY_RPC_S + MEET_TIMEOUT_S
_GROUPS = iter(range(1 << 30))
METRICS = ("--metrics-addr", "127.0.0.1:0")


class Stack:
    """softswitch and the controller, brought back after each trial (a killed switch is started again on
    its addresses, a killed controller on its store)."""

    def __init__(self, state: Path) -> None:
        self.state, self.jobs = state, 0
        self.switch = SoftswitchProcess()
        self.controller = ControllerProcess(self.switch, state, *METRICS)
        self.controller.wait_for_switch()

    def job(self, create: bool = True) -> str:
        self.jobs += 1
        name = f"paths-{self.jobs}"
        if create:
            self.controller.client.create_job(name, workers=WORLD)
        return name

    def heal(self) -> None:
        if not self.switch.running():
            self.switch.restart(crash=True)
        if not self.controller.running():
            self.controller = ControllerProcess(self.switch, self.state, *METRICS)
        self.controller.wait_for_switch()

    def close(self) -> None:
        self.controller.terminate()
        self.switch.terminate()


def run(stack: Stack, job: str, before=lambda rank, call: None, controller: str = "",
        rejoin_every_s: float = DEFAULT_REJOIN_EVERY_S) -> list[dict]:
    """Every rank joins ``job`` (on ``controller``, default the stack's) with the hosts as the way out and
    makes the calls on its own thread: per rank its totals, paths, longest call and its path backend."""
    store, group = dist.HashStore(), next(_GROUPS)
    out: list[dict] = [{} for _ in range(WORLD)]

    def member(rank: int) -> None:
        gloo = ProcessGroupGloo(PrefixStore(f"paths-{group}", store), rank, WORLD, timedelta(seconds=60))
        host = ProcessGroupBackend(gloo, device=torch.device("cpu"))
        paths = join_or_fall_back(controller or stack.controller.listen, job, host,
                                  join_timeout_s=JOIN_TIMEOUT_S, meet_timeout_s=MEET_TIMEOUT_S,
                                  timeout_s=SWITCH_TIMEOUT_S, heartbeat_s=0.2, rejoin_every_s=rejoin_every_s)
        agent = Agent(paths, timeout_s=2 * SWITCH_TIMEOUT_S)
        totals, taken, longest = [], [], 0.0
        for call in range(CALLS):
            before(rank, call)
            started = time.monotonic()
            result = agent.allreduce(float_input(rank, call, 6000, 400), key=call % 2, step_end=call % 2 == 1)
            longest = max(longest, time.monotonic() - started)
            totals.append(result.total)
            taken.append(result.stats["path"])
        agent.close()
        out[rank] = {"totals": totals, "paths": taken, "longest": longest, "backend": paths}

    threads = [threading.Thread(target=member, args=(rank,), daemon=True) for rank in range(WORLD)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=CALLS * DEADLINE_S + 60)
    assert not any(thread.is_alive() for thread in threads), "a rank hung"
    assert all(out), "a rank raised (see the thread's exception above)"
    return out


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    stack = Stack(tmp_path_factory.mktemp("path-faults"))
    yield stack
    stack.close()


@pytest.fixture(scope="module")
def uninterrupted(stack: Stack) -> list[list[torch.Tensor]]:
    ranks = run(stack, stack.job())
    assert all(r["paths"] == ["switch"] * CALLS for r in ranks)
    return [r["totals"] for r in ranks]


def _assert_bits(ranks: list[dict], reference: list[list[torch.Tensor]]) -> None:
    for rank, got in enumerate(ranks):
        same = [torch.equal(a, b) for a, b in zip(got["totals"], reference[rank], strict=True)]
        assert same == [True] * CALLS, (rank, same, got["paths"])
        assert got["longest"] < DEADLINE_S, got["longest"]
    events = {tuple((e["event"], e["call"]) for e in r["backend"].events) for r in ranks}
    assert len(events) == 1, events  # every rank moved at the same calls


def _wait_reinstalled(stack: Stack, job: str, epoch: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        info = stack.controller.client.status(job)
        if info.installed and info.epoch != epoch:
            return
        time.sleep(0.2)
    raise AssertionError(f"job {job} was not re-installed under a new epoch")


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2))
def test_the_switch_killed_for_good_mid_run_gives_the_uninterrupted_bits(seed: int, stack: Stack,
                                                                           uninterrupted) -> None:
    at = random.Random(seed).randrange(1, CALLS - 2)
    job = stack.job()
    ranks = run(stack, job, lambda rank, call: stack.switch.kill() if (rank, call) == (0, at) else None)
    stack.heal()
    _assert_bits(ranks, uninterrupted)
    for r in ranks:
        host_from = r["paths"].index("host")
        assert at <= host_from <= at + 1, r["paths"]
        assert r["paths"][host_from:] == ["host"] * (CALLS - host_from), r["paths"]
        assert (r["backend"].fallbacks, r["backend"].returns) == (1, 0)


@pytest.mark.slow
def test_the_switch_restarted_after_the_fallback_takes_the_ranks_back_at_a_step_end(stack: Stack,
                                                                                     uninterrupted) -> None:
    job = stack.job()
    epoch = stack.controller.client.status(job).epoch

    def before(rank: int, call: int) -> None:
        if (rank, call) == (0, 2):
            stack.switch.kill()
        if (rank, call) == (0, 5):  # on the hosts by now: the switch comes back, the job under a new epoch
            stack.switch.restart(crash=True)
            _wait_reinstalled(stack, job, epoch)
        if call == 6:  # a step's computation: every rank's heartbeat brings the new epoch meanwhile
            time.sleep(1.0)
        if (rank, call) == (0, 9):  # what the controller's metrics say once the heartbeats carried it
            time.sleep(1.0)
            url = f"http://{stack.controller.metrics}/metrics"
            scraped.append(urllib.request.urlopen(url, timeout=30).read().decode())

    scraped: list[str] = []
    ranks = run(stack, job, before)
    stack.heal()
    _assert_bits(ranks, uninterrupted)
    for r in ranks:
        assert (r["backend"].fallbacks, r["backend"].returns) == (1, 1)
        assert r["paths"] == ["switch"] * 2 + ["host"] * 4 + ["switch"] * 4, r["paths"]
    for line in (f'lhc_job_path_members{{job="{job}",path="switch"}} 2.0',
                 f'lhc_job_path_calls_total{{job="{job}",path="host"}} 4.0',
                 f'lhc_job_path_fallbacks_total{{job="{job}"}} 1.0',
                 f'lhc_job_path_returns_total{{job="{job}"}} 1.0'):
        assert line in scraped[0], (line, [m for m in scraped[0].splitlines() if "path" in m])


@pytest.mark.slow
@pytest.mark.parametrize("case", ["unknown job", "no controller"])
def test_a_job_the_controller_refuses_or_cannot_serve_runs_over_the_hosts_with_one_warning(
        case: str, stack: Stack, uninterrupted, caplog: pytest.LogCaptureFixture) -> None:
    """The job unknown to the controller (NOT_FOUND), or no controller at the address (nothing listens
    there): every rank goes over the hosts from the first call, and says why once."""
    nowhere = f"127.0.0.1:{free_tcp_port()}" if case == "no controller" else ""
    with caplog.at_level(logging.WARNING, logger="lhc.paths"):
        ranks = run(stack, stack.job(create=False), controller=nowhere)
    _assert_bits(ranks, uninterrupted)
    assert all(r["paths"] == ["host"] * CALLS for r in ranks)
    warnings = [record.getMessage() for record in caplog.records if record.name == "lhc.paths"]
    assert len(warnings) == WORLD, warnings  # one per rank, naming the cause and what happens now
    cause = "no job named" if case == "unknown job" else nowhere
    assert all(cause in w and "process group" in w for w in warnings), warnings


def _assert_back(ranks: list[dict], events: list[tuple[str, int]]) -> None:
    """Every rank fell back and returned at ``events``' calls, and took the paths those imply."""
    (_, left), (_, back) = events
    for r in ranks:
        assert [(e["event"], e["call"]) for e in r["backend"].events] == events, r["backend"].events
        assert r["paths"] == ["switch"] * left + ["host"] * (back - left) + ["switch"] * (CALLS - back)
        assert r["backend"].counters()["path_fallbacks"] == r["backend"].counters()["path_returns"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("case", ["job created", "controller started"])
def test_a_run_that_fell_back_at_the_join_returns_when_its_job_can_be_served(case: str, stack: Stack,
                                                                              uninterrupted) -> None:
    """The join finds the job unknown (created on the hosts before call 2), or no controller at its
    address (started there, on the same store, before call 2): the ranks join again at the vote of call
    2's step boundary and every call from 2 on goes through the switch."""
    job = stack.job(create=case == "controller started")
    address = f"127.0.0.1:{free_tcp_port()}" if case == "controller started" else ""
    if address:
        stack.controller.terminate()

    def before(rank: int, call: int) -> None:
        if (rank, call) != (0, 2):
            return
        if address:
            stack.controller = ControllerProcess(stack.switch, stack.state, *METRICS, "--listen", address)
            stack.controller.wait_for_switch()
        else:
            stack.controller.client.create_job(job, workers=WORLD)

    ranks = run(stack, job, before, controller=address, rejoin_every_s=0)
    stack.heal()
    _assert_bits(ranks, uninterrupted)
    _assert_back(ranks, [("fallback", 0), ("return", 2)])


@pytest.mark.slow
def test_a_job_deleted_mid_run_and_created_again_takes_the_ranks_back(stack: Stack, uninterrupted) -> None:
    """The operator deletes the job before call 3 (its entries leave the switch, call 3 stalls: every rank
    moves to the hosts there) and creates it again under its name before call 6: at call 4's vote each
    rank drops its membership (its job id is unknown now) and finds no job to join; at call 6's it joins
    the new job, and the ranks return to the switch together."""
    job = stack.job()

    def before(rank: int, call: int) -> None:
        if (rank, call) == (0, 3):
            stack.controller.client.delete_job(job)
        if (rank, call) == (0, 6):
            created.append(stack.controller.client.create_job(job, workers=WORLD).job_id)

    created: list[int] = []
    ranks = run(stack, job, before, rejoin_every_s=0)
    _assert_bits(ranks, uninterrupted)
    _assert_back(ranks, [("fallback", 3), ("return", 6)])
    assert [r["backend"].switch.job_id for r in ranks] == created * WORLD  # the new job, not the old


@pytest.mark.slow
def test_the_controller_killed_with_the_switch_alive_keeps_the_switch_path(stack: Stack,
                                                                            uninterrupted) -> None:
    def before(rank: int, call: int) -> None:
        if (rank, call) == (0, 3):
            stack.controller.kill()

    ranks = run(stack, stack.job(), before)
    stack.heal()
    _assert_bits(ranks, uninterrupted)
    assert all(r["paths"] == ["switch"] * CALLS for r in ranks)


def test_strict_is_read_from_the_environment() -> None:
    from host_agent.path_join import strict_from_env

    assert not strict_from_env({}) and not strict_from_env({"LHC_STRICT": "0"})
    assert strict_from_env({"LHC_STRICT": "1"})
