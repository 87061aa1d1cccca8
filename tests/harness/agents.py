"""Agents run as threads of the test process (against a real controller and switch, or over the in-process
backend), and the exact sums their results are held to."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from host_agent.agent import Agent
from host_agent.codec.quantize import dequantize, quantize
from lhc_launch.processes import ControllerProcess
from tests.harness.local_backend import LocalGroup

_JOBS = itertools.count()


def job_name() -> str:
    """A job name no other test of this process used."""
    return f"job-{next(_JOBS)}"


def run_threads(world: int, open_agent: Callable[[int], Agent], work: Callable[[Agent], object], *,
                timeout_s: float = 300) -> list[object]:
    """Open agent ``i`` with ``open_agent(i)`` and run ``work`` on it, each on its own thread; the results
    (or raised exceptions) in rank order, every agent closed."""
    results: dict[int, object] = {}
    agents: list[Agent] = []
    lock = threading.Lock()

    def member(i: int) -> None:
        agent = open_agent(i)
        with lock:
            agents.append(agent)
        try:
            results[agent.rank] = work(agent)
        except Exception as exc:  # the test inspects it
            results[agent.rank] = exc

    threads = [threading.Thread(target=member, args=(i,)) for i in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout_s)
    for agent in agents:
        agent.close()
    assert sorted(results) == list(range(world)), "an agent never finished"
    return [results[rank] for rank in range(world)]


def run_agents(controller: ControllerProcess, world: int, work: Callable[[Agent], object], *,
               create: dict | None = None, job: str | None = None, **join: object) -> list[object]:
    """Join ``world`` agents to a fresh job (named ``job``, or a new name) through the controller and run
    ``work`` on each in its own thread (``run_threads``)."""
    job = job or job_name()
    controller.client.create_job(job, workers=world, **(create or {}))
    return run_threads(world, lambda _: Agent.join(controller.listen, job, **join), work)


def join_agents(controller: str, job: str, ips: Sequence[str], timeout_s: float, **join: Any) -> list[Agent]:
    """One agent per entry of ``ips`` (the address it binds) joins ``job`` (at once: each waits for the
    job's install); by rank. Where one cannot join, the others are closed and the test fails."""
    agents: list[Agent] = []
    lock = threading.Lock()

    def member(ip: str) -> None:
        agent = Agent.join(controller, job, ip=ip, timeout_s=timeout_s, **join)
        with lock:
            agents.append(agent)

    threads = [threading.Thread(target=member, args=(ip,)) for ip in ips]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if len(agents) != len(ips):
        for agent in agents:
            agent.close()
        raise AssertionError(f"{len(ips) - len(agents)} worker(s) could not join")
    return sorted(agents, key=lambda agent: agent.rank)


def run_local(world: int, work: Callable[[Agent], object]) -> list[object]:
    """``world`` agents over the in-process backend, ``work`` on each in its own thread (``run_threads``)."""
    members = LocalGroup(world).members()
    return run_threads(world, lambda i: Agent(members[i]), work, timeout_s=120)


def sparse_inputs(world: int, n: int, density: float, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(world):
        x = np.zeros(n, np.float64)
        hit = rng.choice(n, max(1, int(n * density)), replace=False)
        integers = dtype == torch.int32
        x[hit] = rng.integers(-(2**20), 2**20, hit.size) if integers else rng.normal(0, 1e-2, hit.size)
        out.append(torch.from_numpy(x).to(dtype))
    return out


def expected_total(inputs: list[torch.Tensor], scale: int | None) -> torch.Tensor:
    """The plain sum of the inputs, quantized at the agreed scale when they are floats."""
    if scale is None:
        return torch.stack(inputs).sum(0, dtype=torch.int64).to(torch.int32)
    total = torch.stack([quantize(x, scale) for x in inputs]).sum(0, dtype=torch.int64).to(torch.int32)
    return dequantize(total, scale, inputs[0].dtype)


def assert_exact(results: list[object], inputs: list[torch.Tensor]) -> None:
    for rank, result in enumerate(results):
        assert not isinstance(result, Exception), f"rank {rank}: {result!r}"
        scale = result.stats["codec"].get("scale")
        assert torch.equal(result.total, expected_total(inputs, scale)), f"rank {rank} is not exact"
