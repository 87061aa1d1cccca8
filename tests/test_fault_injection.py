"""Seeded fault injection: whatever fails, wherever, every live worker ends each call exact or with a clear
error, never with a wrong sum and never hung past the configured timeout.

Each trial joins W agents (in this process, each with its own UDP socket) to a fresh job on one softswitch
and one controller (real processes), makes 1-3 calls of random modes, sizes, dtypes and keys, and injects
one fault at a random point: a worker raises alone between rounds, stalls, or dies (its I/O thread and
heartbeats stop, no goodbye); the controller or the switch is killed (-9, then restarted: the switch comes
back empty and the jobs get new epochs) or stalled (SIGSTOP, then SIGCONT). ``LHC_FAULT_TRIALS`` sets the
number of trials (default 88, in 4 shares that a parallel run spreads; each kind of fault lands in 8
of them or more); a failing trial prints its seed.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Iterator

import pytest

from host_agent.agent import Agent
from lhc_launch.processes import SoftswitchProcess
from tests.harness.agents import join_agents
from tests.harness.fault_trials import TrialStack, check_trials, draw_trial, run_calls, said
from tests.harness.faults import failing_session

TRIALS = int(os.environ.get("LHC_FAULT_TRIALS", "88"))
#: The trials run in this many shares (seed s in share s mod SHARES), each a test of its own xdist group,
#: so that a parallel run spreads them over its workers (each worker its own switch and controller).
SHARES = 4
SHARE_PARAMS = [pytest.param(share, marks=pytest.mark.xdist_group(f"fault-injection-{share}"))
                for share in range(SHARES)]
KINDS = {"none": 3, "worker_raise": 4, "worker_stall": 2, "worker_kill": 3, "controller_kill": 2,
         "controller_stall": 3, "switch_kill": 3, "switch_stall": 2}
#: The transport's timer for a silent peer; a switch that restarts needs the controller to re-admit the
#: job (reconnect, pipeline, entries) before the workers can resync, so those trials wait longer.
TIMEOUT_S = {"switch_kill": 8.0}
DEFAULT_TIMEOUT_S = 0.8


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrialStack]:
    stack = TrialStack(SoftswitchProcess(), tmp_path_factory.mktemp("faults"))
    yield stack
    stack.close()


def _kill_worker(agent: Agent) -> None:
    """What a worker's death looks like to the others: its packets and heartbeats stop, nobody leaves."""
    agent.backend.heartbeats.stop()
    agent.backend.stream.close()


def _fault(stack: TrialStack, kind: str, rng: random.Random, victim: Agent) -> None:
    """Run in its own thread, at a random point of the trial's calls."""
    time.sleep(rng.uniform(0.0, 0.3))
    if kind == "worker_kill":
        _kill_worker(victim)
    elif kind == "controller_kill":
        stack.controller.kill()
    elif kind == "switch_kill":
        stack.switch.restart(crash=True)
    elif kind in ("controller_stall", "switch_stall"):
        process = stack.controller if kind == "controller_stall" else stack.switch
        os.kill(process.proc.pid, signal.SIGSTOP)
        time.sleep(rng.uniform(0.1, 2 * DEFAULT_TIMEOUT_S))
        os.kill(process.proc.pid, signal.SIGCONT)


def _trial(stack: TrialStack, seed: int) -> tuple[str, list[str]]:
    """One trial: its fault kind and every live worker's outcome of every call."""
    trial = draw_trial(seed, KINDS, (2, 3))
    kind, rng = trial.kind, trial.rng
    timeout_s = TIMEOUT_S.get(kind, DEFAULT_TIMEOUT_S)
    job = stack.open_job(f"fault-{seed}", trial.world)
    agents = join_agents(stack.controller.listen, job, ["127.0.0.1"] * trial.world, timeout_s,
                         heartbeat_s=0.2)
    victim, fault_call = agents[rng.randrange(trial.world)], rng.randrange(trial.calls)
    stall_s = rng.uniform(0.0, 2 * timeout_s)

    def before(agent: Agent, call: int) -> None:
        if agent is victim and call == fault_call:
            if kind == "worker_stall":
                time.sleep(stall_s)
            elif kind != "worker_raise":
                stack.start_fault(_fault, stack, kind, rng, victim)

    raise_in = failing_session(victim.rank, fault_call, advance=rng.choice((1, 2, 3)))
    with raise_in if kind == "worker_raise" else contextlib.nullcontext():
        outcomes, hung = run_calls(trial, agents, before, timeout_s)
    stack.end_trial(job, agents)
    dead = {victim.rank} if kind in ("worker_kill", "worker_raise") else set()
    return kind, said(outcomes, hung, dead)


@pytest.mark.slow
@pytest.mark.parametrize("share", SHARE_PARAMS)
def test_every_live_worker_ends_exact_or_with_a_clear_error(stack: TrialStack, share: int) -> None:
    seeds = range(share, TRIALS, SHARES)
    tally, exact_trials = check_trials(seeds, lambda seed: _trial(stack, seed),
                                       f"fault injection, share {share}")
    # Not vacuous: the trials without a fault, and most stalls, end exact.
    assert exact_trials >= len(seeds) // 5, tally
