"""Two levels (docs/switch.md, "Two levels: leaf and spine"): the switch under test plays the leaf of a job
(the test plays its workers and its spine) or the spine (the test plays the leaves). Both are one switch's
share of the same kind of fabric job, built by ``lhc_ina.fabric``.

Leaf: when its last worker is in, one DATA packet (the partial) goes up; a worker's repeat while the copy
awaits the spine sends it up again; the spine's RESULT or RESULT_RETX is stored and multicast to the
workers only when it comes from the parent for the round the copy awaits. Spine: each leaf is one member
with one bit (its index), and a leaf sends up only complete partials, so the result's bitmap, every leaf's
bit, stands for every worker (docs/switch.md, "Ranks per level").
"""

from __future__ import annotations

from lhc_ina import constants as c
from lhc_ina.fabric import FabricJob, Leaf, LeafLink, SwitchShare, fabric_layouts
from lhc_ina.jobs import JobLayout, WorkerEndpoint
from lhc_ina.wire import LhcHeader, stream_position
from ptf_tests import frames
from ptf_tests.base import LhcTest, next_epoch
from ptf_tests.frames import Worker

LEAF_ROW, SPINE_ROW = 24, 25  # job indexes (counter rows)
SPINE_MAC, SPINE_IP, SPINE_UDP = "02:00:00:00:0f:01", "10.254.0.1", c.UDP_PORT_BASE + 7
LEAF_IPS, LEAF_UDP = ("10.201.0.254", "10.202.0.254"), c.UDP_PORT_BASE + 1
FULL = 0b11  # two leaves: job ranks 0 and 1 under leaf 0, job ranks 2, 3, 4 under leaf 1 (its 0, 1, 2)
LEAF_MASKS = (0b11, 0b111)  # each leaf's bitmap of its own workers, by their rank within it
SLOTS = 2


def lanes(value: int) -> list[int]:
    return [value] * c.LANES


def fabric_job(job_id: int, ports: list[int], switch: str) -> tuple[JobLayout, FabricJob]:
    """A job of five workers over two leaves and a spine; ``switch`` is the one under test. As a leaf
    (leaf 1) the switch's workers are job ranks 2..4 (its ranks 0..2) on the first ports and its uplink
    the last port, the spine behind it at SPINE_*; as the spine its leaves are behind the first two
    ports."""
    epoch = next_epoch()
    leaves = []
    for index, ranks in enumerate(((0, 1), (2, 3, 4))):
        workers = tuple(
            WorkerEndpoint(r, f"10.{job_id & 0xFF}.{index}.{r + 1}", 40000 + r,
                           f"02:00:00:{job_id & 0xFF:02x}:00:{r + 1:02x}", ports[i % (len(ports) - 1)])
            for i, r in enumerate(ranks))
        if switch == "spine":  # the switch under test sees leaves, and a leaf's address is its own
            link = LeafLink(leaf_port=0, spine_port=ports[index], leaf_mac=f"02:00:00:00:0e:{index:02x}",
                            leaf_ip=LEAF_IPS[index], leaf_udp_port=LEAF_UDP, spine_mac=frames.SWITCH_MAC,
                            spine_ip=frames.SWITCH_IP, spine_udp_port=c.UDP_PORT_BASE)
        elif index == 0:  # not under test: an address of its own
            link = LeafLink(leaf_port=ports[-1], spine_port=4, leaf_mac="02:00:00:00:0e:00",
                            leaf_ip=LEAF_IPS[0], leaf_udp_port=LEAF_UDP, spine_mac=SPINE_MAC,
                            spine_ip=SPINE_IP, spine_udp_port=SPINE_UDP)
        else:  # the switch under test is leaf 1: its workers address it at SWITCH_IP:UDP_PORT_BASE
            link = LeafLink(leaf_port=ports[-1], spine_port=5, leaf_mac=frames.SWITCH_MAC,
                            leaf_ip=frames.SWITCH_IP, leaf_udp_port=c.UDP_PORT_BASE, spine_mac=SPINE_MAC,
                            spine_ip=SPINE_IP, spine_udp_port=SPINE_UDP)
        leaves.append(Leaf(f"leaf{index}", SwitchShare(LEAF_ROW, 0, job_id), workers, link))
    fabric = FabricJob(job_id, epoch, SLOTS, "spine", SwitchShare(SPINE_ROW, 8, job_id), tuple(leaves))
    return fabric_layouts(fabric)["leaf1" if switch == "leaf" else "spine"], fabric


