"""Basic reduction: W workers (1, 2, 3, 8, 32) each send one DATA packet to a slot; the last one's packet
becomes the RESULT, multicast to every worker with the job's replica rewrites (docs/switch.md, step 8).

With 8 PTF ports, 32 workers share ports four by four: every copy that leaves a shared port must carry its
own worker's addresses."""

from __future__ import annotations

import random

from lhc_ina import constants as c
from ptf_tests import frames
from ptf_tests.base import LhcTest, reduce_round


class _Reduction(LhcTest):
    def reduce(self, workers: int) -> None:
        job = self.add_job(0x100 + workers, workers, job_index=workers, slot_count=4)
        rng = random.Random(workers)
        payloads = [[rng.randrange(-(2**24), 2**24) for _ in range(c.LANES)] for _ in range(workers)]
        reduce_round(self, job, payloads, slot=2, ver=0, seq=1000 + workers)
        self.assert_stats({(job.job_index, c.Stat.ABSORBED): workers - 1, (job.job_index, c.Stat.RESULT): 1})


class OneWorker(_Reduction):
    """W = 1: the first contribution is also the last, so it is multicast at once."""

    def runTest(self) -> None:
        self.reduce(1)


class TwoWorkers(_Reduction):
    def runTest(self) -> None:
        self.reduce(2)


class ThreeWorkers(_Reduction):
    def runTest(self) -> None:
        self.reduce(3)


class EightWorkers(_Reduction):
    def runTest(self) -> None:
        self.reduce(8)


class ThirtyTwoWorkers(_Reduction):
    """MAX_WORKERS: the top worker bit (1 << 31) and several workers per port."""

    def runTest(self) -> None:
        self.assertGreater(c.MAX_WORKERS, len(self.ports), "the point is workers sharing ports")
        self.reduce(c.MAX_WORKERS)


class AnyPortInRangeAnyAddress(LhcTest):
    """A packet is lhc whatever its destination address, on any UDP port of the range; the result's source
    is the address and port the workers used."""

    def runTest(self) -> None:
        job = self.add_job(0x120, 2, job_index=3)
        dport = c.UDP_PORT_BASE + c.UDP_PORT_COUNT - 1
        switch_ip = "192.0.2.77"
        a, b = [1] * c.LANES, list(range(c.LANES))
        self.contribute(job, job.workers[0], a, slot=1, seq=5, switch_ip=switch_ip, dport=dport)
        self.wait_stats({(3, c.Stat.ABSORBED): 1})
        last = self.contribute(job, job.workers[1], b, slot=1, seq=5, switch_ip=switch_ip, dport=dport)
        self.expect_result(
            job, last, [x + y for x, y in zip(a, b, strict=True)], switch_ip=switch_ip, dport=dport
        )
        self.assert_stats({(3, c.Stat.ABSORBED): 1, (3, c.Stat.RESULT): 1})


class FanInBelowAdmitted(LhcTest):
    """The slot completes after `fan_in` distinct workers, whichever they are; the result goes to the
    whole group and its bitmap names the contributors."""

    def runTest(self) -> None:
        job = self.add_job(0x121, 3, job_index=3, fan_in=2)
        w0, _, w2 = job.workers
        self.contribute(job, w2, [5] * c.LANES, slot=0, seq=1)
        self.wait_stats({(3, c.Stat.ABSORBED): 1})
        last = self.contribute(job, w0, [6] * c.LANES, slot=0, seq=1)
        self.expect_result(job, last, [11] * c.LANES, bitmap=w0.bit | w2.bit)
        self.assert_stats({(3, c.Stat.ABSORBED): 1, (3, c.Stat.RESULT): 1})


class ReplicaWithoutRewriteDropped(LhcTest):
    """A multicast copy whose (job, rank) has no `replicas` entry is dropped in egress; the others leave."""

    def runTest(self) -> None:
        workers = frames.make_workers(0x122, 3, self.ports)
        job = self.add_job(0x122, workers, job_index=3, rewrites=workers[:2])
        self.contribute(job, workers[0], [1] * c.LANES, slot=0, seq=1)
        self.contribute(job, workers[1], [2] * c.LANES, slot=0, seq=1)
        self.wait_stats({(3, c.Stat.ABSORBED): 2})
        last = self.contribute(job, workers[2], [3] * c.LANES, slot=0, seq=1)
        copies = [(w.port, frames.result_copy(last, [6] * c.LANES, job.full_mask, w)) for w in workers[:2]]
        self.expect_packets(copies)
        self.assert_stats({(3, c.Stat.ABSORBED): 2, (3, c.Stat.RESULT): 1})


class ResultEchoesTheFinishingPacket(LhcTest):
    """The result is the finishing packet rewritten: its seq, worker_id, ver and IPv4 TTL and TOS stay
    (an lhc packet is not routed, so even TTL 1 aggregates); the bitmap a worker sent is replaced. (Both
    packets carry the round's seq; the finishing one differs from the first in worker_id, TOS and TTL.)"""

    def runTest(self) -> None:
        job = self.add_job(0x123, 2, job_index=3)
        w0, w1 = job.workers
        first = frames.data_frame(w0, job.header(w0, slot=5, ver=1, seq=13, bitmap=0xFFFF), [1] * c.LANES)
        self.send(w0.port, frames.with_ip(first, ttl=9, tos=0x10))
        self.wait_stats({(3, c.Stat.ABSORBED): 1})
        last = job.header(w1, slot=5, ver=1, seq=13, bitmap=0xFFFF)
        self.send(w1.port, frames.with_ip(frames.data_frame(w1, last, [2] * c.LANES), ttl=1, tos=0x28))
        copies = [
            (
                w.port,
                frames.with_ip(frames.result_copy(last, [3] * c.LANES, job.full_mask, w), ttl=1, tos=0x28),
            )
            for w in job.workers
        ]
        self.expect_packets(copies)
        self.assert_stats({(3, c.Stat.ABSORBED): 1, (3, c.Stat.RESULT): 1})
