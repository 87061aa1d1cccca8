"""A dead or hung switch is named (issue 42): on a fabric of two leaves and a spine (softswitch processes,
the controller), a leaf stopped with SIGSTOP is shown as not answering by `switch status` within a few
seconds, JobStatus does not wait on it, and every worker's error names the leaf; a leaf killed is named
the same way; a leaf that answers again gives its jobs a new epoch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from controller.session import COUNTER_READ_S, PROBE_PERIOD_S, PROBE_TIMEOUT_S
from lhc_launch.processes import ControllerProcess, FabricProcesses
from tests.harness.agents import join_agents

TIMEOUT_S = 3.0


def _errors(agents) -> list[str]:
    """Every worker's error for one call that cannot complete."""
    said: list[str] = []

    def call(agent) -> None:
        try:
            agent.allreduce(torch.ones(100))
            said.append("a result")
        except Exception as exc:
            said.append(str(exc))

    threads = [threading.Thread(target=call, args=(agent,)) for agent in agents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=4 * TIMEOUT_S + 10)
    return said


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory):
    state = tmp_path_factory.mktemp("named")
    with FabricProcesses(2, state) as fabric, ControllerProcess(fabric, state) as controller:
        controller.wait_for_switch()
        yield fabric, controller


def _job(fabric: FabricProcesses, controller: ControllerProcess, name: str) -> list:
    controller.client.create_job(name, workers=2)
    return join_agents(controller.listen, name, [fabric.host_ips[0], fabric.host_ips[1]], TIMEOUT_S,
                       heartbeat_s=0.2)


@pytest.mark.slow
def test_a_stopped_leaf_is_named_and_never_waited_on(fabric) -> None:
    fabric, controller = fabric
    agents = _job(fabric, controller, "stopped")
    bystanders = _job(fabric, controller, "bystander")  # joined and idle: its epoch shows the renewal
    before = controller.client.status("bystander").epoch
    leaf = fabric.leaves[0]
    os.kill(leaf.proc.pid, signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        deadline = stopped + PROBE_PERIOD_S + PROBE_TIMEOUT_S + 3.0
        while time.monotonic() < deadline:
            silent = [s for s in controller.client.switch_status().switches if "not answering" in s.state]
            if silent:
                break
            time.sleep(0.2)
        assert silent and not silent[0].connected and silent[0].address == leaf.grpc_addr, silent
        named = silent[0].name
        shown = subprocess.run([sys.executable, "-m", "controller.cli", "--controller", controller.listen,
                                "switch", "status"], capture_output=True, text=True, timeout=60)
        assert shown.returncode == 7 and "not answering" in shown.stdout, shown.stdout
        started = time.monotonic()
        info = controller.client.status("stopped")
        assert time.monotonic() - started < COUNTER_READ_S + 1.0  # the hung leaf's read is skipped
        assert named not in {row.switch for row in info.switch_counters} and not info.installed
        said = _errors(agents)
        assert len(said) == 2, said
        assert all(f"switch {named} does not answer the controller" in s for s in said), said
    finally:
        os.kill(leaf.proc.pid, signal.SIGCONT)
        for agent in agents:
            agent.close()
    try:  # it answers again: the jobs that span it get a new epoch, installed on every switch
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            info = controller.client.status("bystander")
            if info.installed and info.epoch != before:
                break
            time.sleep(0.2)
        assert info.installed and info.epoch != before and info.epoch_changes == 1, info
    finally:
        for agent in bystanders:
            agent.close()


@pytest.mark.slow
def test_a_killed_leaf_is_named_in_every_workers_error(fabric) -> None:
    fabric, controller = fabric
    agents = _job(fabric, controller, "killed")
    leaf = fabric.leaves[1]
    try:
        leaf.kill()
        said = _errors(agents)
    finally:
        for agent in agents:
            agent.close()
        leaf.restart(crash=True)
        controller.wait_for_switch()
    named = [s.name for s in controller.client.switch_status().switches if s.address == leaf.grpc_addr]
    assert len(said) == 2, said
    assert all(f"switch {named[0]} does not answer the controller" in s for s in said), said
