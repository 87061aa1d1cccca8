"""Two levels in softswitch (docs/switch.md, "Two levels: leaf and spine"): two leaves and a spine, each a
pipeline written with its share of ``lhc_ina.fabric.fabric_entries``, wired together in process.

Simulated workers keep the hosts' rules (window of ``slot_count``, retransmission of every outstanding
packet when the network falls silent, a result taken only from their switch's address, for a packet they
wait for, with the job's result mask: one bit per leaf), each sending under its rank within its leaf: every
worker must end with the exact sum of every packet, whatever the seeded loss on every link, either way, up to
jobs larger than one switch's 32 bitmap bits. Both pipelines run it; the PTF suite checks each case on the
wire.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

import pytest

from lhc_ina import constants as c
from lhc_ina import wire
from lhc_ina.fabric import FabricJob, Leaf, LeafLink, SwitchShare, fabric_layouts, wire_ranks
from lhc_ina.jobs import WorkerEndpoint
from lhc_ina.p4info import P4InfoIndex
from lhc_launch.switch_job import job_updates
from softswitch.entity_store import Entities
from softswitch.native import NativePipeline, native_available
from softswitch.pipeline import Pipeline

INDEX = P4InfoIndex.from_file()
UPLINK_PORT = 20
SPINE_PORTS = tuple(range(30, 30 + c.MAX_LEAVES))
JOB_ID = 0x51


def fabric(per_leaf: tuple[int, ...] = (3, 2), slot_count: int = 2) -> FabricJob:
    leaves, rank = [], 0
    for index, count in enumerate(per_leaf):
        workers = tuple(
            WorkerEndpoint(r, f"10.{index}.0.{r + 1}", 40000 + r, f"02:00:00:{index:02x}:00:{r + 1:02x}",
                           1 + r - rank)
            for r in range(rank, rank + count)
        )
        link = LeafLink(leaf_port=UPLINK_PORT, spine_port=SPINE_PORTS[index],
                        leaf_mac=f"02:00:00:{index:02x}:00:fe", leaf_ip=f"10.{index}.0.254",
                        leaf_udp_port=c.UDP_PORT_BASE + 2,
                        spine_mac="02:00:00:99:00:fe", spine_ip="10.99.0.254")
        leaves.append(Leaf(f"leaf{index}", SwitchShare(3 + index, 8 * index, 7), workers, link))
        rank += count
    return FabricJob(JOB_ID, epoch=11, slot_count=slot_count, spine="spine",
                     spine_share=SwitchShare(9, 40, 8), leaves=tuple(leaves))


class Fabric:
    """Three switches of one pipeline kind, their links, and the frames in flight between them."""

    def __init__(self, job: FabricJob, kind: str) -> None:
        self.job = job
        self.pipelines: dict[str, Pipeline] = {}
        self.inject: dict[str, Callable[[bytes, int], list[tuple[int, bytes]]]] = {}
        for switch, layout in fabric_layouts(job).items():
            pipeline = Pipeline(INDEX)
            pipeline.configured = True
            entities = Entities(pipeline, INDEX.p4info)
            for up in job_updates(INDEX, layout):
                entities.write(up)
            self.pipelines[switch] = pipeline
            self.inject[switch] = (NativePipeline(pipeline, 16) if kind == "native" else pipeline).inject
        self.leaf_of = {w.rank: leaf for leaf in job.leaves for w in leaf.workers}
        self.in_flight: deque[tuple[str, int, bytes]] = deque()  # (switch, ingress port, frame)
        self.to_hosts: list[tuple[int, bytes]] = []  # (rank, frame)
        self.crossed = {"up": 0, "down": 0}

    def send_from_worker(self, rank: int, frame: bytes) -> None:
        leaf = self.leaf_of[rank]
        port = next(w.switch_port for w in leaf.workers if w.rank == rank)
        self.in_flight.append((leaf.switch, port, frame))

    def deliver(self, loss: float, rng: random.Random, reorder: bool = False) -> None:
        """Run every frame in flight, and every frame it makes, through the switches (each link may lose
        any frame, and with ``reorder`` deliver any frame in flight first); frames for hosts collect in
        ``to_hosts``."""
        while self.in_flight:
            if reorder:
                self.in_flight.rotate(-rng.randrange(len(self.in_flight)))
            switch, port, frame = self.in_flight.popleft()
            if rng.random() < loss:
                continue
            for out_port, out in self.inject[switch](frame, port):
                self._route(switch, out_port, out)

    def _route(self, switch: str, port: int, frame: bytes) -> None:
        if switch == self.job.spine:
            index = SPINE_PORTS.index(port)
            self.crossed["down"] += 1
            self.in_flight.append((self.job.leaves[index].switch, UPLINK_PORT, frame))
            return
        leaf = next(leaf for leaf in self.job.leaves if leaf.switch == switch)
        if port == UPLINK_PORT:
            self.crossed["up"] += 1
            self.in_flight.append((self.job.spine, leaf.link.spine_port, frame))
            return
        (worker,) = [w for w in leaf.workers if w.switch_port == port]
        self.to_hosts.append((worker.rank, frame))


class Worker:
    """A host's rules, reduced to what the switches rely on (docs/protocol.md, section 5)."""

    def __init__(self, job: FabricJob, rank: int, values: list[list[int]]) -> None:
        self.job, self.rank, self.values = job, rank, values
        self.leaf = next(leaf for leaf in job.leaves if any(w.rank == rank for w in leaf.workers))
        self.me = next(w for w in self.leaf.workers if w.rank == rank)
        self.results: dict[int, tuple[int, ...]] = {}
        self.next_p = 0
        _, self.worker_id = wire_ranks([[w.rank for w in leaf.workers] for leaf in job.leaves])[rank]
        self.full = job.result_mask  # one bit per leaf: every leaf's complete partial is in

    def frame(self, p: int) -> bytes:
        header = wire.LhcHeader(msg_type=c.MsgType.DATA, worker_id=self.worker_id, job_id=self.job.job_id,
                                epoch=self.job.epoch, **wire.stream_position(p, self.job.slot_count))
        link = self.leaf.link
        return wire.build_frame(wire.pack_packet(header, self.values[p]), src_mac=self.me.mac,
                                dst_mac=link.leaf_mac, src_ip=self.me.ip, dst_ip=link.leaf_ip,
                                src_port=self.me.udp_port, dst_port=link.leaf_udp_port)

    def new_packets(self) -> list[bytes]:
        """Packets the window allows now: ``p`` once the result of ``p - slot_count`` is held."""
        out = []
        S = self.job.slot_count
        while self.next_p < len(self.values) and (self.next_p < S or self.next_p - S in self.results):
            out.append(self.frame(self.next_p))
            self.next_p += 1
        return out

    def outstanding(self) -> list[bytes]:
        return [self.frame(p) for p in range(self.next_p) if p not in self.results]

    def receive(self, frame: bytes) -> None:
        ip = frame[wire.FRAME_IPV4 : wire.FRAME_UDP]
        source = (".".join(map(str, ip[12:16])), int.from_bytes(frame[wire.UDP_SPORT], "big"))
        assert source == (self.leaf.link.leaf_ip, self.leaf.link.leaf_udp_port), source
        header, words = wire.unpack_packet(frame[wire.FRAME_LHC : wire.FRAME_END])
        assert header.msg_type in (c.MsgType.RESULT, c.MsgType.RESULT_RETX)
        assert (header.job_id, header.epoch) == (self.job.job_id, self.job.epoch)
        assert header.bitmap == self.full, f"rank {self.rank}: bitmap {header.bitmap:#x}"
        p = header.seq
        if p < self.next_p and p not in self.results:
            self.results[p] = tuple(int(w) for w in words)


