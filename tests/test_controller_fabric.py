"""The controller drives a leaf/spine fabric (issue 31): one P4Runtime session per switch, each switch
holding exactly its share of the jobs that span it, one slot range and epoch on all of them, workers
placed by their host, refusals for workers the topology cannot reach, ``switch status`` per switch, and a
switch that comes back empty re-admitting its jobs under a fresh epoch everywhere.

Real processes: three softswitch processes on loopback UDP and ``lhc-controller serve`` with its SQLite
store on disk; agents in this process aggregate through them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch

from controller.admission import check_hosts, check_job_request, resolve_member
from controller.reconcile import desired_state
from controller.records import MemberRecord
from controller.server import stored_topology
from controller.spans import check_reach
from controller.store import DB_NAME, JobStore
from controller.topology import load_topology, parse_topology
from host_agent.agent import Agent
from lhc_ina import jobs as lj
from lhc_ina.jobs import ip_to_int
from lhc_launch.processes import ControllerProcess, FabricProcesses
from tests.harness.agents import job_name, join_agents
from tests.harness.controller import refused, switch_state

REPO = Path(__file__).resolve().parent.parent
LEAF_MAC, SPINE_MAC = "02:00:00:00:01:fe", "02:00:00:00:00:fd"
FABRIC = {
    "switches": [
        {"name": "leafA", "role": "leaf", "p4runtime": "127.0.0.1:1", "ip": "10.0.1.254", "mac": LEAF_MAC},
        {"name": "leafB", "role": "leaf", "p4runtime": "127.0.0.1:2", "ip": "10.0.2.254",
         "mac": "02:00:00:00:02:fe"},
        {"name": "spine", "role": "spine", "p4runtime": "127.0.0.1:3", "ip": "10.0.0.253", "mac": SPINE_MAC},
    ],
    "links": [{"leaf": "leafA", "leaf_port": 5, "spine_port": 1}],
    "hosts": [
        {"name": "a1", "switch": "leafA", "ip": "10.0.1.1", "mac": "02:00:00:00:01:01", "port": 1},
        {"name": "b1", "switch": "leafB", "ip": "10.0.2.1", "mac": "02:00:00:00:02:01", "port": 1},
    ],
}


# -- the topology, alone --
def test_a_fabric_topology_routes_each_host_down_its_leaf_and_up_elsewhere() -> None:
    topology = parse_topology(FABRIC)
    assert topology.fabric and topology.spine.name == "spine" and set(topology.links) == {"leafA"}

    def route(switch: str, host_ip: str) -> dict:
        entry = next(e for e in topology.forwarding_entries(switch)
                     if e.table == "LhcIngress.ipv4_routes" and e.match[0][1][0] == ip_to_int(host_ip))
        return dict(entry.params)

    assert route("leafA", "10.0.1.1")["port"] == 1  # its own host: its port
    assert route("leafA", "10.0.2.1") == {"port": 5, "src_mac": lj.mac_to_int(LEAF_MAC),
                                          "dst_mac": lj.mac_to_int(SPINE_MAC)}  # another leaf's: up the link
    assert route("spine", "10.0.1.1") == {"port": 1, "src_mac": lj.mac_to_int(SPINE_MAC),
                                          "dst_mac": lj.mac_to_int(LEAF_MAC)}  # down to the host's leaf
    # leafB has no link: the spine cannot route to it, and leafB reaches its own host only.
    assert all(dict(e.match).get("hdr.ipv4.dst_addr", (0,))[0] != ip_to_int("10.0.2.1")
               for e in topology.forwarding_entries("spine"))
    assert len(topology.forwarding_entries("leafB")) == 2


@pytest.mark.parametrize(("change", "words"), [
    (lambda t: t["switches"].append({**t["switches"][2], "name": "spine2", "p4runtime": "127.0.0.1:4",
                                     "ip": "10.0.0.252"}), "one spine at most"),
    (lambda t: t["links"].append({"leaf": "spine", "leaf_port": 1, "spine_port": 2}), "not a leaf"),
    (lambda t: t["hosts"][0].update(switch="spine"), "not a leaf of the topology"),
    (lambda t: t["hosts"][0].pop("switch"), "no 'switch'"),
    (lambda t: t["switches"][0].pop("p4runtime"), "no 'p4runtime'"),
    (lambda t: t["switches"][1].update(ip="10.0.1.254"), "is also switch leafA's"),
    (lambda t: t["links"].append({"leaf": "leafA", "leaf_port": 6, "spine_port": 2}), "one uplink per leaf"),
    (lambda t: t["switches"][2].update(udp_port=80), "lhc port range"),
])
def test_a_broken_fabric_topology_is_refused_naming_the_fault(change, words: str) -> None:
    data = json.loads(json.dumps(FABRIC))
    change(data)
    refused(lambda: parse_topology(data), grpc.StatusCode.INVALID_ARGUMENT, words)


def test_admission_refuses_workers_the_topology_cannot_reach_together() -> None:
    topology = parse_topology(FABRIC)
    assert check_hosts("ok", 1, ["b1"], topology) == ("b1",)  # one leaf: no link needed
    refused(lambda: check_hosts("j", 2, ["a1", "b1"], topology), grpc.StatusCode.INVALID_ARGUMENT,
            "job 'j'", "['leafB'] have no link to spine 'spine'", "cannot reach")
    refused(lambda: resolve_member("w", "", "10.9.9.9", 40000, "", -1, topology, None),
            grpc.StatusCode.INVALID_ARGUMENT, "10.9.9.9:40000 is no host of the topology", "a1 10.0.1.1")
    member = resolve_member("w", "", "10.0.2.1", 40000, "", -1, topology, None)  # placed by its address
    assert (member.switch, member.switch_port, member.mac) == ("leafB", 1, "02:00:00:00:02:01")


def test_more_than_32_workers_under_one_leaf_or_on_one_switch_are_refused_saying_why() -> None:
    topology = parse_topology(FABRIC)
    under = [MemberRecord(r, f"w{r}", "10.0.1.1", 40000 + r, "02:00:00:00:01:01", 1, switch="leafA")
             for r in range(33)]
    refused(lambda: check_reach("j", under, topology), grpc.StatusCode.INVALID_ARGUMENT,
            "{'leafA': 33} workers under one switch", "1..32", "one bit each")
    check_reach("j", under[:32], topology)
    refused(lambda: check_job_request("j", 33, 0, 0, None), grpc.StatusCode.INVALID_ARGUMENT,
            "33 workers on one switch", "leaf/spine")
    assert check_job_request("j", 1024, 0, 0, topology) == (64, 64)
    refused(lambda: check_job_request("j", 1025, 0, 0, topology), grpc.StatusCode.INVALID_ARGUMENT,
            "1025 workers; a job has 1..1024")


def test_the_store_keeps_the_topology_for_a_start_without_one(tmp_path: Path) -> None:
    path = tmp_path / "fabric.json"
    path.write_text(json.dumps(FABRIC))
    store = JobStore(tmp_path / DB_NAME)
    try:
        assert stored_topology(None, store) is None
        given = stored_topology(path, store)
    finally:
        store.close()
    reopened = JobStore(tmp_path / DB_NAME)
    try:
        assert stored_topology(None, reopened) == given == load_topology(path)
    finally:
        reopened.close()


# -- against real switches --
class _Fabric:
    def __init__(self, fabric: FabricProcesses, controller: ControllerProcess, state: Path) -> None:
        self.fabric, self.controller, self.state = fabric, controller, state

    def desired(self, switch: str):
        store = JobStore(self.state / DB_NAME)
        try:
            return desired_state(store.jobs(), load_topology(self.fabric.topology_path), switch)
        finally:
            store.close()

    def assert_switches_equal_the_store(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            differ = [n for n, p in self.fabric.switches.items() if switch_state(p) != self.desired(n)]
            if not differ or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert not differ, f"switches {differ} differ from the store"


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Fabric]:
    state = tmp_path_factory.mktemp("fabric")
    with FabricProcesses(2, state) as processes, ControllerProcess(processes, state) as controller:
        controller.wait_for_switch()
        yield _Fabric(processes, controller, state)


def _dense_calls(agents: list[Agent], calls: int = 2) -> list[object]:
    """Each agent makes ``calls`` dense calls of int32 inputs; by rank: True (all exact) or the exception."""
    results: dict[int, object] = {}
    world = len(agents)

    def work(agent: Agent) -> None:
        try:
            for call in range(calls):
                x = torch.arange(5000, dtype=torch.int32) * (agent.rank + 1) + call
                total = agent.allreduce(x, mode="dense").total
                want = sum(torch.arange(5000, dtype=torch.int32) * (r + 1) + call for r in range(world))
                assert torch.equal(total, want), f"rank {agent.rank} call {call} is not exact"
            results[agent.rank] = True
        except Exception as exc:  # the test reports it
            results[agent.rank] = exc

    threads = [threading.Thread(target=work, args=(agent,)) for agent in agents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return [results.get(rank, "hung") for rank in range(world)]


def test_switch_status_shows_each_switch(fabric: _Fabric) -> None:
    out = subprocess.run([sys.executable, "-m", "controller.cli", "--controller", fabric.controller.listen,
                          "switch", "status"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "fabric of 3 switches: every one primary" in out.stdout
    for name, process in fabric.fabric.switches.items():
        row = next(line for line in out.stdout.splitlines() if line.startswith(name + " "))
        assert process.grpc_addr in row and f"{process.host}:{process.udp_port}" in row, row
        assert ("spine" if name == "spine" else "leaf") in row.split()[1]
    status = fabric.controller.client.switch_status()
    assert [(s.name, s.connected, s.primary) for s in status.switches] == [
        ("spine", True, True), ("leaf0", True, True), ("leaf1", True, True)]


def test_a_job_across_two_leaves_is_exact_with_one_range_and_epoch_on_every_switch(fabric: _Fabric) -> None:
    ips = fabric.fabric.host_ips
    job = job_name()
    info = fabric.controller.client.create_job(job, workers=4, slots=16)
    agents = join_agents(fabric.controller.listen, job, [ips[0], ips[1], ips[1], ips[0]], 2.0)
    try:
        assert _dense_calls(agents) == [True] * 4
        shown = fabric.controller.client.status(job)
        # the leaves in the order of their lowest rank (the joins race), then the spine
        assert sorted(shown.switches[:2]) == ["leaf0", "leaf1"] and shown.switches[2] == "spine"
        assert shown.installed
        leaf_of = {ips[0]: "leaf0", ips[1]: "leaf1"}
        assert all(m.switch == leaf_of[m.address.ip] for m in shown.members)
        counters = {c.switch: dict(c.counters) for c in shown.switch_counters}
        # one partial per leaf and round went up, and the spine made one result per round
        assert counters["leaf0"]["UP"] == counters["leaf1"]["UP"] == counters["spine"]["RESULT"] > 0
        params = {}
        for name, process in fabric.fabric.switches.items():
            entry = next(e for e in switch_state(process).tables if e.table == lj.JOBS_TABLE
                         and dict(e.match)["hdr.lhc.job_id"] == info.job_id)
            params[name] = dict(entry.params)
        assert {(p["slot_base"], p["slot_count"], p["epoch"]) for p in params.values()} == {
            (shown.slot_base, shown.slot_count, shown.epoch)}
        assert [params[n]["fan_in"] for n in ("leaf0", "leaf1", "spine")] == [3, 3, 2]  # 2 workers + parent
        fabric.assert_switches_equal_the_store()
    finally:
        for agent in agents:
            agent.close()


def test_a_job_under_one_leaf_lives_on_that_leaf_only(fabric: _Fabric) -> None:
    job = job_name()
    info = fabric.controller.client.create_job(job, workers=2, slots=8)
    agents = join_agents(fabric.controller.listen, job, [fabric.fabric.host_ips[1]] * 2, 2.0)
    try:
        assert list(fabric.controller.client.status(job).switches) == ["leaf1"]
        holding = [n for n, p in fabric.fabric.switches.items() if info.job_id in switch_state(p).job_ids()]
        assert holding == ["leaf1"]
        assert _dense_calls(agents, calls=1) == [True, True]
    finally:
        for agent in agents:
            agent.close()


def test_workers_the_topology_does_not_place_are_refused(fabric: _Fabric) -> None:
    job = job_name()
    fabric.controller.client.create_job(job, workers=2)
    refused(lambda: fabric.controller.client.join(job, ip="127.0.0.1", udp_port=40000),
            grpc.StatusCode.INVALID_ARGUMENT, "127.0.0.1:40000 is no host of the topology", "h0")
    fabric.controller.client.delete_job(job)


def test_a_leaf_back_empty_gets_its_jobs_a_fresh_epoch_on_every_switch(fabric: _Fabric) -> None:
    job = job_name()
    fabric.controller.client.create_job(job, workers=2, slots=8)
    agents = join_agents(fabric.controller.listen, job, fabric.fabric.host_ips, 2.0)
    try:
        assert _dense_calls(agents, calls=1) == [True, True]
        before = fabric.controller.client.status(job).epoch
        fabric.fabric.leaves[0].restart(crash=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            shown = fabric.controller.client.status(job)
            if shown.epoch != before and shown.installed:
                break
            time.sleep(0.1)
        assert shown.epoch != before and shown.installed and shown.epoch_changes >= 1, shown
        fabric.assert_switches_equal_the_store()  # the spine and the other leaf carry the new epoch too
        assert _dense_calls(agents, calls=2) == [True, True]
    finally:
        for agent in agents:
            agent.close()


def test_a_job_larger_than_one_bitmap_is_exact_in_every_mode(fabric: _Fabric) -> None:
    """40 workers, 20 under each leaf (issue 41): each leaf's bitmap holds its own workers by their rank
    within it, the spine's the two leaves, and every worker checks its results against the join's mask of
    leaves. Real processes, real controller; the agents are threads of this process."""
    ips = fabric.fabric.host_ips
    world = 40
    job = job_name()
    fabric.controller.client.create_job(job, workers=world, slots=8)
    agents = join_agents(fabric.controller.listen, job, [ips[r % 2] for r in range(world)], 10.0)
    results: dict[int, object] = {}

    def work(agent: Agent) -> None:
        try:
            for mode in ("dense", "sketch", "union"):
                x = torch.zeros(700, dtype=torch.int32)
                x[agent.rank * 17 % 700] = agent.rank + 1
                x[3] = 2**20 - agent.rank
                want = torch.zeros(700, dtype=torch.int64)
                for r in range(world):
                    want[r * 17 % 700] += r + 1
                want[3] = sum(2**20 - r for r in range(world))
                total = agent.allreduce(x, mode=mode).total
                assert torch.equal(total.to(torch.int64), want), f"rank {agent.rank} {mode} is not exact"
            results[agent.rank] = True
        except Exception as exc:  # the test reports it
            results[agent.rank] = exc

    def counted() -> dict[str, dict[str, int]]:
        return {c.switch: dict(c.counters) for c in fabric.controller.client.status(job).switch_counters}

    try:
        before = counted()  # a counter row may carry an earlier job's counts (a leaf restarted, a row reused)
        threads = [threading.Thread(target=work, args=(agent,)) for agent in agents]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert [results.get(r, "hung") for r in range(world)] == [True] * world
        shown = fabric.controller.client.status(job)
        assert shown.result_mask == 0b11 and shown.switches[2] == "spine"
        for leaf in ("leaf0", "leaf1"):  # each leaf numbers its 20 workers 0..19 on the wire
            assert sorted(m.worker_id for m in shown.members if m.switch == leaf) == list(range(20))
        after = counted()
        ups = [after[leaf]["UP"] - before[leaf]["UP"] for leaf in ("leaf0", "leaf1")]
        assert ups[0] == ups[1] == after["spine"]["RESULT"] - before["spine"]["RESULT"] > 0, (before, after)
    finally:
        for agent in agents:
            agent.close()
