"""Jobs larger than one bitmap (docs/switch.md, "Ranks per level"): the switch under test is leaf 1 of a
40-worker job, holding 32 of them (job ranks 8..39, its ranks 0..31: every bit of its bitmap), while leaf
0 (8 workers) and the spine are played by the test.

On the wire a worker is its rank within the leaf: the leaf's partial carries all 32 bits and goes up under
the leaf's index (1); the spine's result carries one bit per leaf (0b11), and that is what the leaf stores,
multicasts to its 32 workers and answers repeats with. A worker that sends its job rank instead of its
rank within the leaf is not admitted.
"""

from __future__ import annotations

from lhc_ina import constants as c
from lhc_ina.fabric import FabricJob, Leaf, LeafLink, SwitchShare, fabric_layouts
from lhc_ina.jobs import WorkerEndpoint
from lhc_ina.wire import LhcHeader, stream_position
from ptf_tests import frames
from ptf_tests.base import LhcTest, next_epoch
from ptf_tests.frames import Worker

ROW = 26  # the leaf's job index (counter row)
SPINE_MAC, SPINE_IP, SPINE_UDP = "02:00:00:00:0f:02", "10.253.0.1", c.UDP_PORT_BASE + 9
SLOTS = 2
PER_LEAF = (8, c.MAX_WORKERS)  # 40 workers: more than one bitmap holds
RESULT_MASK = 0b11  # the spine's: one bit per leaf
LEAF_MASK = (1 << c.MAX_WORKERS) - 1  # the leaf's own: its 32 workers


def lanes(value: int) -> list[int]:
    return [value] * c.LANES


class _LargeLeafTest(LhcTest):
    """The switch is leaf 1 (32 workers over the first ports, its uplink the last port)."""

    def leaf(self, job_id: int) -> None:
        leaves, first = [], 0
        for index, count in enumerate(PER_LEAF):
            workers = tuple(
                WorkerEndpoint(r, f"10.{job_id & 0xFF}.{index}.{r + 1}", 40000 + r,
                               f"02:00:{job_id & 0xFF:02x}:00:{index:02x}:{r + 1:02x}",
                               self.ports[r % (len(self.ports) - 1)])
                for r in range(first, first + count))
            first += count
            if index == 1:  # under test: its workers address it at SWITCH_IP:UDP_PORT_BASE
                link = LeafLink(leaf_port=self.ports[-1], spine_port=5, leaf_mac=frames.SWITCH_MAC,
                                leaf_ip=frames.SWITCH_IP, leaf_udp_port=c.UDP_PORT_BASE, spine_mac=SPINE_MAC,
                                spine_ip=SPINE_IP, spine_udp_port=SPINE_UDP)
            else:
                link = LeafLink(leaf_port=self.ports[-1], spine_port=4, leaf_mac="02:00:00:00:0e:10",
                                leaf_ip="10.200.0.254", leaf_udp_port=c.UDP_PORT_BASE + 1,
                                spine_mac=SPINE_MAC, spine_ip=SPINE_IP, spine_udp_port=SPINE_UDP)
            leaves.append(Leaf(f"leaf{index}", SwitchShare(ROW, 0, job_id), workers, link))
        spine = SwitchShare(ROW + 1, 8, job_id)
        fabric = FabricJob(job_id, next_epoch(), SLOTS, "spine", spine, tuple(leaves))
        self.layout = fabric_layouts(fabric)["leaf1"]
        self.install_layout(self.layout)
        self.workers = [Worker(w.rank, w.switch_port, w.mac, w.ip, w.udp_port) for w in self.layout.workers]
        assert [w.rank for w in self.workers] == list(range(c.MAX_WORKERS))

    def data(self, worker: Worker, value: int, p: int, **fields: int) -> LhcHeader:
        header = LhcHeader(msg_type=c.MsgType.DATA, job_id=self.layout.job_id, epoch=self.layout.epoch,
                           **{"worker_id": worker.rank, **stream_position(p, SLOTS), **fields})
        self.send(worker.port, frames.data_frame(worker, header, lanes(value)))
        return header

    def all_in(self, p: int) -> LhcHeader:
        """Every worker of the leaf sends packet ``p`` (worker i adds i + 1); the last one's header."""
        for worker in self.workers[:-1]:
            self.data(worker, worker.rank + 1, p)
        self.wait_stats({(ROW, c.Stat.ABSORBED): c.MAX_WORKERS - 1})
        return self.data(self.workers[-1], c.MAX_WORKERS, p)

    def partial(self, last: LhcHeader, value: int) -> tuple[int, bytes]:
        """The leaf's partial for ``last``'s round, out of the uplink: its index, all 32 of its bits."""
        frame = frames.lhc_frame(last.replace(worker_id=1, bitmap=LEAF_MASK), lanes(value),
                                 eth_src=frames.SWITCH_MAC, eth_dst=SPINE_MAC, ip_src=frames.SWITCH_IP,
                                 ip_dst=SPINE_IP, sport=c.UDP_PORT_BASE, dport=SPINE_UDP)
        return self.ports[-1], bytes(frame)

    def from_spine(self, p: int, value: int) -> LhcHeader:
        header = LhcHeader(msg_type=c.MsgType.RESULT, worker_id=0, job_id=self.layout.job_id,
                           epoch=self.layout.epoch, bitmap=RESULT_MASK, **stream_position(p, SLOTS))
        self.send(self.ports[-1], frames.lhc_frame(
            header, lanes(value), eth_src=SPINE_MAC, eth_dst=frames.SWITCH_MAC, ip_src=SPINE_IP,
            ip_dst=frames.SWITCH_IP, sport=SPINE_UDP, dport=c.UDP_PORT_BASE))
        return header


