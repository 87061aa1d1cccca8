"""Seeded failure trials over a leaf/spine fabric (issue 31): a leaf or the spine is killed (-9) mid-job and
restarted empty, or stopped for a while (SIGSTOP, then SIGCONT); every live worker ends every call exact
or with a clear error (an ``AggregationError``), never a wrong sum, never hung past its timeout.

Each trial joins W agents (in this process) to a fresh job whose workers sit under both leaves, so that
it spans both leaves and the spine (three softswitch processes and one controller, real processes), makes
1-3 calls of random modes, sizes, dtypes and keys, and injects one fault at a random point. A switch back
empty makes the controller push its pipeline and re-admit the job under a fresh epoch on every switch
(``controller.sessions``); the agents learn it from their heartbeats and replay. ``LHC_FABRIC_TRIALS``
sets the number of trials (default 8 in the normal run; docs/testing.md gives the 60-trial run's tally);
a failing trial prints its seed.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from host_agent.agent import Agent
from host_agent.errors import AggregationError
from lhc_launch.processes import ControllerProcess, FabricProcesses, SoftswitchProcess

TRIALS = int(os.environ.get("LHC_FABRIC_TRIALS", "8"))
KINDS = {"none": 1, "leaf_kill": 3, "spine_kill": 3, "leaf_stall": 1, "spine_stall": 1}
MODES = ("dense", "sketch", "union", "auto")
#: A switch killed and restarted needs the controller to notice, push its pipeline and re-admit the job on
#: every switch before the workers can resync: the transport's silent-peer timer allows for that.
TIMEOUT_S = 8.0


class _Stack:
    """The fabric and the controller of every trial."""

    def __init__(self, state: Path) -> None:
        self.fabric = FabricProcesses(2, state)
        self.controller = ControllerProcess(self.fabric, state)
        self.controller.wait_for_switch()
        self.jobs = 0

    def victim(self, kind: str, rng: random.Random) -> SoftswitchProcess:
        return self.fabric.spine if kind.startswith("spine") else rng.choice(self.fabric.leaves)

    def heal(self) -> None:
        for process in self.fabric.switches.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.proc.pid, signal.SIGCONT)
        self.controller.wait_for_switch()

    def close(self) -> None:
        self.heal()
        self.controller.terminate()
        self.fabric.terminate()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    stack = _Stack(tmp_path_factory.mktemp("fabric-faults"))
    yield stack
    stack.close()


def _input(rng: random.Random, rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(rng.randrange(2**31) + rank)
    x = torch.zeros(n)
    hit = torch.randperm(n, generator=generator)[: max(1, n // rng.choice((100, 20, 2)))]
    x[hit] = torch.randint(-40, 41, (hit.numel(),), generator=generator).float()
    return x.to(dtype)


def _join(stack: _Stack, job: str, world: int) -> list[Agent]:
    """``world`` agents, alternately under leaf 0 and leaf 1 (so the job spans the fabric), by rank."""
    agents: list[Agent] = []
    lock = threading.Lock()

    def join(ip: str) -> None:
        agent = Agent.join(stack.controller.listen, job, ip=ip, timeout_s=TIMEOUT_S, heartbeat_s=0.2)
        with lock:
            agents.append(agent)

    ips = [stack.fabric.host_ips[i % 2] for i in range(world)]
    threads = [threading.Thread(target=join, args=(ip,)) for ip in ips]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(agents) == world, "a worker could not join"
    return sorted(agents, key=lambda agent: agent.rank)


def _fault(kind: str, victim: SoftswitchProcess, rng: random.Random) -> None:
    """Run in its own thread, at a random point of the trial's calls."""
    time.sleep(rng.uniform(0.0, 0.3))
    if kind.endswith("kill"):
        victim.restart(crash=True)  # -9, then the same addresses again, empty
    elif kind.endswith("stall"):
        os.kill(victim.proc.pid, signal.SIGSTOP)
        time.sleep(rng.uniform(0.1, 2.0))
        os.kill(victim.proc.pid, signal.SIGCONT)


def _trial(stack: _Stack, seed: int) -> tuple[str, list[str]]:
    """One trial: its fault kind and every worker's outcome of every call."""
    rng = random.Random(seed)
    kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
    world, calls = rng.choice((2, 4)), rng.randint(1, 3)
    plan = [(rng.choice(MODES), rng.choice((200, 3000, 20000)), rng.choice((torch.float32, torch.int32)),
             rng.choice(("a", "b"))) for _ in range(calls)]
    inputs = [[_input(rng, rank, n, dtype) for rank in range(world)] for _, n, dtype, _ in plan]
    stack.jobs += 1
    job = f"fabric-fault-{seed}-{stack.jobs}"
    stack.controller.client.create_job(job, workers=world)
    agents = _join(stack, job, world)
    fault_call = rng.randrange(calls)
    victim = stack.victim(kind, rng)
    outcomes: dict[int, list[str]] = {agent.rank: [] for agent in agents}
    faults: list[threading.Thread] = []

    def member(agent: Agent) -> None:
        for call, (mode, _, _, key) in enumerate(plan):
            if agent.rank == 0 and call == fault_call and kind != "none":
                fault = threading.Thread(target=_fault, args=(kind, victim, rng), daemon=True)
                faults.append(fault)
                fault.start()
            try:
                total = agent.allreduce(inputs[call][agent.rank], mode=mode, key=key).total
            except AggregationError:
                outcomes[agent.rank].append("error")
                continue
            except Exception as exc:
                outcomes[agent.rank].append(f"raised {exc!r}")
                continue
            exact = torch.stack([x.double() for x in inputs[call]]).sum(0)
            outcomes[agent.rank].append("exact" if torch.equal(total.double(), exact) else "WRONG")

    threads = [threading.Thread(target=member, args=(agent,), daemon=True) for agent in agents]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + calls * (2 * 2 * TIMEOUT_S + 2.0) + 10.0
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    hung = [agent.rank for agent, thread in zip(agents, threads, strict=True) if thread.is_alive()]
    for fault in faults:  # a fault that lands after the calls ended must land before the stack heals
        fault.join(timeout=60)
    for agent in agents:
        agent.close()
    stack.heal()
    with contextlib.suppress(Exception):
        stack.controller.client.delete_job(job)
    said = [f"rank {rank} hung" for rank in hung]
    for rank, results in outcomes.items():
        said += [f"rank {rank} call {call}: {result}" for call, result in enumerate(results)]
    return kind, said


def test_a_leaf_or_the_spine_failing_leaves_every_worker_exact_or_with_a_clear_error(stack: _Stack) -> None:
    tally: Counter[str] = Counter()
    exact_trials = 0
    for seed in range(TRIALS):
        kind, said = _trial(stack, seed)
        bad = [line for line in said if "hung" in line or "WRONG" in line or "raised" in line]
        assert not bad, f"trial {seed} ({kind}): {bad}"
        tally.update(f"{kind}:{line.rsplit(': ', 1)[1]}" for line in said)
        exact_trials += all(line.endswith("exact") for line in said)
    print(f"fabric faults, {TRIALS} trials: {dict(sorted(tally.items()))}, all exact in {exact_trials}")
    # Not vacuous: faults were injected, and some trials (the ones without a fault, most stalls) end exact.
    assert sum(n for key, n in tally.items() if not key.startswith("none")) > 0, tally
    assert exact_trials >= 1, tally
