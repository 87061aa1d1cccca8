"""Admission drops, counted by reason: unknown job (row 0), unknown worker and spoofed source address
(DROP_BAD_WORKER), slot out of the job's range or past the registers (DROP_SLOT_RANGE). A dropped packet
contributes nothing: the round that follows is exact. And when several checks fail, the first one in the
order of docs/switch.md names the outcome."""

from __future__ import annotations

from lhc_ina import constants as c
from ptf_tests import frames
from ptf_tests.base import LhcTest, reduce_round

J = 18  # job index (counter row)


class UnknownJob(LhcTest):
    def runTest(self) -> None:
        job = self.add_job(0x700, 2, job_index=J)
        w0 = job.workers[0]
        for job_id in (0x701, 0, 0xFFFF):
            self.send(w0.port, frames.data_frame(w0, job.header(w0, job_id=job_id, seq=1), [1] * c.LANES))
        self.wait_stats({(0, c.Stat.DROP_UNKNOWN_JOB): 3})
        self.expect_silence()
        self.assert_stats({(0, c.Stat.DROP_UNKNOWN_JOB): 3})


class UnknownWorker(LhcTest):
    """A rank that the job does not admit (from an address nobody uses) is dropped in the job's row."""

    def runTest(self) -> None:
        job = self.add_job(0x702, 2, job_index=J)
        stranger = frames.make_workers(0x702, 6, self.ports)[5]  # rank 5 of a 2-worker job
        self.send(stranger.port, frames.data_frame(stranger, job.header(stranger, seq=1), [50] * c.LANES))
        self.wait_stats({(J, c.Stat.DROP_BAD_WORKER): 1})
        reduce_round(self, job, [[1] * c.LANES, [2] * c.LANES], seq=1)
        self.assert_stats({(J, c.Stat.DROP_BAD_WORKER): 1, (J, c.Stat.ABSORBED): 1, (J, c.Stat.RESULT): 1})


class SpoofedSource(LhcTest):
    """Worker 1's rank from worker 0's address, or from an address outside the job, contributes nothing."""

    def runTest(self) -> None:
        job = self.add_job(0x703, 2, job_index=J)
        w0, w1 = job.workers
        for src_ip in (w0.ip, "10.99.99.99"):
            frame = frames.data_frame(w1, job.header(w1, seq=1), [500] * c.LANES, src_ip=src_ip)
            self.send(w1.port, frame)
        self.wait_stats({(J, c.Stat.DROP_BAD_WORKER): 2})
        self.expect_silence()
        reduce_round(self, job, [[1] * c.LANES, [2] * c.LANES], seq=1)
        self.assert_stats({(J, c.Stat.DROP_BAD_WORKER): 2, (J, c.Stat.ABSORBED): 1, (J, c.Stat.RESULT): 1})


class SlotOutOfRange(LhcTest):
    def runTest(self) -> None:
        job = self.add_job(0x704, 1, job_index=J, slot_base=8, slot_count=4)
        w0 = job.workers[0]
        for slot in (4, 5, 0xFFFF):
            self.contribute(job, w0, [1] * c.LANES, slot=slot, seq=1)
        self.wait_stats({(J, c.Stat.DROP_SLOT_RANGE): 3})
        self.expect_silence()
        last = self.contribute(job, w0, [9] * c.LANES, slot=3, seq=1)  # the last slot in range works
        self.expect_result(job, last, [9] * c.LANES)
        self.assert_stats({(J, c.Stat.DROP_SLOT_RANGE): 3, (J, c.Stat.RESULT): 1})


class SlotPastTheRegisters(LhcTest):
    """A job entry that overruns the registers (slot_base + slot >= MAX_SLOTS) is guarded per packet.
    Admission rejects such a job, so the entry is broken on purpose, after validation."""

    def runTest(self) -> None:
        job = self.add_job(
            0x705, 1, job_index=J, slot_base=c.MAX_SLOTS - 2, slot_count=2, broken={"slot_count": 8}
        )
        w0 = job.workers[0]
        last = self.contribute(job, w0, [4] * c.LANES, slot=1, seq=1)  # cell MAX_SLOTS - 1: fine
        self.expect_result(job, last, [4] * c.LANES)
        for slot in (2, 7):
            self.contribute(job, w0, [4] * c.LANES, slot=slot, seq=1)
        self.wait_stats({(J, c.Stat.DROP_SLOT_RANGE): 2})
        self.expect_silence()
        self.assert_stats({(J, c.Stat.RESULT): 1, (J, c.Stat.DROP_SLOT_RANGE): 2})


class CheckOrder(LhcTest):
    """Each packet fails several checks; the outcome is the first failing step of docs/switch.md:
    malformed < type < op < job < epoch < slot < worker."""

    def runTest(self) -> None:
        job = self.add_job(0x706, 2, job_index=J, slot_count=4)
        w0 = job.workers[0]
        stranger = frames.make_workers(0x706, 9, self.ports)[8]
        stale = (job.epoch + 1) & 0xFFFF
        cases = [
            (
                w0,
                {"flags": 1, "msg_type": c.MsgType.CONTROL, "op": 3, "job_id": 0x7FF},
                (0, c.Stat.DROP_MALFORMED),
            ),
            (w0, {"msg_type": c.MsgType.RESULT, "op": 3, "job_id": 0x7FF}, (0, c.Stat.DROP_BAD_TYPE)),
            (w0, {"op": 2, "job_id": 0x7FF}, (0, c.Stat.DROP_BAD_OP)),
            (w0, {"job_id": 0x7FF, "epoch": stale}, (0, c.Stat.DROP_UNKNOWN_JOB)),
            (stranger, {"epoch": stale, "slot": 4}, (J, c.Stat.DROP_STALE_EPOCH)),
            (stranger, {"slot": 4}, (J, c.Stat.DROP_SLOT_RANGE)),
            (stranger, {"slot": 3}, (J, c.Stat.DROP_BAD_WORKER)),
        ]
        expected: dict[tuple[int, c.Stat], int] = {}
        for sender, fields, outcome in cases:
            self.send(
                sender.port, frames.data_frame(sender, job.header(sender, seq=1, **fields), [1] * c.LANES)
            )
            expected[outcome] = expected.get(outcome, 0) + 1
            self.wait_stats(expected)
        self.expect_silence()
        self.assert_stats(expected)