class LargeLeafSendsAFullPartialAndDeliversTheLeavesMask(_LargeLeafTest):
    """32 workers in: one partial up under the leaf's index with all 32 bits and the sum of the 32; the
    spine's result (0b11) goes to all 32 workers as it came, and a repeat is answered with it."""

    def runTest(self) -> None:
        self.leaf(0xC00)
        last = self.all_in(3)
        total = c.MAX_WORKERS * (c.MAX_WORKERS + 1) // 2
        self.expect_packets([self.partial(last, total)])
        down = self.from_spine(3, 5000)
        self.expect_packets([(w.port, frames.result_copy(down, lanes(5000), RESULT_MASK, w))
                             for w in self.workers])
        asker = self.workers[31]  # the top bit of the leaf's bitmap
        again = self.data(asker, 1, 3)
        self.expect_retx(asker, again, lanes(5000), RESULT_MASK)
        self.assert_stats({(ROW, c.Stat.ABSORBED): c.MAX_WORKERS - 1, (ROW, c.Stat.UP): 1,
                           (ROW, c.Stat.RESULT): 1, (ROW, c.Stat.RETX): 1})


class LargeLeafAdmitsRanksWithinTheLeafOnly(_LargeLeafTest):
    """A worker that sends its job rank (8 + its rank within the leaf) is not admitted; a repeat while the
    leaf aggregates is a duplicate; while it awaits the spine, a repeat sends the partial up again."""

    def runTest(self) -> None:
        self.leaf(0xC01)
        worker = self.workers[5]
        self.data(worker, 1, 1, worker_id=8 + worker.rank)  # its job rank: no such member here
        self.data(worker, 1, 1)
        self.data(worker, 1, 1)  # a repeat while the round aggregates
        self.wait_stats({(ROW, c.Stat.DROP_BAD_WORKER): 1, (ROW, c.Stat.ABSORBED): 1,
                         (ROW, c.Stat.DROP_DUPLICATE): 1})
        for other in self.workers:
            if other is not worker and other is not self.workers[-1]:
                self.data(other, 1, 1)
        self.wait_stats({(ROW, c.Stat.ABSORBED): c.MAX_WORKERS - 1})
        last = self.data(self.workers[-1], 1, 1)
        self.expect_packets([self.partial(last, c.MAX_WORKERS)])
        repeat = self.data(worker, 1, 1)  # awaiting the spine: the partial goes up again
        self.expect_packets([self.partial(repeat, c.MAX_WORKERS)])
        self.assert_stats({(ROW, c.Stat.DROP_BAD_WORKER): 1, (ROW, c.Stat.ABSORBED): c.MAX_WORKERS - 1,
                           (ROW, c.Stat.DROP_DUPLICATE): 1, (ROW, c.Stat.UP): 1, (ROW, c.Stat.UP_RETX): 1})
