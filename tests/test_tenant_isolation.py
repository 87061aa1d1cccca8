"""Two tenants' jobs aggregate through one real softswitch while forged packets of every kind hit them.

On loopback every worker has the address 127.0.0.1, so the attacker (a socket of its own on the same host,
as another process of a worker's machine would be) can forge everything but a worker's UDP source port:
the attack a review once used to make softswitch return 1002 where 3 was due. Here it sends, all the
while the jobs run, job A's id and epoch as A's ranks, a stale epoch, slots outside job B's range, and
bogus seqs that would pin fresh slot copies. Both jobs must end every call exact, and the switch's
counters must show each kind dropped in its own row. (Another switch port needs a second port of the
switch: the PTF suite, ptf_tests/test_isolation.py, covers that one.)
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from host_agent.agent import Agent
from lhc_ina import constants as c
from lhc_ina.jobservice import jobservice_pb2 as pb
from lhc_ina.wire import LhcHeader, pack_packet
from lhc_launch.processes import ControllerProcess, SoftswitchProcess
from tests.harness.agents import assert_exact, job_name, run_agents, sparse_inputs

MODES = ("dense", "union", "sketch", "dense", "union", "sketch")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    state = tmp_path_factory.mktemp("controller")
    with SoftswitchProcess() as switch, ControllerProcess(switch, Path(state)) as controller:
        yield switch, controller


class Attacker:
    """Sends forged DATA packets against jobs ``a`` and ``b`` until stopped, from a socket of its own."""

    def __init__(self, switch: SoftswitchProcess, a: pb.JobInfo, b: pb.JobInfo) -> None:
        self.address = (switch.host, switch.udp_port)
        self.a, self.b = a, b
        self.sent = 0
        self._stop = threading.Event()
        self._rng = np.random.default_rng(5)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Attacker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def forgeries(self) -> list[bytes]:
        """One packet of each kind; seqs and slots drawn from the ranges the jobs' live rounds use."""
        a, b, rng = self.a, self.b, self._rng
        seq = int(rng.integers(0, 4 * a.slot_count))
        slot, ver = seq % a.slot_count, (seq // a.slot_count) % 2
        words = rng.integers(1, 1 << 20, c.LANES)
        as_a = {"job_id": a.job_id, "epoch": a.epoch, "slot": slot, "ver": ver}
        headers = [
            LhcHeader(worker_id=0, seq=seq, **as_a),  # A's rank 0, A's round, from another port
            LhcHeader(worker_id=1, seq=seq, **as_a),  # another of A's ranks
            LhcHeader(worker_id=1, seq=seq, **{**as_a, "epoch": (a.epoch + 1) & 0xFFFF}),  # stale epoch
            LhcHeader(worker_id=0, seq=seq, job_id=b.job_id, epoch=b.epoch,  # past B's range
                      slot=b.slot_count + int(rng.integers(0, 64)), ver=ver),
            LhcHeader(worker_id=0, seq=0x7E570000 + seq, **as_a),  # a bogus seq that would pin a copy
        ]
        return [pack_packet(h, words) for h in headers]

    def _run(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            while not self._stop.is_set():
                for packet in self.forgeries():
                    sock.sendto(packet, self.address)
                    self.sent += 1
                self._stop.wait(0.0005)


def test_two_tenants_stay_exact_under_every_forgery(stack) -> None:
    switch, controller = stack
    names = {job: job_name() for job in "ab"}
    inputs = {job: sparse_inputs(2, 100_000, 0.05, torch.float32, seed=i) for i, job in enumerate("ab")}
    results: dict[str, list[object]] = {}
    # The four agents and this thread meet four times: all joined, the attacker started, all calls done,
    # the counters read (a job ends when its workers leave).
    meet = threading.Barrier(5)

    def tenant(job: str) -> None:
        def work(agent: Agent) -> list[object]:
            meet.wait(timeout=60)
            meet.wait(timeout=60)
            out = [agent.allreduce(inputs[job][agent.rank], mode=mode, key=mode) for mode in MODES]
            meet.wait(timeout=120)
            meet.wait(timeout=60)
            return out

        results[job] = run_agents(controller, 2, work, job=names[job])

    threads = [threading.Thread(target=tenant, args=(job,)) for job in "ab"]
    for thread in threads:
        thread.start()
    meet.wait(timeout=60)
    infos = {job: controller.client.wait_installed(names[job]) for job in "ab"}
    with Attacker(switch, infos["a"], infos["b"]) as attacker:
        meet.wait(timeout=60)
        meet.wait(timeout=120)
    a, b = (dict(controller.client.status(names[job]).counters) for job in "ab")
    meet.wait(timeout=60)
    for thread in threads:
        thread.join(timeout=120)
    for job in "ab":
        for call in range(len(MODES)):
            assert_exact([results[job][rank][call] for rank in range(2)], inputs[job])
    assert attacker.sent > 0
    assert a["DROP_BAD_WORKER"] > 0 and a["DROP_STALE_EPOCH"] > 0 and b["DROP_SLOT_RANGE"] > 0, (a, b)
    assert b.get("DROP_BAD_WORKER", 0) == 0 and a.get("DROP_SLOT_RANGE", 0) == 0, (a, b)
