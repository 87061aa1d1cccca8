"""Reconcile against a real lhc-softswitch: a restarted controller writes nothing to a switch that kept its
state (a half-finished round survives it), a switch restarted empty is repopulated with new epochs, and
what someone else changed on the switch is put back."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import numpy as np
import pytest
from p4.v1 import p4runtime_pb2 as p4v1

from controller.targets import load_target
from lhc_ina import constants as c
from lhc_ina.p4rt import P4RuntimeClient
from lhc_launch.processes import ControllerProcess, SoftswitchProcess
from tests.harness.controller import Worker, aggregate_once, store_state, switch_state

RNG = np.random.default_rng(7)


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    made = [Worker() for _ in range(2)]
    yield made
    for w in made:
        w.close()


def _admit(ctl: ControllerProcess, workers: list[Worker], name: str = "job") -> None:
    ctl.client.create_job(name, workers=len(workers), slots=4)
    for w in workers:
        w.joined = ctl.client.join(name, ip="127.0.0.1", udp_port=w.port)
    assert ctl.client.status(name).installed


@pytest.mark.timeout(180)
def test_restart_against_an_intact_switch_writes_nothing(switch, workers, tmp_path):
    with ControllerProcess(switch, tmp_path) as ctl:
        ctl.wait_for_switch()
        _admit(ctl, workers)
        before = switch_state(switch)
        # Half a round: rank 0 contributes, then the controller goes away and comes back.
        half = RNG.integers(0, 1 << 32, c.LANES, dtype=np.uint64).astype(np.uint32)
        if switch.moves_udp:
            aggregate_once(workers, slot=0, seq=0, rng=RNG)
            workers[0].send(half, slot=1, seq=1)
    with ControllerProcess(switch, tmp_path) as ctl:
        ctl.wait_for_switch()
        status = ctl.client.switch_status()
        assert status.updates_written == 0, status
        assert "cookie matches" in ctl.log() and "new epochs" not in ctl.log()
        assert switch_state(switch) == before == store_state(tmp_path)
        job = ctl.client.status("job")
        assert job.installed and job.epoch == workers[0].joined.epoch and job.epoch_changes == 0
        if not switch.moves_udp:
            return
        # The switch kept the half round: rank 1 completes it.
        other = RNG.integers(0, 1 << 32, c.LANES, dtype=np.uint64).astype(np.uint32)
        workers[1].send(other, slot=1, seq=1)
        expected = ((half.astype(np.uint64) + other) % (1 << 32)).astype(np.uint32)
        for w in workers:
            header, words = w.receive()
            assert (header.msg_type, header.seq, header.bitmap) == (c.MsgType.RESULT, 1, 0b11)
            np.testing.assert_array_equal(words, expected)


@pytest.mark.timeout(180)
def test_switch_restarted_empty_is_repopulated_with_new_epochs(switch, workers, tmp_path):
    with ControllerProcess(switch, tmp_path, "--reconcile-interval", "1") as ctl:
        ctl.wait_for_switch()
        _admit(ctl, workers)
        old_epoch = workers[0].joined.epoch
        updates_before = ctl.client.switch_status().updates_written
        watch = ctl.client.watch("job", timeout=120)
        assert next(watch).epoch == old_epoch

        switch.restart()
        changed = next(info for info in watch if info.epoch != old_epoch and info.installed)
        assert changed.epoch_changes == 1 and ctl.log().count("switch had no pipeline: pushed it") == 2
        assert switch_state(switch) == store_state(tmp_path)
        assert ctl.client.switch_status().updates_written > updates_before
        if not switch.moves_udp:
            return
        # Workers learn the new epoch (here from the status) and aggregate again; the old one is stale.
        for w in workers:
            w.joined = dataclasses.replace(w.joined, epoch=changed.epoch)
        aggregate_once(workers, slot=0, seq=5, rng=RNG)
        workers[0].send(np.zeros(c.LANES, np.uint32), slot=1, seq=6, epoch=old_epoch)
        deadline = time.monotonic() + 10  # the switch counts the drop once it has read the datagram
        while (stale := ctl.client.status("job").counters["DROP_STALE_EPOCH"]) == 0 and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert stale == 1


@pytest.mark.timeout(180)
def test_changes_made_while_the_controller_was_away_are_undone(switch, workers, tmp_path):
    with ControllerProcess(switch, tmp_path) as ctl:
        ctl.wait_for_switch()
        _admit(ctl, workers)
        want = switch_state(switch)
    # With no controller connected, someone deletes a worker entry and adds a stray route (a write
    # without an election id, the only kind a switch takes while no stream is open).
    target = load_target("softswitch")
    intruder = P4RuntimeClient(switch.grpc_addr, p4info=target.p4info)
    intruder.connect(arbitrate=False)
    worker_entry = intruder.read_table("LhcIngress.workers")[0]
    route = intruder.entities.table_entry(
        "LhcIngress.ipv4_routes",
        {"hdr.ipv4.dst_addr": "10.9.9.9/32"},
        "LhcIngress.route",
        {"port": 3, "src_mac": 1, "dst_mac": 2},
    )
    updates = [
        p4v1.Update(type=p4v1.Update.DELETE, entity=p4v1.Entity(table_entry=worker_entry)),
        p4v1.Update(type=p4v1.Update.INSERT, entity=p4v1.Entity(table_entry=route)),
    ]
    intruder.stub.Write(p4v1.WriteRequest(device_id=1, updates=updates))
    intruder.close()
    assert switch_state(switch) != want
    with ControllerProcess(switch, tmp_path) as ctl:
        ctl.wait_for_switch()
        assert ctl.client.switch_status().updates_written == 2  # exactly the difference
        assert switch_state(switch) == want == store_state(tmp_path)
        if switch.moves_udp:
            aggregate_once(workers, slot=2, seq=2, rng=RNG)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_controller_outlives_an_absent_switch_and_installs_when_it_comes(workers, tmp_path):
    with SoftswitchProcess() as switch:
        switch.terminate()  # its address is known, nothing listens there
        with ControllerProcess(switch, tmp_path) as ctl:
            _admit_without_switch(ctl, workers)
            assert not ctl.client.status("job").installed
            deadline = time.monotonic() + 60
            while "unreachable" not in ctl.client.switch_status().state and time.monotonic() < deadline:
                time.sleep(0.1)
            status = ctl.client.switch_status()
            assert not status.connected and "unreachable" in status.state and ctl.running()
            switch.restart()
            installed = next(i for i in ctl.client.watch("job", timeout=120) if i.installed)
            assert switch_state(switch) == store_state(tmp_path)
            # A switch found without a pipeline gives active jobs a new epoch: agents take it from the job.
            for w in workers:
                w.joined = dataclasses.replace(w.joined, epoch=installed.epoch)
            aggregate_once(workers, slot=0, seq=0, rng=RNG)


def _admit_without_switch(ctl: ControllerProcess, workers: list[Worker]) -> None:
    ctl.client.create_job("job", workers=len(workers), slots=4)
    for w in workers:
        w.joined = ctl.client.join("job", ip="127.0.0.1", udp_port=w.port)
