"""What the seeded fault trials share (tests/test_fault_injection.py over one switch,
tests/test_fabric_faults.py over a leaf/spine fabric): a trial's random calls and inputs, the calls run
with a hook before each (where a fault is injected), and every live worker's outcome of every call
judged."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from host_agent.agent import Agent
from host_agent.errors import AggregationError
from lhc_launch.processes import ControllerProcess, FabricProcesses, SoftswitchProcess

MODES = ("dense", "sketch", "union", "auto")


class TrialStack:
    """The switch (or fabric) and the controller every trial runs against, healed after each trial: a
    stopped process continued, a killed controller started again, the switches reconciled."""

    def __init__(self, switch: SoftswitchProcess | FabricProcesses, state: Path) -> None:
        self.switch, self.state, self.jobs = switch, state, 0
        self.faults: list[threading.Thread] = []
        try:
            self.controller = ControllerProcess(switch, state)
            self.controller.wait_for_switch()
        except BaseException:
            switch.terminate()
            raise

    def heal(self) -> None:
        fabric = isinstance(self.switch, FabricProcesses)
        switches = self.switch.switches.values() if fabric else [self.switch]
        for process in (*switches, self.controller):
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.proc.pid, signal.SIGCONT)
        if not self.controller.running():
            self.controller = ControllerProcess(self.switch, self.state)
        self.controller.wait_for_switch()

    def open_job(self, name: str, world: int) -> str:
        """A fresh job of ``world`` workers for one trial (``name`` and a running count, as names must
        differ even when a seed runs twice)."""
        self.jobs += 1
        job = f"{name}-{self.jobs}"
        self.controller.client.create_job(job, workers=world)
        return job

    def start_fault(self, fault: Callable[..., None], *args: object) -> None:
        """Run ``fault(*args)`` on its own thread, so that it lands while the trial's calls go on."""
        thread = threading.Thread(target=fault, args=args, daemon=True)
        self.faults.append(thread)
        thread.start()

    def end_trial(self, job: str, agents: list[Agent]) -> None:
        """After a trial's calls: its faults landed (one that lands after the calls ended must land before
        the stack heals), its agents closed, the stack healed and the job deleted."""
        for fault in self.faults:
            fault.join(timeout=60)
        self.faults.clear()
        for agent in agents:
            agent.close()
        self.heal()
        with contextlib.suppress(Exception):
            self.controller.client.delete_job(job)

    def close(self) -> None:
        self.heal()
        self.controller.terminate()
        self.switch.terminate()


@dataclass
class Trial:
    """One trial's draw: its fault kind, its workers and its calls (mode, length, dtype, key) with every
    rank's input, and the generator the rest of the trial draws from."""

    seed: int
    rng: random.Random
    kind: str
    world: int
    plan: list[tuple[str, int, torch.dtype, str]]
    inputs: list[list[torch.Tensor]]

    @property
    def calls(self) -> int:
        return len(self.plan)


def _input(rng: random.Random, rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(rng.randrange(2**31) + rank)
    x = torch.zeros(n)
    hit = torch.randperm(n, generator=generator)[: max(1, n // rng.choice((100, 20, 2)))]
    x[hit] = torch.randint(-40, 41, (hit.numel(),), generator=generator).float()
    return x.to(dtype)


def draw_trial(seed: int, kinds: dict[str, int], worlds: Sequence[int]) -> Trial:
    """A fault kind by its weight in ``kinds``, a world from ``worlds`` and 1-3 calls of random modes,
    sizes, dtypes and keys."""
    rng = random.Random(seed)
    kind = rng.choices(list(kinds), weights=list(kinds.values()))[0]
    world, calls = rng.choice(tuple(worlds)), rng.randint(1, 3)
    plan = [(rng.choice(MODES), rng.choice((200, 3000, 20000)), rng.choice((torch.float32, torch.int32)),
             rng.choice(("a", "b"))) for _ in range(calls)]
    inputs = [[_input(rng, rank, n, dtype) for rank in range(world)] for _, n, dtype, _ in plan]
    return Trial(seed, rng, kind, world, plan, inputs)


def run_calls(trial: Trial, agents: list[Agent], before: Callable[[Agent, int], None],
              timeout_s: float) -> tuple[dict[int, list[str]], list[int]]:
    """Every agent makes the trial's calls on its own thread, ``before(agent, call)`` ahead of each (where
    a fault is injected); each call's outcome (exact, error, WRONG, raised) by rank, and the ranks still
    running when the calls' deadline passed."""
    outcomes: dict[int, list[str]] = {agent.rank: [] for agent in agents}

    def member(agent: Agent) -> None:
        for call, (mode, _, _, key) in enumerate(trial.plan):
            before(agent, call)
            try:
                total = agent.allreduce(trial.inputs[call][agent.rank], mode=mode, key=key).total
            except AggregationError:
                outcomes[agent.rank].append("error")
                continue
            except Exception as exc:
                outcomes[agent.rank].append(f"raised {exc!r}")
                continue
            exact = torch.stack([x.double() for x in trial.inputs[call]]).sum(0)
            outcomes[agent.rank].append("exact" if torch.equal(total.double(), exact) else "WRONG")

    threads = [threading.Thread(target=member, args=(agent,), daemon=True) for agent in agents]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + trial.calls * (2 * 2 * timeout_s + 2.0) + 10.0
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    hung = [agent.rank for agent, thread in zip(agents, threads, strict=True) if thread.is_alive()]
    return outcomes, hung


def said(outcomes: dict[int, list[str]], hung: list[int], dead: Collection[int] = ()) -> list[str]:
    """One line per hung rank and per call of every rank not in ``dead``."""
    lines = [f"rank {rank} hung" for rank in hung]
    for rank, results in outcomes.items():
        if rank not in dead:
            lines += [f"rank {rank} call {call}: {result}" for call, result in enumerate(results)]
    return lines


def check_trials(seeds: int | range, trial: Callable[[int], tuple[str, list[str]]],
                 name: str) -> tuple[Counter, int]:
    """Run ``trial(seed)`` for every seed (``range(seeds)`` for a count): no line may say hung, WRONG or
    raised (a failing trial names its seed); the tally of (kind, outcome) and the number of trials that
    ended exact everywhere."""
    seeds = range(seeds) if isinstance(seeds, int) else seeds
    tally: Counter[str] = Counter()
    exact_trials = 0
    for seed in seeds:
        kind, lines = trial(seed)
        bad = [line for line in lines if "hung" in line or "WRONG" in line or "raised" in line]
        assert not bad, f"trial {seed} ({kind}): {bad}"
        tally.update(f"{kind}:{line.rsplit(': ', 1)[1]}" for line in lines)
        exact_trials += all(line.endswith("exact") for line in lines)
    print(f"{name}, {len(seeds)} trials: {dict(sorted(tally.items()))}, all exact in {exact_trials}")
    return tally, exact_trials
