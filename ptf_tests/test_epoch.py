"""Epochs: the controller re-admits a job with a new epoch by rewriting its `jobs` entry; the slots reset
lazily, on the first packet of the new epoch that reaches each copy, and packets of any other epoch are
dropped as DROP_STALE_EPOCH."""

from __future__ import annotations

import dataclasses

from lhc_ina import constants as c
from ptf_tests.base import LhcTest, next_epoch, reduce_round


class NewEpochResetsLazily(LhcTest):
    """A round half done under epoch E1 is abandoned: under E2 the same workers start afresh (not
    duplicates), the result holds only E2 payloads, and E1 packets are stale."""

    def runTest(self) -> None:
        job = self.add_job(0x500, 3, job_index=13)
        w0, w1, _ = job.workers
        self.contribute(job, w0, [1000] * c.LANES, slot=0, seq=1)
        self.contribute(job, w1, [2000] * c.LANES, slot=0, seq=1)
        self.wait_stats({(13, c.Stat.ABSORBED): 2})
        renewed = dataclasses.replace(job, epoch=next_epoch())
        self.client.modify(self.job_entry(renewed))
        self.contribute(job, w0, [1000] * c.LANES, slot=0, seq=1)  # old epoch
        self.wait_stats({(13, c.Stat.DROP_STALE_EPOCH): 1})
        reduce_round(
            self, renewed, [[1] * c.LANES, [2] * c.LANES, [3] * c.LANES], slot=0, seq=2, absorbed_before=2
        )
        self.assert_stats(
            {(13, c.Stat.ABSORBED): 4, (13, c.Stat.DROP_STALE_EPOCH): 1, (13, c.Stat.RESULT): 1}
        )


class FinishedCopyResetsOnNewEpoch(LhcTest):
    """A copy finished under E1 answers duplicates with RESULT_RETX; under E2 the same packet is a new
    contribution instead (absorbed), and the new round completes with E2 payloads only."""

    def runTest(self) -> None:
        job = self.add_job(0x501, 2, job_index=14)
        reduce_round(self, job, [[5] * c.LANES, [6] * c.LANES], slot=1, ver=1, seq=1)
        renewed = dataclasses.replace(job, epoch=next_epoch())
        self.client.modify(self.job_entry(renewed))
        reduce_round(self, renewed, [[7] * c.LANES, [8] * c.LANES], slot=1, ver=1, seq=1, absorbed_before=1)
        self.assert_stats({(14, c.Stat.ABSORBED): 2, (14, c.Stat.RESULT): 2})


class StaleEpochDropped(LhcTest):
    """Any epoch but the job's, older or newer, is dropped and leaves the slot untouched."""

    def runTest(self) -> None:
        job = self.add_job(0x502, 2, job_index=15)
        w0, w1 = job.workers
        for epoch in ((job.epoch - 1) & 0xFFFF, (job.epoch + 1) & 0xFFFF, 0):
            self.contribute(job, w0, [99] * c.LANES, slot=0, seq=1, epoch=epoch)
            self.contribute(job, w1, [99] * c.LANES, slot=0, seq=1, epoch=epoch)
        self.wait_stats({(15, c.Stat.DROP_STALE_EPOCH): 6})
        self.expect_silence()
        reduce_round(self, job, [[1] * c.LANES, [2] * c.LANES], slot=0, seq=1)
        self.assert_stats(
            {(15, c.Stat.DROP_STALE_EPOCH): 6, (15, c.Stat.ABSORBED): 1, (15, c.Stat.RESULT): 1}
        )