class _LeafTest(LhcTest):
    """The switch is leaf 1 of a five-worker job: its workers are job ranks 2, 3, 4, its ranks 0, 1, 2."""

    def leaf(self, job_id: int) -> None:
        self.layout, _ = fabric_job(job_id, self.ports, "leaf")
        self.install_layout(self.layout)
        self.workers = [Worker(w.rank, w.switch_port, w.mac, w.ip, w.udp_port) for w in self.layout.workers]
        assert self.layout.uplink is not None
        self.uplink_port = self.layout.uplink.port

    def data(self, worker: Worker, value: int, p: int, **fields: int) -> LhcHeader:
        header = LhcHeader(msg_type=c.MsgType.DATA, worker_id=worker.rank, job_id=self.layout.job_id,
                           epoch=self.layout.epoch, **{**stream_position(p, SLOTS), **fields})
        self.send(worker.port, frames.data_frame(worker, header, lanes(value)))
        return header

    def all_in(self, p: int, values: tuple[int, int, int] = (1, 2, 4), absorbed_before: int = 0) -> LhcHeader:
        """Every worker of the leaf sends packet ``p``; the last one's header."""
        for worker, value in zip(self.workers[:-1], values[:-1], strict=True):
            self.data(worker, value, p)
        self.wait_stats({(LEAF_ROW, c.Stat.ABSORBED): absorbed_before + 2})
        return self.data(self.workers[-1], values[-1], p)

    def partial(self, last: LhcHeader, value: int) -> bytes:
        """The leaf's partial for the round ``last`` finished: DATA to the spine under the leaf's index, its
        workers' bits."""
        header = last.replace(worker_id=1, bitmap=LEAF_MASKS[1])
        return bytes(frames.lhc_frame(header, lanes(value), eth_src=frames.SWITCH_MAC, eth_dst=SPINE_MAC,
                                      ip_src=frames.SWITCH_IP, ip_dst=SPINE_IP, sport=c.UDP_PORT_BASE,
                                      dport=SPINE_UDP))

    def from_spine(self, p: int, value: int, *, msg_type: int = c.MsgType.RESULT, ip: str = SPINE_IP,
                   sport: int = SPINE_UDP, port: int | None = None, **fields: int) -> LhcHeader:
        values = {"msg_type": msg_type, "worker_id": 0, "job_id": self.layout.job_id,
                  "epoch": self.layout.epoch, "bitmap": FULL, **stream_position(p, SLOTS)}
        header = LhcHeader(**{**values, **fields})
        frame = frames.lhc_frame(header, lanes(value), eth_src=SPINE_MAC, eth_dst=frames.SWITCH_MAC,
                                 ip_src=ip, ip_dst=frames.SWITCH_IP, sport=sport, dport=c.UDP_PORT_BASE)
        self.send(self.uplink_port if port is None else port, frame)
        return header

    def expect_down(self, header: LhcHeader, value: int) -> None:
        """The spine's result, multicast by the leaf to each of its workers from the leaf's address."""
        copies = [(w.port, frames.result_copy(header, lanes(value), FULL, w)) for w in self.workers]
        self.expect_packets(copies)


