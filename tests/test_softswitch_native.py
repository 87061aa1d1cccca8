"""The native pipeline (softswitch/_dataplane.c + dataplane_*.c) against the Python one, the reference model.

Two Pipelines get the same table writes; seeded random frames (valid rounds of several jobs, stale
rounds, duplicates, repeats of finished rounds, wrong epochs, slots out of range, unknown jobs, bad
workers, malformed and truncated frames, wrong types, ops and flags, routed and L2 traffic, foreign UDP,
random bytes) and a few table writes between them run through both: every frame out (port and bytes),
every counter and every register must agree bit for bit. Two-level jobs are in it too (docs/switch.md,
"Two levels"): a leaf's workers, its parent's results (for awaited rounds, stale ones, from a wrong
address or port) and a spine's members, the leaves.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import select
import socket
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from p4.v1 import p4runtime_pb2 as p4v1

from lhc_ina import constants as c
from lhc_ina import wire
from lhc_ina.fabric import FabricJob, Leaf, LeafLink, SwitchShare, fabric_layouts
from lhc_ina.jobs import JobLayout, WorkerEndpoint
from lhc_ina.jobs import ip_to_int as ip_int
from lhc_ina.jobs import mac_to_int as mac_int
from lhc_ina.p4info import P4InfoIndex
from lhc_launch.switch_job import (
    SWITCH_IP,
    SWITCH_MAC,
    data_frame,
    data_packet,
    job_updates,
    make_job,
    table_entry,
    update,
)
from ptf_tests import veth as veth_pairs
from softswitch.entity_store import Entities
from softswitch.native import NativePipeline, layout, native_available
from softswitch.pipeline import Pipeline
from softswitch.ports import PortSpec, UdpPort
from tests.harness.dataplane_fault_trials import UDP_ERRORS
from tests.harness.socket_faults import build_shim, run_with_faults
from tests.harness.switch_jobs import broken_job_updates, loopback_job, loopback_sockets, position

pytestmark = pytest.mark.skipif(not native_available(), reason="the native pipeline is not built")

INDEX = P4InfoIndex.from_file()
STEPS = 6000
REGISTERS = ("slot_epoch", "slot_round", "slot_bitmap", "slot_remaining", "slot_values", "stats_packets",
             "stats_bytes")
ROUTES = [("10.0.0.0", 8, 3), ("10.1.0.0", 16, 4), ("192.168.1.0", 24, 511), ("172.16.0.0", 12, 9)]
L2 = [("02:00:00:00:00:09", 2), ("02:00:00:00:00:0a", 511), (SWITCH_MAC, 5)]


class Twins:
    """A Python and a native pipeline written identically; ``step`` runs a frame through both."""

    def __init__(self) -> None:
        self.python = Pipeline(INDEX)
        self.state = Pipeline(INDEX)
        self.native = NativePipeline(self.state, 64)
        self.entities = [Entities(p, INDEX.p4info) for p in (self.python, self.state)]
        self.divergences: list[str] = []

    def configure(self) -> None:
        for pipeline in (self.python, self.state):
            pipeline.configured = True

    def write(self, updates: list[p4v1.Update]) -> None:
        for entities in self.entities:
            for up in updates:
                entities.write(up)

    def step(self, frame: bytes, port: int) -> list[tuple[int, bytes]]:
        expected = self.python.inject(frame, port)
        got = self.native.inject(frame, port)
        if got != expected and len(self.divergences) < 5:
            self.divergences.append(f"frame {frame.hex()} on port {port}: python {expected}, native {got}")
        return expected

    def state_differs(self) -> list[str]:
        return [name for name in REGISTERS
                if not np.array_equal(getattr(self.python, name), getattr(self.state, name))]


def jobs() -> list[tuple[JobLayout, dict[str, int] | None]]:
    """Jobs that cover the pipeline's branches: plain, fan_in below the workers, a missing replica
    rewrite, a counter row past the counter with slots past the registers, and multicast group 0."""
    return [
        (make_job(11, 2, 4, slot_count=4, epoch=5), None),
        (make_job(12, 3, 3, first_port=5, slot_base=16, slot_count=2, epoch=9, fan_in=2), None),
        (make_job(13, 4, 2, first_port=7, slot_base=32, slot_count=3, epoch=3), None),
        (make_job(14, 5, 2, slot_base=40, slot_count=2, epoch=4),
         {"job_index": c.MAX_JOBS, "slot_base": c.MAX_SLOTS - 1}),
        (make_job(15, 6, 2, first_port=3, slot_base=48, slot_count=2, epoch=6), {"mcast_grp": 0}),
    ]


def two_level_jobs() -> list[JobLayout]:
    """A leaf (job 16, its uplink out of port 9) and a spine (job 17, leaves behind ports 6 and 8), each
    the switch's share of a two-leaf fabric job. Job 16 has 40 workers, more than one bitmap holds: its
    leaf holds 32 of them (ranks 0..31 within it, the top bit included), behind ports 2, 3, 4."""
    out = []
    big = ((tuple(range(32)), tuple(2 + r % 3 for r in range(32))), (tuple(range(32, 40)), (5,) * 8))
    small = (((0, 1, 2), (2, 3, 4)), ((3, 4), (5, 7)))
    for job_id, keep, shape in ((16, "leaf0", big), (17, "spine", small)):
        leaves = []
        for index, (ranks, ports) in enumerate(shape):
            workers = tuple(WorkerEndpoint(r, f"10.{job_id}.0.{r + 1}", 40000 + r,
                                           f"02:00:00:10:00:{r + 1:02x}", port)
                            for r, port in zip(ranks, ports, strict=True))
            link = LeafLink(leaf_port=9, spine_port=(6, 8)[index], leaf_mac=f"02:00:00:11:00:{index:02x}",
                            leaf_ip=f"10.{job_id}.{index}.254", leaf_udp_port=c.UDP_PORT_BASE + 5,
                            spine_mac="02:00:00:12:00:01", spine_ip=f"10.{job_id}.99.1")
            leaves.append(Leaf(f"leaf{index}", SwitchShare(7, 56, 20), workers, link))
        fabric = FabricJob(job_id, epoch=7, slot_count=2, spine="spine",
                           spine_share=SwitchShare(8, 64, 21), leaves=tuple(leaves))
        out.append(fabric_layouts(fabric)[keep])
    return out


def member_frame(job: JobLayout, index: int, words: np.ndarray, **header: int) -> bytes:
    """A DATA frame from member ``index`` of ``job`` (a worker, or a leaf at a spine) to the switch."""
    member = job.workers[index]
    fields = {"msg_type": c.MsgType.DATA, "worker_id": member.rank, "job_id": job.job_id, "epoch": job.epoch,
              **header}
    return wire.build_frame(wire.pack_packet(wire.LhcHeader(**fields), words), src_mac=member.mac,
                            dst_mac=SWITCH_MAC, src_ip=member.ip, dst_ip=SWITCH_IP, src_port=member.udp_port,
                            dst_port=c.UDP_PORT_BASE)


def configure(twins: Twins) -> list[JobLayout]:
    layouts = []
    for job in two_level_jobs():
        twins.write(job_updates(INDEX, job))
        layouts.append(job)
    for job, broken in jobs():
        twins.write(broken_job_updates(INDEX, job, broken) if broken else job_updates(INDEX, job))
        layouts.append(job)
    match = {"hdr.lhc.job_id": 13, "standard_metadata.egress_rid": 1}
    replica = table_entry(INDEX, "LhcEgress.replicas", match, "LhcEgress.set_replica_dst",
                          dst_mac=1, dst_addr=1, dst_port=1)
    twins.write([update(p4v1.Update.DELETE, replica)])  # job 13's rank 1 copy has no rewrite: dropped
    for prefix, plen, port in ROUTES:
        match = {"hdr.ipv4.dst_addr": (ip_int(prefix), plen)}
        twins.write([update(p4v1.Update.INSERT, table_entry(
            INDEX, "LhcIngress.ipv4_routes", match, "LhcIngress.route", port=port,
            src_mac=mac_int(SWITCH_MAC), dst_mac=mac_int(f"02:00:00:00:01:{port % 256:02x}")))])
    for mac, port in L2:
        twins.write([update(p4v1.Update.INSERT, table_entry(
            INDEX, "LhcIngress.l2_forward", {"hdr.ethernet.dst_addr": mac_int(mac)}, "LhcIngress.set_port",
            port=port))])
    return layouts


class Traffic:
    """Seeded random frames: each ``frame()`` is (bytes, ingress port)."""

    def __init__(self, seed: int, layouts: list[JobLayout]) -> None:
        self.rng = np.random.default_rng(seed)
        self.jobs = layouts
        self.next_p = [0] * len(layouts)
        self.pending: list[dict[int, list[int]]] = [{} for _ in layouts]  # round -> ranks yet to send
        self.sent: list[list[tuple[int, int]]] = [[] for _ in layouts]  # (round, rank) already sent
        self.complete: list[int] = []  # rounds of the leaf (job 0) that all its workers sent

    def words(self) -> np.ndarray:
        if self.rng.random() < 0.3:  # values near the wrap
            return self.rng.choice(np.array([0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF], np.uint32), c.LANES)
        return self.rng.integers(0, 1 << 32, c.LANES, dtype=np.uint64).astype(np.uint32)

    def contribution(self, j: int, p: int, rank: int, **header: int) -> tuple[bytes, int]:
        job = self.jobs[j]
        op = int(c.Op.OR) if self.rng.random() < 0.15 else int(c.Op.ADD)
        header = {**position(job, p), "op": op, **header}
        return member_frame(job, rank, self.words(), **header), job.workers[rank].switch_port

    def valid(self, j: int) -> tuple[bytes, int]:
        """The next packet of an in-flight round, starting one when fewer than S are in flight."""
        job, pending = self.jobs[j], self.pending[j]
        if not pending or (len(pending) < job.slot_count and self.rng.random() < 0.3):
            pending[self.next_p[j]] = list(self.rng.permutation(len(job.workers)))
            self.next_p[j] += 1
        p = list(pending)[int(self.rng.integers(len(pending)))]
        rank = int(pending[p].pop())
        if not pending[p]:
            del pending[p]
            if j == 0:  # every worker of the leaf sent p: its copy awaits the parent's result
                self.complete.append(p)
        self.sent[j].append((p, rank))
        return self.contribution(j, p, rank)

    def repeat(self, j: int, shift: int = 0) -> tuple[bytes, int]:
        """A packet already sent, again (a duplicate or a repeat of a finished round), or ``shift``
        rounds of the copy away (stale or future)."""
        if not self.sent[j]:
            return self.valid(j)
        p, rank = self.sent[j][-int(self.rng.integers(1, min(len(self.sent[j]), 40) + 1))]
        return self.contribution(j, max(p + shift * 2 * self.jobs[j].slot_count, 0), rank)

    def broken_lhc(self, j: int) -> tuple[bytes, int]:
        job, rng = self.jobs[j], self.rng
        rank = int(rng.integers(len(job.workers)))
        p = self.next_p[j]
        kind = int(rng.integers(11))
        header: dict[str, int] = [
            {"epoch": (job.epoch + 1) % (1 << 16)}, {"slot": job.slot_count + int(rng.integers(3))},
            {"job_id": 99}, {"worker_id": len(job.workers) + 1},
            {"msg_type": int(rng.choice([0, 2, 3, 4, 15]))}, {"op": int(rng.integers(2, 4))}, {"flags": 1},
            {}, {}, {}, {},
        ][kind]
        frame, port = self.contribution(j, p, rank, **header)
        frame = bytearray(frame)
        if kind == 7:  # spoofed source address
            frame[wire.IP_SRC] = bytes([10, 99, 0, 1])
        elif kind == 8:  # truncated anywhere, or longer than allowed
            frame = frame[: int(rng.integers(0, len(frame)))] if rng.random() < 0.7 else frame + b"\0\0\0\0"
        elif kind == 9:  # a wrong UDP or IPv4 length
            at = wire.UDP_LEN if rng.random() < 0.5 else wire.IP_TOTAL_LEN
            frame[at + 1] ^= 1 << int(rng.integers(8))
        elif kind == 10:  # another UDP port of the range, any destination address
            frame[wire.UDP_DPORT.start + 1] = (c.UDP_PORT_BASE + int(rng.integers(c.UDP_PORT_COUNT))) & 0xFF
            frame[wire.IP_DST] = bytes(rng.integers(0, 256, 4, dtype=np.uint8))
        return bytes(frame), port

    def other(self) -> tuple[bytes, int]:
        """Routed IPv4 (TTL, options, fragments, other protocols), foreign UDP, L2 frames, random bytes."""
        rng = self.rng
        kind = int(rng.integers(6))
        if kind == 5:
            return rng.bytes(int(rng.integers(0, 120))), int(rng.integers(1, 10))
        dst = [f"10.{rng.integers(3)}.0.{rng.integers(1, 9)}", "192.168.1.7", "172.20.3.4", "8.8.8.8",
               SWITCH_IP][int(rng.integers(5))]
        frame = bytearray(wire.build_frame(
            rng.bytes(int(rng.integers(0, 300))), src_mac="02:00:00:00:00:01",
            dst_mac=[SWITCH_MAC, L2[0][0], L2[1][0], "02:00:00:00:00:77"][int(rng.integers(4))],
            src_ip="10.2.0.1",
            dst_ip=dst, src_port=int(rng.integers(1, 1 << 16)), dst_port=int(rng.integers(1, 1 << 16)),
            ttl=int(rng.choice([0, 1, 2, 64])),
        ))
        if kind == 1:
            frame[wire.IP_PROTO] = int(rng.choice([1, 6, 47]))
        elif kind == 2:  # options or another version: only l2_forward sees it
            frame[wire.FRAME_IPV4] = int(rng.choice([0x46, 0x60, 0x4F]))
        elif kind == 3:  # a fragment, possibly of an lhc port
            frame[wire.IP_FRAG + 1] = int(rng.integers(1, 256))
            frame[wire.UDP_DPORT] = c.UDP_PORT_BASE.to_bytes(2, "big")
        elif kind == 4:  # not IPv4 at all
            ether_type = int(rng.choice([0x86DD, 0x0806, 0x88CC]))
            frame[wire.ETH_TYPE : wire.ETH_TYPE + 2] = ether_type.to_bytes(2, "big")
        if rng.random() < 0.1:
            frame = frame[: int(rng.integers(0, len(frame) + 1))]
        return bytes(frame), int(rng.integers(1, 10))

    def parent_result(self) -> tuple[bytes, int]:
        """A RESULT or RESULT_RETX to the leaf (job 16) from its parent: for a round its workers sent (the
        awaited one, or not), another round, or with a wrong epoch, address, UDP port or switch port."""
        rng, j = self.rng, 0
        job = self.jobs[j]
        up = job.uplink
        assert up is not None
        awaited = rng.random() < 0.7 and self.complete
        sent = self.complete[:2] if awaited else [p for p, _ in self.sent[j][-12:]]
        p = int(rng.choice(sent or [0])) + int(rng.choice([0, 0, 0, 0, -2, 2])) * 2 * job.slot_count
        kind = int(rng.integers(8))
        if awaited and kind >= 4 and p in self.complete:  # the right answer: the round moves on
            self.complete.remove(p)
        kinds = [c.MsgType.RESULT, c.MsgType.RESULT_RETX]
        header = {**position(job, max(p, 0)), "msg_type": int(rng.choice(kinds)), "op": int(rng.integers(2)),
                  "worker_id": int(rng.integers(8)), "job_id": job.job_id,
                  "epoch": (job.epoch + 1) % (1 << 16) if kind == 3 else job.epoch,
                  "bitmap": int(rng.integers(1 << 32))}
        frame = wire.build_frame(
            wire.pack_packet(wire.LhcHeader(**header), self.words()), src_mac=up.dst_mac, dst_mac=up.src_mac,
            src_ip="10.99.99.99" if kind == 0 else up.dst_addr, dst_ip=up.src_addr,
            src_port=up.dst_port + 1 if kind == 1 else up.dst_port, dst_port=up.src_port)
        return frame, up.port + 1 if kind == 2 else up.port

    def frame(self) -> tuple[bytes, int]:
        if self.rng.random() < 0.06:
            return self.parent_result()
        j = int(self.rng.integers(len(self.jobs)))
        draw = self.rng.random()
        choices: list[tuple[float, Callable[[], tuple[bytes, int]]]] = [
            (0.55, lambda: self.valid(j)), (0.65, lambda: self.repeat(j)),
            (0.70, lambda: self.repeat(j, int(self.rng.choice([-2, -1, 1, 2])))),
            (0.85, lambda: self.broken_lhc(j)), (1.0, self.other),
        ]
        return next(make for bound, make in choices if draw < bound)()


def test_native_matches_python_frame_for_frame_counter_for_counter():
    twins = Twins()
    layouts = configure(twins)
    traffic = Traffic(20261125, layouts)
    for _ in range(20):  # no pipeline committed: both forward nothing and count nothing
        assert twins.step(*traffic.frame()) == []
    twins.configure()
    kinds: dict[int, int] = {}
    for step in range(STEPS):
        if step % 1500 == 1499:  # a P4Runtime write between frames: job 11 moves to a new epoch
            j = next(i for i, job in enumerate(layouts) if job.job_id == 11)
            layouts[j] = dataclasses.replace(layouts[j], epoch=layouts[j].epoch + 1)
            twins.write(job_updates(INDEX, layouts[j], p4v1.Update.MODIFY))
            traffic.pending[j].clear()
        for port, _ in twins.step(*traffic.frame()):
            kinds[port] = kinds.get(port, 0) + 1
        if step % 500 == 0:
            assert twins.state_differs() == [], f"state differs after step {step}"
    assert twins.divergences == []
    assert twins.state_differs() == []
    # The run reached every outcome, in the rows of every job, and forwarded on many ports.
    outcomes = twins.python.stats_packets.reshape(-1, c.NUM_STATS)[:, : len(c.Stat)].sum(axis=0)
    assert all(outcomes), dict(zip([s.name for s in c.Stat], outcomes.tolist(), strict=True))
    leaf, spine = (twins.python.stats(job.job_index) for job in two_level_jobs())
    assert leaf.get("UP", 0) and leaf.get("UP_RETX", 0) and leaf.get("DROP_STALE_RESULT", 0), leaf
    assert leaf.get("RESULT", 0) and spine.get("RESULT", 0) and spine.get("RETX", 0), (leaf, spine)
    assert len(kinds) >= 5


def test_native_inject_refuses_an_oversized_frame_like_python():
    twins = Twins()
    with pytest.raises(ValueError, match="exceeds the receive buffer"):
        twins.native.inject(bytes(70000), 1)


def test_a_broken_entry_raises_in_both():
    """An entry of a table the pipeline unpacks with the wrong arity raises in both (the data plane then
    loses that frame and counts it)."""
    twins = Twins()
    twins.configure()
    job = make_job(11, 2, 2)
    twins.write(job_updates(INDEX, job))
    for pipeline in (twins.python, twins.state):
        pipeline.jobs.entries[11] = ("LhcIngress.set_job", 2)
    frame = data_frame(job, 0, np.zeros(c.LANES, np.uint32))
    with pytest.raises(ValueError):
        twins.python.inject(frame, 1)
    with pytest.raises(ValueError):
        twins.native.inject(frame, 1)


def test_udp_bursts_match_the_python_port_and_pipeline():
    """The burst path (recvmmsg, synthesized headers, send queues, GSO runs) against UdpPort and
    Pipeline.process: the same datagrams into a port of each give the same datagrams to every rank, in
    the same order per rank, and the same counters and registers."""
    twins = Twins()
    twins.configure()
    ranks = [loopback_sockets(3) for _ in range(2)]
    ports = [UdpPort(PortSpec(1, host="127.0.0.1", udp_port=0), pipeline.rx)
             for pipeline in (twins.python, twins.state)]
    twins.native.attach(ports[1])
    jobs_ = []
    for side, pipeline in zip(ranks, (twins.python, twins.state), strict=True):
        jobs_.append(loopback_job(INDEX, pipeline, side, 21, 3, slot_count=4, epoch=3))
    junk_sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rng = np.random.default_rng(7)
    datagrams = []  # (rank, bytes): a rank's packets leave from its own socket (the switch checks the port)
    for p in range(24):  # rounds, repeats of finished rounds (RETX to the sender) and junk
        for rank in rng.permutation(3):
            words = rng.integers(0, 1 << 32, c.LANES, dtype=np.uint64).astype(np.uint32)
            datagrams.append((int(rank), data_packet(jobs_[0], int(rank), words, **position(jobs_[0], p))))
        datagrams += [datagrams[-2], (None, rng.bytes(int(rng.integers(0, 300))))]
    try:
        for rank, datagram in datagrams:
            for side, port in zip(ranks, ports, strict=True):
                (junk_sender if rank is None else side[rank]).sendto(datagram, port.address)
        select.select([ports[1]], [], [], 3)
        while (length := ports[0].receive()) >= 0:
            twins.python.process(length, 1, lambda _, frame: ports[0].send(frame))
        ports[0].flush()
        processed = 0
        while processed < len(datagrams):
            got = twins.native.burst(1)
            twins.native.flush()
            assert got or select.select([ports[1]], [], [], 3)[0], "datagrams did not arrive"
            processed += got
        assert twins.state_differs() == []
        assert twins.native.port_counters()[1] == {"frames_in": len(datagrams), "dropped_non_udp": 0,
                                                   "send_errors": 0, "send_errors_by_errno": {}}
        repeats = [rank for i, (rank, _) in enumerate(datagrams) if i % 5 == 3]  # each answered by a RETX
        for rank, (python_rank, native_rank) in enumerate(zip(*ranks, strict=True)):
            count = 24 + repeats.count(rank)  # a RESULT per round, and its own repeats' RESULT_RETX
            expected = [python_rank.recv(2048) for _ in range(count)]
            assert [native_rank.recv(2048) for _ in range(count)] == expected
    finally:
        for sock in [junk_sender, *ports, *(s for side in ranks for s in side)]:
            sock.close()


def test_the_layout_gives_the_c_code_exactly_the_numbers_it_names():
    """Every number the C files use comes from native.layout() (the project's constants), and layout()
    passes nothing the C files do not name."""
    header = (Path(__file__).resolve().parent.parent / "softswitch" / "dataplane.h").read_text()
    block = header[header.index("#define LAYOUT_FIELDS(X)") : header.index("typedef struct {")]
    named = set(re.findall(r"X\((\w+)\)", block))
    assert set(layout(Pipeline(INDEX), 64)) == named


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_shim(tmp_path_factory.mktemp("socket-faults"))


def _fault_trials(shim: Path, *args: str) -> dict:
    """tests/harness/dataplane_fault_trials.py under the socket-fault shim: the native pipeline's outcome,
    checked equal to the Python pipeline's over lhc_ina._udp and over PythonIO (counters per port and
    errno, frames that raised, socket errors, every receiver's results and their bytes)."""
    runs = run_with_faults(shim, "tests.harness.dataplane_fault_trials", *args)
    for pipeline in ("python", "python-io"):
        assert runs[pipeline] == runs["native"], f"{pipeline} differs from native"
    return runs["native"]


def _check_destination_faults(run: dict, raw: bool) -> None:
    rounds = 150
    by_errno = {errno.errorcode[e]: rounds for e in UDP_ERRORS}
    assert run["counters"]["1"] == {"frames_in": 2 * rounds, "dropped_non_udp": 0,
                                    "send_errors": len(UDP_ERRORS) * rounds, "send_errors_by_errno": by_errno}
    assert (run["errors"], run["socket_errors"]) == (0, 0)
    roles = ["A0", "B0", "B1", "B2"] + (["raw"] if raw else [])
    assert {role: got["count"] for role, got in run["delivered"].items()} == dict.fromkeys(roles, rounds)
    if raw:
        assert run["counters"]["2"] == {"frames_in": 0, "dropped_non_udp": 0, "send_errors": rounds,
                                        "send_errors_by_errno": {"ENXIO": rounds}}


def test_per_destination_socket_errors_cost_only_their_datagrams_on_both_pipelines(shim):
    """Issue 39: job A's replicas meet EINVAL, EMSGSIZE, ENOBUFS, ECONNREFUSED, EAGAIN, EACCES, EPERM and
    EHOSTUNREACH, while job B shares the UDP port and the native bursts overflow its send queue (a flush
    within the burst): every other result reaches its rank on both pipelines, nothing counts as a broken
    table entry or a socket error, and each errno's drops are counted on the port by name."""
    _check_destination_faults(_fault_trials(shim, "destinations"), raw=False)


@pytest.mark.root
def test_an_interface_gone_from_under_a_raw_port_costs_only_its_frames(shim):
    """The same with port 2 a raw (AF_PACKET) port on a veth: the frames of one rank there fail with
    ENXIO, as when an interface goes away; the other rank behind it still gets every result (read on the
    pair's other end), on both pipelines (the native flush used to stop at the first ENXIO)."""
    pairs = veth_pairs.pair_names(range(1), prefix=f"sf{os.getpid() % 10000}")
    veth_pairs.create(pairs)
    try:
        run = _fault_trials(shim, "destinations", "--raw", pairs[0].switch_end, "--sniff", pairs[0].ptf_end)
    finally:
        veth_pairs.delete(pairs)
    _check_destination_faults(run, raw=True)


def test_a_socket_failing_for_good_within_a_burst_is_a_socket_error_not_a_broken_entry(shim):
    """A port's socket fails for good (EBADF) in the flush the native engine makes when its queue fills
    mid-burst: both pipelines count every copy of the burst as lost under EBADF (none of the frame's other
    replicas is skipped) and raise one socket error; no frame counts as a broken table entry."""
    run = _fault_trials(shim, "fatal")
    assert run["counters"]["1"] == {"frames_in": 64, "dropped_non_udp": 0, "send_errors": 64 * 20,
                                    "send_errors_by_errno": {"EBADF": 64 * 20}}
    assert (run["errors"], run["socket_errors"]) == (0, 1)
