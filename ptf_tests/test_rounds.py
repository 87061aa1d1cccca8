"""Round identity: a packet starts a round of its slot copy only when it is that copy's next round (its
seq is the copy's round + 2 * slot_count), joins only the round in progress, is answered with RESULT_RETX
when it repeats the finished round, and is otherwise dropped as DROP_STALE_ROUND (docs/switch.md, "Round
identity"). Packet p of the stream is slot p mod S, copy (p div S) mod 2, seq p, with S = slot_count.

Each test here fails on a switch that takes any packet whose bit is clear in a finished copy for the first
packet of a new round: a delayed copy of an old packet would then overwrite the finished result and start
a round with stale values."""

from __future__ import annotations

from lhc_ina import constants as c
from ptf_tests.base import LhcTest

ROW = 20  # the job index (counter row) of every test here


def lanes(value: int) -> list[int]:
    return [value] * c.LANES


class GhostRoundTwoWorkers(LhcTest):
    """W = 2, S = 1: A1 = 1, B1 = 10 -> 11; A2 = 2; a late duplicate of A1; B2 = 20 -> 22; A3 = 3;
    B3 = 30 -> 33 with the full bitmap. The duplicate is answered (RESULT_RETX of 11) and starts
    nothing, so round 3 is exact."""

    def runTest(self) -> None:
        job = self.add_job(0x900, 2, job_index=ROW, slot_count=1)
        a, b = job.workers
        a1 = self.contribute(job, a, lanes(1), **job.position(1))
        self.wait_stats({(ROW, c.Stat.ABSORBED): 1})
        b1 = self.contribute(job, b, lanes(10), **job.position(1))
        self.expect_result(job, b1, lanes(11))
        self.contribute(job, a, lanes(2), **job.position(2))
        self.wait_stats({(ROW, c.Stat.ABSORBED): 2})
        self.contribute(job, a, lanes(1), **job.position(1))  # the late duplicate of A1
        self.expect_retx(a, a1, lanes(11), job.full_mask)
        b2 = self.contribute(job, b, lanes(20), **job.position(2))
        self.expect_result(job, b2, lanes(22))
        self.contribute(job, a, lanes(3), **job.position(3))
        self.wait_stats({(ROW, c.Stat.ABSORBED): 3})
        b3 = self.contribute(job, b, lanes(30), **job.position(3))
        self.expect_result(job, b3, lanes(33))
        self.assert_stats({(ROW, c.Stat.ABSORBED): 3, (ROW, c.Stat.RESULT): 3, (ROW, c.Stat.RETX): 1})


class GhostRoundLostCopy(LhcTest):
    """W = 3, S = 1, and C lost its copy of result 1: A and B send packet 2; a late duplicate of A1
    arrives; C retransmits packet 1 twice. Each repeat is answered with result 1, so C gets its result;
    C2 then finishes round 2 exactly."""

    def runTest(self) -> None:
        job = self.add_job(0x901, 3, job_index=ROW, slot_count=1)
        a, b, w_c = job.workers
        self.contribute(job, a, lanes(1), **job.position(1))
        self.contribute(job, b, lanes(2), **job.position(1))
        self.wait_stats({(ROW, c.Stat.ABSORBED): 2})
        c1 = self.contribute(job, w_c, lanes(4), **job.position(1))
        self.expect_result(job, c1, lanes(7))  # C's copy is "lost" on its way to C's host
        self.contribute(job, a, lanes(10), **job.position(2))
        self.contribute(job, b, lanes(20), **job.position(2))
        self.wait_stats({(ROW, c.Stat.ABSORBED): 4})
        a1 = self.contribute(job, a, lanes(1), **job.position(1))  # the late duplicate of A1
        self.expect_retx(a, a1, lanes(7), job.full_mask)
        for _ in range(2):
            again = self.contribute(job, w_c, lanes(4), **job.position(1))
            self.expect_retx(w_c, again, lanes(7), job.full_mask)
        c2 = self.contribute(job, w_c, lanes(40), **job.position(2))
        self.expect_result(job, c2, lanes(70))
        self.assert_stats({(ROW, c.Stat.ABSORBED): 4, (ROW, c.Stat.RESULT): 2, (ROW, c.Stat.RETX): 3})