class LeafSendsOnePartialUp(_LeafTest):
    """The leaf's round completes locally: exactly one DATA packet up, carrying the sum of its workers,
    its bits and its rank at the spine; nothing reaches the workers yet."""

    def runTest(self) -> None:
        self.leaf(0xA00)
        last = self.all_in(3)
        self.expect_packets([(self.uplink_port, self.partial(last, 7))])
        self.assert_stats({(LEAF_ROW, c.Stat.ABSORBED): 2, (LEAF_ROW, c.Stat.UP): 1})


class LeafDeliversTheSpinesResult(_LeafTest):
    """The spine's RESULT goes to every worker with the spine's values and the job's result mask (every
    leaf's bit); a worker's repeat then gets RESULT_RETX from the stored result; the next round starts on
    the copy."""

    def runTest(self) -> None:
        self.leaf(0xA01)
        last = self.all_in(1)
        self.expect_packets([(self.uplink_port, self.partial(last, 7))])
        down = self.from_spine(1, 1000)
        self.expect_down(down, 1000)
        asker = self.workers[1]
        again = self.data(asker, 2, 1)
        self.expect_retx(asker, again, lanes(1000), FULL)
        nxt = self.all_in(1 + 2 * SLOTS, (10, 20, 40), absorbed_before=2)
        self.expect_packets([(self.uplink_port, self.partial(nxt, 70))])
        self.assert_stats({(LEAF_ROW, c.Stat.ABSORBED): 4, (LEAF_ROW, c.Stat.UP): 2,
                           (LEAF_ROW, c.Stat.RESULT): 1, (LEAF_ROW, c.Stat.RETX): 1})


class LeafRecoversALostPartialOrResult(_LeafTest):
    """Loss on the leaf-spine link: a worker's repeat while the copy awaits sends the partial up again
    (UP_RETX); the spine's RESULT_RETX is stored and multicast as RESULT; a second answer for the same
    round is a duplicate (nothing sent); the copy's next round cannot start while it awaits."""

    def runTest(self) -> None:
        self.leaf(0xA02)
        last = self.all_in(0)
        self.expect_packets([(self.uplink_port, self.partial(last, 7))])
        self.data(self.workers[0], 1, 2 * SLOTS)  # the copy's next round, while it awaits: stale
        self.wait_stats({(LEAF_ROW, c.Stat.DROP_STALE_ROUND): 1})
        for worker in (self.workers[0], self.workers[2]):
            self.data(worker, 99, 0)  # a repeat's payload is not used: the copy's partial goes up
            self.expect_packets([(self.uplink_port, self.partial(last, 7))])
        down = self.from_spine(0, 555, msg_type=c.MsgType.RESULT_RETX)
        self.expect_down(down, 555)
        self.from_spine(0, 555)
        self.wait_stats({(LEAF_ROW, c.Stat.DROP_DUPLICATE): 1})
        self.expect_silence()
        self.assert_stats({(LEAF_ROW, c.Stat.ABSORBED): 2, (LEAF_ROW, c.Stat.UP): 1,
                           (LEAF_ROW, c.Stat.UP_RETX): 2, (LEAF_ROW, c.Stat.RESULT): 1,
                           (LEAF_ROW, c.Stat.DROP_DUPLICATE): 1,
                           (LEAF_ROW, c.Stat.DROP_STALE_ROUND): 1})


