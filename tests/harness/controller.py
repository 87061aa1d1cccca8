"""Test helpers for the controller: the switch's state and the store's as comparable sets, simulated
workers that aggregate over UDP, a ready-made job record. The processes live in ``lhc_launch.processes``
and ``tests/harness/bmv2.py``.
"""

from __future__ import annotations

import socket
from pathlib import Path

import grpc
import numpy as np
import pytest

from controller.reconcile import SwitchState, desired_state, read_state
from controller.records import JobRecord, JobState, MemberRecord
from controller.store import DB_NAME, JobStore
from controller.targets import load_target
from controller.topology import load_topology
from lhc_ina import constants as c
from lhc_ina.jobservice.client import Joined
from lhc_ina.jobservice.errors import ControllerError
from lhc_ina.p4rt import P4RuntimeClient
from lhc_ina.wire import LhcHeader, pack_packet, unpack_packet
from lhc_launch.processes import SoftswitchProcess
from tests.harness.bmv2 import Bmv2Process


def switch_state(switch: SoftswitchProcess | Bmv2Process) -> SwitchState:
    """What the switch holds in the controller's tables and groups, read without taking part in the
    election (a read-only observer)."""
    target = load_target("softswitch")  # the v1model P4Info: the same for bmv2
    client = P4RuntimeClient(switch.grpc_addr, p4info=target.p4info)
    client.connect(arbitrate=False)
    try:
        return read_state(client, target)
    finally:
        client.close()


def store_state(state_dir: Path, topology: Path | None = None) -> SwitchState:
    """What the job store in ``state_dir`` (and the topology file) say the switch must hold."""
    store = JobStore(state_dir / DB_NAME)
    try:
        return desired_state(store.jobs(), load_topology(topology) if topology else None)
    finally:
        store.close()


class Worker:
    """One worker's UDP socket on loopback; sends DATA for its rank and reads RESULTs."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(10)
        self.port = self.sock.getsockname()[1]
        self.joined: Joined | None = None

    def send(self, words: np.ndarray, slot: int, seq: int, ver: int = 0, epoch: int | None = None) -> None:
        j = self.joined
        assert j is not None
        header = LhcHeader(
            msg_type=c.MsgType.DATA,
            op=c.Op.ADD,
            ver=ver,
            worker_id=j.rank,
            job_id=j.job_id,
            slot=slot,
            epoch=j.epoch if epoch is None else epoch,
            seq=seq,
        )
        self.sock.sendto(pack_packet(header, words), (j.switch_ip, j.switch_udp_port))

    def receive(self) -> tuple[LhcHeader, np.ndarray]:
        return unpack_packet(self.sock.recv(4096))

    def close(self) -> None:
        self.sock.close()


def aggregate_once(workers: list[Worker], slot: int, seq: int, rng: np.random.Generator) -> None:
    """One round through the switch; every worker must get the exact modular sum with a full bitmap."""
    values = [rng.integers(0, 1 << 32, c.LANES, dtype=np.uint64).astype(np.uint32) for _ in workers]
    for worker, value in zip(workers, values, strict=True):
        worker.send(value, slot, seq)
    expected = (np.sum(values, axis=0, dtype=np.uint64) % (1 << 32)).astype(np.uint32)
    for worker in workers:
        header, words = worker.receive()
        assert header.msg_type == c.MsgType.RESULT, header
        assert (header.slot, header.seq, header.bitmap) == (slot, seq, (1 << len(workers)) - 1), header
        np.testing.assert_array_equal(words, expected)


def two_worker_job(epoch: int = 3) -> JobRecord:
    """An ACTIVE job of two workers at 10.0.0.1-2 behind ports 1-2, as the store would hold it."""
    members = tuple(
        MemberRecord(r, f"w{r}", f"10.0.0.{r + 1}", 40000, f"02:00:00:00:00:0{r + 1}", r + 1)
        for r in range(2)
    )
    return JobRecord(7, "j", JobState.ACTIVE, 2, 64, 16, c.LANES, 2, epoch, 10, 10, 0, members=members)


def refused(call, code: grpc.StatusCode, *words: str) -> str:
    """``call()`` must raise ControllerError with ``code`` and a message holding every one of ``words``."""
    with pytest.raises(ControllerError) as info:
        call()
    assert info.value.code == code, info.value
    for word in words:
        assert word in info.value.message, info.value.message
    return info.value.message
