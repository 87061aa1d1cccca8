"""The two shadow copies of a slot: rounds alternate between ver 0 and ver 1 and a copy is reused for its
next round once every worker has moved on; until then a finished copy keeps answering retransmissions."""

from __future__ import annotations

from lhc_ina import constants as c
from ptf_tests.base import LhcTest, reduce_round


class BothCopiesAndSlotReuse(LhcTest):
    """ver 0, ver 1, then ver 0 again on the same slot (packets 1, 1 + S, 1 + 2S of the stream): each
    round's result holds only its own payloads."""

    def runTest(self) -> None:
        job = self.add_job(0x400, 3, job_index=10, slot_count=2)
        rounds = [[[10 * r + w] * c.LANES for w in range(3)] for r in range(3)]
        for r, payloads in enumerate(rounds):
            at = job.position(1 + r * job.slot_count)
            result = reduce_round(self, job, payloads, **at, absorbed_before=2 * r)
            self.assertEqual(result, [30 * r + 3] * c.LANES)
        self.assert_stats({(10, c.Stat.ABSORBED): 6, (10, c.Stat.RESULT): 3})


class FinishedCopyOutlivesTheNextRound(LhcTest):
    """After ver 0 finishes, worker 0 starts ver 1; worker 1, which lost the result, retransmits on ver 0
    and gets it, with the bitmap of the round's contributors."""

    def runTest(self) -> None:
        job = self.add_job(0x401, 2, job_index=11)
        w0, w1 = job.workers
        now, later = job.position(0), job.position(job.slot_count)  # slot 0, copy 0 then copy 1
        first = reduce_round(self, job, [[1] * c.LANES, [2] * c.LANES], **now)
        self.contribute(job, w0, [40] * c.LANES, **later)
        self.wait_stats({(11, c.Stat.ABSORBED): 2})
        asked = self.contribute(job, w1, [2] * c.LANES, **now)
        self.expect_retx(w1, asked, first, job.full_mask)
        last = self.contribute(job, w1, [2] * c.LANES, **later)
        self.expect_result(job, last, [42] * c.LANES)
        self.assert_stats({(11, c.Stat.ABSORBED): 2, (11, c.Stat.RESULT): 2, (11, c.Stat.RETX): 1})


class CopiesAggregateIndependently(LhcTest):
    """Four slots in flight at once, two on each copy (as a window of outstanding packets has them): each
    (slot, ver) sums only its own contributions. (A worker never has both copies of one slot in flight:
    it moves to the other copy only once it holds this one's result.)"""

    def runTest(self) -> None:
        job = self.add_job(0x402, 2, job_index=12, slot_count=4)
        w0, w1 = job.workers
        cells = [(0, 0), (1, 1), (3, 0), (2, 1)]
        for n, (slot, ver) in enumerate(cells):
            self.contribute(job, w0, [n + 1] * c.LANES, slot=slot, ver=ver, seq=n)
        self.wait_stats({(12, c.Stat.ABSORBED): 4})
        for n, (slot, ver) in enumerate(cells):
            last = self.contribute(job, w1, [100 * (n + 1)] * c.LANES, slot=slot, ver=ver, seq=n)
            self.expect_result(job, last, [101 * (n + 1)] * c.LANES)
        self.assert_stats({(12, c.Stat.ABSORBED): 4, (12, c.Stat.RESULT): 4})