class LeafTakesResultsOnlyFromItsParentForTheAwaitedRound(_LeafTest):
    """A result from another address, UDP port or switch port is not its parent's (BAD_TYPE, row 0); one
    of another epoch is stale (STALE_EPOCH); one for a round the copy does not await (another seq, a copy
    still aggregating, a copy never used) is STALE_RESULT. None writes anything: the round then ends with
    the parent's real result."""

    def runTest(self) -> None:
        self.leaf(0xA03)
        self.data(self.workers[0], 1, 1)  # copy of packet 1 aggregating (one worker of three)
        self.wait_stats({(LEAF_ROW, c.Stat.ABSORBED): 1})
        self.from_spine(1, 66)  # for a copy still aggregating its workers
        self.from_spine(2, 66)  # for a copy this epoch never used
        self.wait_stats({(LEAF_ROW, c.Stat.DROP_STALE_RESULT): 2})
        self.data(self.workers[1], 2, 1)
        self.wait_stats({(LEAF_ROW, c.Stat.ABSORBED): 2})
        last = self.data(self.workers[2], 4, 1)
        self.expect_packets([(self.uplink_port, self.partial(last, 7))])
        other_port = next(p for p in self.ports if p != self.uplink_port)
        self.from_spine(1, 66, ip="10.254.0.9")
        self.from_spine(1, 66, sport=SPINE_UDP + 1)
        self.from_spine(1, 66, port=other_port)
        self.wait_stats({(0, c.Stat.DROP_BAD_TYPE): 3})
        self.from_spine(1, 66, epoch=(self.layout.epoch + 1) & 0xFFFF or 1)
        self.from_spine(1 + 2 * SLOTS, 66)  # the copy's next round: not the one it awaits
        self.from_spine(1, 66, ver=1)  # the other copy of slot 1 (never used): not awaiting
        self.wait_stats({(LEAF_ROW, c.Stat.DROP_STALE_EPOCH): 1, (LEAF_ROW, c.Stat.DROP_STALE_RESULT): 4})
        self.expect_silence()
        down = self.from_spine(1, 1000)
        self.expect_down(down, 1000)
        self.assert_stats({(0, c.Stat.DROP_BAD_TYPE): 3, (LEAF_ROW, c.Stat.ABSORBED): 2,
                           (LEAF_ROW, c.Stat.UP): 1, (LEAF_ROW, c.Stat.DROP_STALE_RESULT): 4,
                           (LEAF_ROW, c.Stat.DROP_STALE_EPOCH): 1, (LEAF_ROW, c.Stat.RESULT): 1})


class _SpineTest(LhcTest):
    """The switch is the spine: leaf 0 (job ranks 0, 1) and leaf 1 (job ranks 2, 3, 4) behind the first two
    ports, its members 0 and 1."""

    def spine(self, job_id: int) -> None:
        self.layout, _ = fabric_job(job_id, self.ports, "spine")
        self.install_layout(self.layout)
        self.leaves = list(self.layout.workers)

    def partial(self, index: int, value: int, p: int, **fields: int) -> LhcHeader:
        leaf = self.leaves[index]
        values = {"msg_type": c.MsgType.DATA, "worker_id": leaf.rank, "job_id": self.layout.job_id,
                  "epoch": self.layout.epoch, "bitmap": LEAF_MASKS[index], **stream_position(p, SLOTS)}
        header = LhcHeader(**{**values, **fields})
        self.send(leaf.switch_port, frames.lhc_frame(
            header, lanes(value), eth_src=leaf.mac, eth_dst=frames.SWITCH_MAC, ip_src=leaf.ip,
            ip_dst=frames.SWITCH_IP, sport=leaf.udp_port, dport=c.UDP_PORT_BASE))
        return header

    def to_leaf(self, index: int, header: LhcHeader, value: int, msg_type: int) -> tuple[int, bytes]:
        leaf = self.leaves[index]
        frame = frames.lhc_frame(header.replace(msg_type=msg_type, bitmap=FULL), lanes(value),
                                 eth_src=frames.SWITCH_MAC, eth_dst=leaf.mac, ip_src=frames.SWITCH_IP,
                                 ip_dst=leaf.ip, sport=c.UDP_PORT_BASE, dport=leaf.udp_port)
        return leaf.switch_port, bytes(frame)


