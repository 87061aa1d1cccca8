"""Two jobs in disjoint slot ranges: the same job-relative slot maps to different register cells, each
job's result goes to its own workers only, and each job counts in its own row."""

from __future__ import annotations

from lhc_ina import constants as c
from ptf_tests import frames
from ptf_tests.base import LhcTest

A, B = 16, 17  # job indexes (counter rows)


class TwoJobsNeverInterfere(LhcTest):
    def runTest(self) -> None:
        a = self.add_job(0x600, 3, job_index=A, slot_base=0, slot_count=4)
        b = self.add_job(0x601, 2, job_index=B, slot_base=4, slot_count=4)
        pa = [[1 + w] * c.LANES for w in range(3)]
        pb = [[100 * (1 + w)] * c.LANES for w in range(2)]
        for slot in (0, 3):  # both jobs use job-relative slots 0 and 3 on copy 0, interleaved
            self.contribute(a, a.workers[0], pa[0], slot=slot, seq=slot)
            self.contribute(b, b.workers[0], pb[0], slot=slot, seq=slot)
            self.contribute(a, a.workers[1], pa[1], slot=slot, seq=slot)
        self.wait_stats({(A, c.Stat.ABSORBED): 4, (B, c.Stat.ABSORBED): 2})
        for slot in (0, 3):
            last_b = self.contribute(b, b.workers[1], pb[1], slot=slot, seq=slot)
            self.expect_result(b, last_b, frames.aggregate(pb, c.Op.ADD))
            last_a = self.contribute(a, a.workers[2], pa[2], slot=slot, seq=slot)
            self.expect_result(a, last_a, frames.aggregate(pa, c.Op.ADD))
        self.assert_stats(
            {
                (A, c.Stat.ABSORBED): 4,
                (A, c.Stat.RESULT): 2,
                (B, c.Stat.ABSORBED): 2,
                (B, c.Stat.RESULT): 2,
            }
        )


class SlotRangeGuardsTheNeighbour(LhcTest):
    """Job A's slot 4 would be job B's slot 0 if the range were not checked: it is dropped, and B's
    round on that cell is exact."""

    def runTest(self) -> None:
        a = self.add_job(0x602, 1, job_index=A, slot_base=0, slot_count=4)
        b = self.add_job(0x603, 2, job_index=B, slot_base=4, slot_count=4)
        self.contribute(b, b.workers[0], [1] * c.LANES, slot=0, seq=1)
        self.contribute(a, a.workers[0], [1000] * c.LANES, slot=4, seq=1)
        self.wait_stats({(A, c.Stat.DROP_SLOT_RANGE): 1, (B, c.Stat.ABSORBED): 1})
        last = self.contribute(b, b.workers[1], [2] * c.LANES, slot=0, seq=1)
        self.expect_result(b, last, [3] * c.LANES)
        self.assert_stats({(A, c.Stat.DROP_SLOT_RANGE): 1, (B, c.Stat.ABSORBED): 1, (B, c.Stat.RESULT): 1})


class WorkerOfAnotherJob(LhcTest):
    """Admission is per job: a worker of job A sending for job B (same rank, A's address) is rejected in
    B's row."""

    def runTest(self) -> None:
        a = self.add_job(0x604, 2, job_index=A, slot_base=0, slot_count=4)
        b = self.add_job(0x605, 2, job_index=B, slot_base=4, slot_count=4)
        intruder = a.workers[0]
        self.send(
            intruder.port, frames.data_frame(intruder, b.header(intruder, slot=0, seq=1), [7] * c.LANES)
        )
        self.wait_stats({(B, c.Stat.DROP_BAD_WORKER): 1})
        self.expect_silence()
        self.assert_stats({(B, c.Stat.DROP_BAD_WORKER): 1})