def run(job: FabricJob, kind: str, packets: int, loss: float, seed: int,
        reorder: bool = False) -> tuple[Fabric, list[Worker]]:
    rng = random.Random(seed)
    values = [[[rng.randrange(1 << 32) for _ in range(c.LANES)] for _ in range(packets)]
              for _ in range(job.world_size)]
    net = Fabric(job, kind)
    workers = [Worker(job, rank, values[rank]) for rank in range(job.world_size)]
    for _ in range(packets * 200):
        if all(len(w.results) == packets for w in workers):
            break
        sent = False
        for worker in workers:
            for frame in worker.new_packets():
                net.send_from_worker(worker.rank, frame)
                sent = True
        if not sent:  # the network fell silent: every worker's timers fire
            for worker in workers:
                for frame in worker.outstanding():
                    net.send_from_worker(worker.rank, frame)
        net.deliver(loss, rng, reorder)
        for rank, frame in net.to_hosts:
            if rng.random() >= loss:
                workers[rank].receive(frame)
        net.to_hosts.clear()
    for worker in workers:
        assert len(worker.results) == packets, f"rank {worker.rank} holds {len(worker.results)} of {packets}"
        for p in range(packets):
            want = tuple(sum(values[r][p][i] for r in range(job.world_size)) % (1 << 32)
                         for i in range(c.LANES))
            assert worker.results[p] == want, f"rank {worker.rank}, packet {p}"
    return net, workers


