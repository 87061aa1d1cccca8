"""Agents aggregate through a real softswitch process admitted by a real controller, exactly.

Each test creates a job on the controller, joins W agents (threads of this process, each with its own UDP
socket) and checks every worker's result bit for bit against the plain sum of the (quantized) inputs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from host_agent.agent import Agent
from host_agent.codec.cpu import kernels_in_use
from host_agent.errors import AggregationError
from host_agent.transport.channel import Impairment
from lhc_launch.processes import ControllerProcess, SoftswitchProcess
from tests.harness.agents import assert_exact, job_name, run_agents, sparse_inputs


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    state = tmp_path_factory.mktemp("controller")
    with SoftswitchProcess() as switch, ControllerProcess(switch, Path(state)) as controller:
        yield switch, controller


@pytest.mark.parametrize("world", [2, 4, 8])
def test_every_mode_is_exact(stack, world: int) -> None:
    _, controller = stack
    cases = [(mode, dtype, density) for mode in ("sketch", "union", "dense", "auto")
             for dtype in (torch.int32, torch.float32) for density in (0.01, 1.0)]
    inputs = {case: sparse_inputs(world, 3000, case[2], case[1], seed=i) for i, case in enumerate(cases)}

    def work(agent: Agent) -> list[object]:
        return [agent.allreduce(inputs[case][agent.rank], mode=case[0], key=case) for case in cases]

    per_rank = run_agents(controller, world, work)
    for i, case in enumerate(cases):
        assert_exact([results[i] for results in per_rank], inputs[case])


@pytest.mark.parametrize("loss", [0.01, 0.10])
def test_loss_and_duplication_both_ways_stay_exact(stack, loss: float) -> None:
    _, controller = stack
    inputs = sparse_inputs(4, 200_000, 0.02, torch.float32, seed=7)

    def work(agent: Agent) -> tuple[object, dict]:
        result = agent.allreduce(inputs[agent.rank], mode="sketch")
        return result, agent.backend.counters()

    per_rank = run_agents(controller, 4, work,
                          impairment=Impairment(loss=loss, duplicate=loss, seed=None))
    assert_exact([result for result, _ in per_rank], inputs)
    totals = {name: sum(counters[name] for _, counters in per_rank) for name in per_rank[0][1]}
    for name in ("dropped_out", "dropped_in", "duplicated_out", "duplicated_in", "retransmissions"):
        assert totals[name] > 0, f"the impairment did not happen: {totals}"


def test_disagreeing_workers_fail_on_every_worker(stack) -> None:
    _, controller = stack

    def work(agent: Agent) -> object:
        length = 1000 if agent.rank == 0 else 1200
        return agent.allreduce(torch.ones(length, dtype=torch.int32), mode="dense")

    results = run_agents(controller, 2, work, timeout_s=5.0)
    for result in results:
        assert isinstance(result, AggregationError), result


def test_a_silent_worker_is_named(stack) -> None:
    """Rank 1 never sends: the others raise an AggregationError that names it, within the timeout."""
    _, controller = stack

    def work(agent: Agent) -> object:
        if agent.rank == 1:
            return "silent"
        return agent.allreduce(torch.ones(5000, dtype=torch.int32), mode="dense")

    results = run_agents(controller, 3, work, timeout_s=4.0,
                         create={"heartbeat_timeout_s": 60.0})
    for rank in (0, 2):
        error = results[rank]
        assert isinstance(error, AggregationError), error
        assert "no result for packet" in str(error)


def test_a_switch_restart_mid_bucket_ends_exact(stack) -> None:
    """The switch is killed (-9) once the workers hold part of the bucket's results, and comes back empty:
    the controller re-admits the job under a new epoch and the workers replay what was unfinished."""
    switch, controller = stack
    inputs = sparse_inputs(3, 400_000, 1.0, torch.int32, seed=3)
    running: list[Agent] = []

    def work(agent: Agent) -> object:
        running.append(agent)
        return agent.allreduce_async(inputs[agent.rank], mode="dense").result(timeout=240)

    def crash_mid_bucket() -> None:
        deadline = time.monotonic() + 120
        while not any(agent.backend.counters()["results"] >= 500 for agent in list(running)):
            assert time.monotonic() < deadline, "the bucket never started"
            time.sleep(0.001)
        switch.proc.kill()  # 6,250 packets per worker: most of the bucket is still to come
        switch.restart()

    restarter = threading.Thread(target=crash_mid_bucket)
    restarter.start()
    results = run_agents(controller, 3, work, timeout_s=60.0)
    restarter.join()
    assert_exact(results, inputs)
    assert all(r.stats["transport"]["epoch_changes"] > 0 for r in results)


@pytest.mark.slow
def test_lhc_agent_cli_aggregates_and_prints_stats(stack) -> None:
    _, controller = stack
    controller.client.create_job("cli-job", workers=2)
    argv = [sys.executable, "-m", "host_agent.cli", "--controller", controller.listen, "--job", "cli-job",
            "--length", "20000", "--density", "0.05", "--repeats", "2", "--json"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-2000:]
        calls = [json.loads(line) for line in out.splitlines()]
        assert [c["call"] for c in calls] == [0, 1]
        assert all(c["bytes_sent"] > 0 and c["mode"] in ("sketch", "union", "dense") for c in calls)
        assert all(c["codec_kernels"] == kernels_in_use("cpu") for c in calls)  # says what decoded


@pytest.mark.slow
def test_a_worker_killed_mid_bucket_is_named_by_the_others(stack) -> None:
    """kill -9 of one worker process while a large bucket is in flight: its heartbeats stop, the
    controller fails the job naming it, and every other worker raises an AggregationError with its rank."""
    _, controller = stack
    job = job_name()
    controller.client.create_job(job, workers=3, heartbeat_timeout_s=3.0)
    victim = subprocess.Popen(
        [sys.executable, "-m", "host_agent.cli", "--controller", controller.listen, "--job", job,
         "--length", "3000000", "--density", "1", "--mode", "dense", "--repeats", "50"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    results: dict[int, object] = {}
    started = threading.Event()

    def member() -> None:
        with Agent.join(controller.listen, job, timeout_s=60.0) as agent:
            started.set()
            try:
                for _ in range(50):
                    agent.allreduce(torch.ones(3_000_000), mode="dense")
                results[agent.rank] = "finished"
            except AggregationError as error:
                results[agent.rank] = error

    threads = [threading.Thread(target=member) for _ in range(2)]
    for thread in threads:
        thread.start()
    assert started.wait(timeout=60)
    threading.Event().wait(3.0)  # let the bucket get under way
    victim.kill()
    victim.wait(timeout=30)
    for thread in threads:
        thread.join(timeout=120)
    assert len(results) == 2, "a surviving worker hung"
    survivors = set(results)
    (killed,) = set(range(3)) - survivors
    for rank, error in results.items():
        assert isinstance(error, AggregationError), f"rank {rank}: {error!r}"
        assert killed in error.ranks, (killed, error.ranks, str(error))
        assert f"rank {killed}" in str(error), str(error)


def test_two_jobs_at_once_through_one_switch_are_exact_and_neither_starves(stack) -> None:
    """Two jobs of 2 workers share softswitch (disjoint slots, one switch process): both end every call
    exact, and their calls interleave: each job finishes a call while the other still has calls to go (a
    starved job would finish nothing until the other was done)."""
    _, controller = stack
    inputs = {job: sparse_inputs(2, 200_000, 0.05, torch.float32, seed=job) for job in (0, 1)}
    results: dict[int, list[object]] = {}
    finished: dict[int, list[float]] = {0: [], 1: []}
    both_joined = threading.Barrier(4)

    def job(index: int) -> None:
        def work(agent: Agent) -> list:
            both_joined.wait(timeout=60)
            done = []
            for mode in ("dense", "union", "sketch", "dense", "union", "sketch"):
                done.append(agent.allreduce(inputs[index][agent.rank], mode=mode, key=mode))
                finished[index].append(time.monotonic())
            return done

        results[index] = run_agents(controller, 2, work)

    threads = [threading.Thread(target=job, args=(index,)) for index in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    for index in (0, 1):
        for call in range(6):
            assert_exact([results[index][rank][call] for rank in range(2)], inputs[index])
    for index, other in ((0, 1), (1, 0)):
        assert min(finished[index]) < max(finished[other]), finished