class DelayedByManyRounds(LhcTest):
    """W = 2, S = 2, after packets 0..7 (two rounds of each copy): A sends packet 9, the next round of
    (slot 1, copy 0). Copies of packets 1, 3 and 5, delayed by up to four rounds, then arrive: neither
    the copy's round nor its next one, so each is dropped as DROP_STALE_ROUND, joins nothing and starts
    nothing; a delayed copy of B7 repeats a finished round and is answered; B9 then finishes round 9
    with A9 + B9 exactly."""

    def runTest(self) -> None:
        job = self.add_job(0x902, 2, job_index=ROW, slot_count=2)
        a, b = job.workers
        for p in range(8):
            self.contribute(job, a, lanes(p), **job.position(p))
            self.wait_stats({(ROW, c.Stat.ABSORBED): p + 1})
            last = self.contribute(job, b, lanes(100 * p), **job.position(p))
            self.expect_result(job, last, lanes(101 * p))
        self.contribute(job, a, lanes(9), **job.position(9))
        self.wait_stats({(ROW, c.Stat.ABSORBED): 9})
        for sender, p in ((b, 1), (a, 5), (b, 5), (a, 3)):
            self.contribute(job, sender, lanes(1000 + p), **job.position(p))
        self.wait_stats({(ROW, c.Stat.DROP_STALE_ROUND): 4})
        self.expect_silence()
        # A delayed copy of B7 repeats the finished round 7 of (slot 1, copy 1): answered.
        b7 = self.contribute(job, b, lanes(1007), **job.position(7))
        self.expect_retx(b, b7, lanes(707), job.full_mask)
        last = self.contribute(job, b, lanes(900), **job.position(9))
        self.expect_result(job, last, lanes(909))
        self.assert_stats(
            {
                (ROW, c.Stat.ABSORBED): 9,
                (ROW, c.Stat.RESULT): 9,
                (ROW, c.Stat.DROP_STALE_ROUND): 4,
                (ROW, c.Stat.RETX): 1,
            }
        )


class LateDuplicateAfterCompletion(LhcTest):
    """W = 2, S = 4: round 0 and then round 4 (the other copy) finish, so both workers left copy 0. A
    delayed duplicate of B's packet 0 is a repeat of copy 0's finished round: answered with result 0 and
    nothing else (B no longer waits for it and drops it); copy 0's next round, packet 8, is exact."""

    def runTest(self) -> None:
        job = self.add_job(0x903, 2, job_index=ROW, slot_count=4)
        a, b = job.workers
        for n, p in enumerate((0, 4)):
            self.contribute(job, a, lanes(p + 1), **job.position(p))
            self.wait_stats({(ROW, c.Stat.ABSORBED): n + 1})
            last = self.contribute(job, b, lanes(10 * (p + 1)), **job.position(p))
            self.expect_result(job, last, lanes(11 * (p + 1)))
        late = self.contribute(job, b, lanes(10), **job.position(0))
        self.expect_retx(b, late, lanes(11), job.full_mask)
        self.contribute(job, a, lanes(8), **job.position(8))
        self.wait_stats({(ROW, c.Stat.ABSORBED): 3})
        last = self.contribute(job, b, lanes(80), **job.position(8))
        self.expect_result(job, last, lanes(88))
        self.assert_stats({(ROW, c.Stat.ABSORBED): 3, (ROW, c.Stat.RESULT): 3, (ROW, c.Stat.RETX): 1})


class ReorderingWithinTheWindow(LhcTest):
    """W = 2, S = 2: B's packets 1 and 0 arrive in reverse order; A's retransmission of packet 0 arrives
    after A's packet 2 (which A sent on holding result 0), then A's retransmission of packet 2. The first
    repeat is answered (result 0), the second is a duplicate of a round in progress; every result is
    exact."""

    def runTest(self) -> None:
        job = self.add_job(0x904, 2, job_index=ROW, slot_count=2)
        a, b = job.workers
        self.contribute(job, a, lanes(1), **job.position(0))
        self.contribute(job, a, lanes(2), **job.position(1))
        self.wait_stats({(ROW, c.Stat.ABSORBED): 2})
        b1 = self.contribute(job, b, lanes(20), **job.position(1))
        self.expect_result(job, b1, lanes(22))
        b0 = self.contribute(job, b, lanes(10), **job.position(0))
        self.expect_result(job, b0, lanes(11))
        self.contribute(job, a, lanes(3), **job.position(2))
        self.wait_stats({(ROW, c.Stat.ABSORBED): 3})
        a0 = self.contribute(job, a, lanes(1), **job.position(0))  # A's retransmission of packet 0
        self.expect_retx(a, a0, lanes(11), job.full_mask)
        self.contribute(job, a, lanes(3), **job.position(2))  # and of packet 2: its round is in progress
        self.wait_stats({(ROW, c.Stat.DROP_DUPLICATE): 1})
        self.contribute(job, b, lanes(40), **job.position(3))  # B: packet 3 before packet 2
        self.wait_stats({(ROW, c.Stat.ABSORBED): 4})
        b2 = self.contribute(job, b, lanes(30), **job.position(2))
        self.expect_result(job, b2, lanes(33))
        a3 = self.contribute(job, a, lanes(4), **job.position(3))
        self.expect_result(job, a3, lanes(44))
        self.assert_stats(
            {
                (ROW, c.Stat.ABSORBED): 4,
                (ROW, c.Stat.RESULT): 4,
                (ROW, c.Stat.RETX): 1,
                (ROW, c.Stat.DROP_DUPLICATE): 1,
            }
        )