class SpineAggregatesItsLeaves(_SpineTest):
    """Each leaf is one member with one bit: the spine adds the two partials and sends the RESULT to each
    leaf's lhc address, with every leaf's bit in the bitmap."""

    def runTest(self) -> None:
        self.spine(0xB00)
        self.partial(0, 3, 5)
        self.wait_stats({(SPINE_ROW, c.Stat.ABSORBED): 1})
        last = self.partial(1, 30, 5)
        self.expect_packets([self.to_leaf(i, last, 33, c.MsgType.RESULT) for i in (0, 1)])
        self.assert_stats({(SPINE_ROW, c.Stat.ABSORBED): 1, (SPINE_ROW, c.Stat.RESULT): 1})


class SpineRepeatsStaleAndForeignPartials(_SpineTest):
    """A leaf's repeat while the spine aggregates is a duplicate; once finished it is answered with
    RESULT_RETX to that leaf alone; a partial of an older round is stale; a worker (not a member) and a
    leaf's partial on another switch port are not admitted. None changes the result."""

    def runTest(self) -> None:
        self.spine(0xB01)
        self.partial(0, 3, 1)
        self.partial(0, 3, 1)
        self.wait_stats({(SPINE_ROW, c.Stat.ABSORBED): 1, (SPINE_ROW, c.Stat.DROP_DUPLICATE): 1})
        worker = self.layout.workers[0]
        intruder = LhcHeader(msg_type=c.MsgType.DATA, worker_id=1, job_id=self.layout.job_id,
                             epoch=self.layout.epoch, **stream_position(1, SLOTS))
        self.send(self.ports[2], frames.lhc_frame(
            intruder, lanes(1000), eth_src="02:00:00:00:0d:01", eth_dst=frames.SWITCH_MAC,
            ip_src="10.201.0.2", ip_dst=frames.SWITCH_IP, sport=40001, dport=c.UDP_PORT_BASE))
        self.partial(1, 1000, 1, bitmap=0)  # the packet's bitmap is not what the spine counts
        self.wait_stats({(SPINE_ROW, c.Stat.RESULT): 1})
        last = LhcHeader(msg_type=c.MsgType.DATA, worker_id=self.leaves[1].rank, job_id=self.layout.job_id,
                         epoch=self.layout.epoch, bitmap=0, **stream_position(1, SLOTS))
        self.expect_packets([self.to_leaf(i, last, 1003, c.MsgType.RESULT) for i in (0, 1)])
        again = self.partial(0, 77, 1)
        self.expect_packets([self.to_leaf(0, again, 1003, c.MsgType.RESULT_RETX)])
        self.partial(1, 77, 1 + 2 * SLOTS)  # next round of the copy: starts it (leaf 1 holds result 1)
        self.wait_stats({(SPINE_ROW, c.Stat.ABSORBED): 2})
        self.partial(0, 77, 1)  # the round the copy held before: stale now
        self.partial(0, 77, 1 + 4 * SLOTS)  # the round after the one in progress: stale too
        self.send(self.ports[3], frames.lhc_frame(
            LhcHeader(msg_type=c.MsgType.DATA, worker_id=0, job_id=self.layout.job_id,
                      epoch=self.layout.epoch, **stream_position(1 + 2 * SLOTS, SLOTS)), lanes(5),
            eth_src=worker.mac, eth_dst=frames.SWITCH_MAC, ip_src=self.leaves[0].ip, ip_dst=frames.SWITCH_IP,
            sport=self.leaves[0].udp_port, dport=c.UDP_PORT_BASE))  # leaf 0's identity, wrong port
        self.wait_stats({(SPINE_ROW, c.Stat.DROP_STALE_ROUND): 2, (SPINE_ROW, c.Stat.DROP_BAD_WORKER): 2})
        self.expect_silence()
        self.assert_stats({(SPINE_ROW, c.Stat.ABSORBED): 2, (SPINE_ROW, c.Stat.DROP_DUPLICATE): 1,
                           (SPINE_ROW, c.Stat.RESULT): 1, (SPINE_ROW, c.Stat.RETX): 1,
                           (SPINE_ROW, c.Stat.DROP_STALE_ROUND): 2, (SPINE_ROW, c.Stat.DROP_BAD_WORKER): 2})