KINDS = ["python", pytest.param("native", marks=pytest.mark.skipif(
    not native_available(), reason="the native pipeline is not built"))]


@pytest.mark.parametrize("kind", KINDS)
def test_without_loss_one_packet_per_leaf_and_round_crosses_each_link(kind):
    job = fabric((3, 2))
    packets = 12
    net, _ = run(job, kind, packets, loss=0.0, seed=1)
    assert net.crossed == {"up": 2 * packets, "down": 2 * packets}
    for index, leaf in enumerate(job.leaves):
        n = len(leaf.workers)
        assert net.pipelines[leaf.switch].stats(3 + index) == {
            "ABSORBED": (n - 1) * packets, "UP": packets, "RESULT": packets}
    assert net.pipelines["spine"].stats(9) == {"ABSORBED": packets, "RESULT": packets}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", [2, 3, 4])
def test_loss_on_every_link_either_way_still_gives_every_worker_the_exact_sum(kind, seed):
    job = fabric((3, 2), slot_count=3)
    net, _ = run(job, kind, packets=30, loss=0.15, seed=seed, reorder=True)
    leaf_stats = [net.pipelines[leaf.switch].stats(3 + i) for i, leaf in enumerate(job.leaves)]
    # The recoveries of docs/switch.md ran: partials resent for a repeat while awaiting the spine.
    assert sum(s.get("UP_RETX", 0) for s in leaf_stats) > 0
    assert net.pipelines["spine"].stats(9).get("RETX", 0) > 0


@pytest.mark.parametrize("kind", KINDS)
def test_a_one_worker_leaf_sends_its_packet_up_at_once(kind):
    job = fabric((1, 4))
    net, _ = run(job, kind, packets=6, loss=0.0, seed=5)
    assert net.pipelines["leaf0"].stats(3) == {"UP": 6, "RESULT": 6}


@pytest.mark.parametrize("kind", KINDS)
def test_a_job_of_more_workers_than_bitmap_bits_is_exact_under_loss(kind):
    # 40 workers over three leaves (two of them more than half a bitmap): each leaf's bitmap holds its own
    # workers, the spine's its three leaves, and every worker's result carries the spine's 0b111.
    job = fabric((14, 13, 13), slot_count=2)
    assert job.world_size > c.MAX_WORKERS
    _, workers = run(job, kind, packets=4, loss=0.1, seed=6, reorder=True)
    assert {w.full for w in workers} == {0b111}
