"""Agents run as threads of the test process against a real controller and switch, and the exact sums their
results are held to: what the switch-level tests (tests/test_agent_switch.py, test_tenant_isolation.py)
share."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

import numpy as np
import torch

from host_agent.agent import Agent
from host_agent.codec.quantize import dequantize, quantize
from lhc_launch.processes import ControllerProcess

_JOBS = itertools.count()


def job_name() -> str:
    """A job name no other test of this process used."""
    return f"job-{next(_JOBS)}"


def run_agents(controller: ControllerProcess, world: int, work: Callable[[Agent], object], *,
               create: dict | None = None, job: str | None = None, **join: object) -> list[object]:
    """Join ``world`` agents to a fresh job (named ``job``, or a new name) and run ``work`` on each in its
    own thread; the results (or raised exceptions) in rank order."""
    job = job or job_name()
    controller.client.create_job(job, workers=world, **(create or {}))
    results: dict[int, object] = {}
    agents: list[Agent] = []
    lock = threading.Lock()

    def member() -> None:
        agent = Agent.join(controller.listen, job, **join)
        with lock:
            agents.append(agent)
        try:
            results[agent.rank] = work(agent)
        except Exception as exc:  # the test inspects it
            results[agent.rank] = exc

    threads = [threading.Thread(target=member) for _ in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    for agent in agents:
        agent.close()
    assert sorted(results) == list(range(world)), "an agent never finished"
    return [results[rank] for rank in range(world)]


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
