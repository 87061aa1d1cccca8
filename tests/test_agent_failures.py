"""A worker out of step with its peers never makes anyone return a wrong sum (issue: one-sided failures).

A worker that fails alone mid-call, in every mode, over memory, torch.distributed and the switch: every
worker raises for that call and the next, none returns a result. A worker whose messages belong to another
call is caught by the round's seal on every worker. A job of another size than the run is refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from host_agent.agent import Agent
from host_agent.errors import AggregationError
from host_agent.seal import check_seal, round_tag, seal_words
from host_agent.transport.switch import SwitchBackend
from lhc_launch.processes import ControllerProcess, SoftswitchProcess
from tests.harness.faults import failing_session, outcomes
from tests.harness.local_backend import LocalGroup

MODES = ("dense", "sketch", "union")
CALLS = 3  # call 0 clean, call 1 where rank 0 fails alone, call 2 after it
SCRIPT = Path(__file__).with_name("harness") / "pg_failure_rank.py"


class _Stack:
    """softswitch and the controller as processes; ``new_job`` admits a fresh job."""

    def __init__(self, controller: ControllerProcess) -> None:
        self.controller = controller
        self.jobs = 0

    def new_job(self, workers: int) -> tuple[str, str]:
        self.jobs += 1
        name = f"failures-{self.jobs}"
        self.controller.client.create_job(name, workers=workers)
        return self.controller.listen, name


@pytest.fixture(scope="module")
def switch_stack(tmp_path_factory: pytest.TempPathFactory):
    with SoftswitchProcess() as switch, ControllerProcess(switch, tmp_path_factory.mktemp("ctl")) as ctl:
        yield _Stack(ctl)


def _in_threads(agents: list[Agent], work) -> list[object]:
    results: list[object] = [None] * len(agents)

    def member(agent: Agent) -> None:
        results[agent.rank] = work(agent)

    threads = [threading.Thread(target=member, args=(agent,)) for agent in agents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a worker hung"
    return results


def _assert_fails_together(said: list[list[str]]) -> None:
    """Call 0 exact everywhere; calls 1 and 2 an AggregationError everywhere, never a result."""
    for rank, calls in enumerate(said):
        assert calls[0] == "exact", (rank, calls)
        for call in (1, 2):
            assert calls[call].startswith("error: "), (rank, call, calls)
    assert "out of memory" in said[0][1]  # the failed worker says why
    assert "out of memory" in said[0][2]  # and keeps saying it: it must rejoin


def test_the_seal_is_w_times_the_tag_and_nothing_else() -> None:
    tag = 0x9E3779B9 | 1
    world = 4
    check_seal(seal_words(tag) * world, tag, world, 0, 0)
    for other in (torch.zeros(1, dtype=torch.int32), seal_words(round_tag(1, 0, [])), seal_words(tag + 2)):
        with pytest.raises(AggregationError, match="seal summed"):
            check_seal(seal_words(tag) * (world - 1) + other, tag, world, 0, 0)


@pytest.mark.parametrize("mode", MODES)
def test_a_worker_failing_alone_fails_every_worker_over_memory(mode: str) -> None:
    agents = [Agent(backend, timeout_s=2.0) for backend in LocalGroup(3).members()]
    with failing_session(rank=0, call_number=1):
        said = _in_threads(agents, lambda agent: outcomes(agent, CALLS, mode))
    for agent in agents:
        agent.close()
    _assert_fails_together(said)


@pytest.mark.parametrize("backend", ["memory", "switch"])
def test_messages_of_another_call_are_caught_by_the_seal_on_every_worker(backend: str, request) -> None:
    """Rank 0 believes it made one call more than its peer: its messages have the same ops and lengths
    (dense int32), so only the seal can tell them apart. Through softswitch positions are all the switch
    knows: it adds rank 0's words of its "next" call to rank 1's."""
    if backend == "switch":
        agents = _in_threads_join(*request.getfixturevalue("switch_stack").new_job(workers=2), 2)
    else:
        agents = [Agent(member, timeout_s=5.0) for member in LocalGroup(2).members()]
    agents[0]._calls = 1  # as if its previous call had been made alone
    x = torch.arange(200, dtype=torch.int32)
    results = _in_threads(agents, lambda agent: _try(lambda: agent.allreduce(x, mode="dense")))
    for agent in agents:
        agent.close()
    for result in results:
        assert isinstance(result, AggregationError) and "seal summed" in str(result), result


def _try(fn):
    try:
        return fn()
    except Exception as exc:
        return exc


@pytest.mark.parametrize("mode", MODES)
def test_a_worker_failing_alone_fails_every_worker_through_the_switch(mode: str, switch_stack) -> None:
    controller, job = switch_stack.new_job(workers=2)
    agents = _in_threads_join(controller, job, 2)
    with failing_session(rank=0, call_number=1):
        said = _in_threads(agents, lambda agent: outcomes(agent, CALLS, mode))
    for agent in agents:
        agent.close()
    _assert_fails_together(said)
    assert "rank 0" in said[1][1] or "(0" in said[1][1] or "[0]" in said[1][1], said[1][1]


def _in_threads_join(controller: str, job: str, world: int) -> list[Agent]:
    agents: list[Agent | None] = [None] * world

    def join(slot: int) -> None:
        agents[slot] = Agent.join(controller, job, timeout_s=2.0, heartbeat_s=0.2)

    threads = [threading.Thread(target=join, args=(slot,)) for slot in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    joined = sorted((agent for agent in agents if agent is not None), key=lambda agent: agent.rank)
    assert len(joined) == world
    return joined


def test_a_job_of_another_size_than_the_run_is_refused_on_every_rank(switch_stack) -> None:
    controller, job = switch_stack.new_job(workers=2)
    errors = []
    for _ in range(2):
        with pytest.raises(ValueError, match="has 2 workers but this run has 3") as refused:
            SwitchBackend.join(controller, job, world_size=3)
        errors.append(refused.value)
    assert len(errors) == 2


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_worker_failing_alone_fails_every_worker_over_gloo(mode: str, tmp_path: Path) -> None:
    port = _free_port()
    procs = [
        subprocess.Popen([sys.executable, str(SCRIPT), str(rank), "2", str(port), mode, str(tmp_path)],
                         stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(SCRIPT.parents[2])})
        for rank in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
    said = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    _assert_fails_together(said)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_worker_closes_promptly_when_the_controller_hangs(tmp_path: Path) -> None:
    """Leaving the job and stopping the heartbeats are courtesies with short deadlines: with the
    controller stopped (SIGSTOP: it accepts connections and never answers), close() returns in seconds,
    not after the RPCs' default 30 s each (the issue measured about 50 s)."""
    import signal
    import time

    with SoftswitchProcess() as switch, ControllerProcess(switch, tmp_path) as controller:
        controller.client.create_job("hung", workers=1)
        agent = Agent.join(controller.listen, "hung", heartbeat_s=0.2)
        assert agent.allreduce(torch.ones(10, dtype=torch.int32), mode="dense").total.sum() == 10
        os.kill(controller.proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            agent.close()
            assert time.monotonic() - started < 8.0
        finally:
            os.kill(controller.proc.pid, signal.SIGCONT)
