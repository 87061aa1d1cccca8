"""Duplicates: a worker's second packet for a copy that still aggregates is dropped (DROP_DUPLICATE) and
adds nothing; once the copy is finished, a duplicate is answered by a unicast RESULT_RETX carrying the
stored result, whatever payload the duplicate carried."""

from __future__ import annotations

from lhc_ina import constants as c
from ptf_tests import frames
from ptf_tests.base import LhcTest, reduce_round


class DuplicateWhileAggregating(LhcTest):
    def runTest(self) -> None:
        job = self.add_job(0x300, 3, job_index=7)
        w0, w1, w2 = job.workers
        p0, p1, p2 = [5] * c.LANES, [7] * c.LANES, [11] * c.LANES
        self.contribute(job, w0, p0, slot=1, seq=4)
        self.contribute(job, w0, [1000] * c.LANES, slot=1, seq=4)  # same worker again: not added
        self.wait_stats({(7, c.Stat.ABSORBED): 1, (7, c.Stat.DROP_DUPLICATE): 1})
        self.contribute(job, w1, p1, slot=1, seq=4)
        self.contribute(job, w1, p1, slot=1, seq=4)
        self.wait_stats({(7, c.Stat.ABSORBED): 2, (7, c.Stat.DROP_DUPLICATE): 2})
        self.expect_silence()
        last = self.contribute(job, w2, p2, slot=1, seq=4)
        self.expect_result(job, last, frames.aggregate([p0, p1, p2], c.Op.ADD))
        self.assert_stats({(7, c.Stat.ABSORBED): 2, (7, c.Stat.DROP_DUPLICATE): 2, (7, c.Stat.RESULT): 1})


class RetransmissionAfterCompletion(LhcTest):
    """Every worker may ask again; each asker alone gets the result, from the switch's address."""

    def runTest(self) -> None:
        job = self.add_job(0x301, 3, job_index=8)
        payloads = [[i + 1] * c.LANES for i in range(3)]
        result = reduce_round(self, job, payloads, slot=2, ver=1, seq=77)
        for asker in (job.workers[1], job.workers[0], job.workers[1]):
            garbage = [0xDEAD] * c.LANES  # the reply carries the stored result, not this
            sent = self.contribute(job, asker, garbage, slot=2, ver=1, seq=77)
            self.expect_retx(asker, sent, result, job.full_mask)
        self.assert_stats({(8, c.Stat.ABSORBED): 2, (8, c.Stat.RESULT): 1, (8, c.Stat.RETX): 3})


class RetransmissionOnAnyPort(LhcTest):
    """The RESULT_RETX swaps the UDP ports too: it goes back to the port the worker sent to."""

    def runTest(self) -> None:
        job = self.add_job(0x302, 1, job_index=9)
        dport = c.UDP_PORT_BASE + 3
        w0 = job.workers[0]
        last = self.contribute(job, w0, [3] * c.LANES, slot=0, seq=1, dport=dport)
        self.expect_result(job, last, [3] * c.LANES, dport=dport)
        again = self.contribute(job, w0, [3] * c.LANES, slot=0, seq=1, dport=dport)
        self.expect_retx(w0, again, [3] * c.LANES, w0.bit, dport=dport)
        self.assert_stats({(9, c.Stat.RESULT): 1, (9, c.Stat.RETX): 1})
