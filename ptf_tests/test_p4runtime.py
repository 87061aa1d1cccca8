"""The P4Runtime face the controller relies on: entries and multicast groups read back as written (in
canonical byte strings), MODIFY replaces an entry's action data, and the errors of a duplicate insert and
of a delete of a missing entry name the failing update."""

from __future__ import annotations

import dataclasses

from google.rpc import code_pb2

from lhc_ina.p4rt import P4RuntimeClient, P4RuntimeError, decode_table_entry
from ptf_tests.base import SESSION_ELECTION_ID, LhcTest, next_epoch


class EntriesReadBack(LhcTest):
    def runTest(self) -> None:
        job = self.add_job(0x900, 3, job_index=20, slot_base=16, slot_count=8)
        (entry,) = self.client.read_table("LhcIngress.jobs")
        decoded = decode_table_entry(self.client.p4info, entry)
        self.assertEqual(decoded.match, {"hdr.lhc.job_id": job.job_id})
        self.assertEqual(decoded.action, "LhcIngress.set_job")
        self.assertEqual(
            decoded.params,
            {
                "job_index": 20,
                "slot_base": 16,
                "slot_count": 8,
                "fan_in": 3,
                "mcast_grp": job.mcast_grp,
                "epoch": job.epoch,
            },
        )
        self.assertEqual(entry.match, self.job_entry(job).match, "match values in canonical form")
        workers = [
            decode_table_entry(self.client.p4info, e) for e in self.client.read_table("LhcIngress.workers")
        ]
        self.assertEqual(
            sorted((w.match["hdr.lhc.worker_id"], w.params["worker_bit"]) for w in workers),
            [(w.rank, w.bit) for w in job.workers],
        )
        self.assertEqual(len(self.client.read_table("LhcEgress.replicas")), 3)
        (group,) = self.client.read_multicast_groups(job.mcast_grp)
        self.assertEqual(
            sorted((r.egress_port, r.instance) for r in group.replicas),
            [(w.port, w.rank) for w in job.workers],
        )


class ModifyReplacesActionData(LhcTest):
    def runTest(self) -> None:
        job = self.add_job(0x901, 2, job_index=21)
        renewed = dataclasses.replace(job, epoch=next_epoch(), slot_count=2)
        self.client.modify(self.job_entry(renewed))
        (entry,) = self.client.read_table("LhcIngress.jobs")
        params = decode_table_entry(self.client.p4info, entry).params
        self.assertEqual((params["epoch"], params["slot_count"]), (renewed.epoch, 2))


class WriteErrorsNameTheUpdate(LhcTest):
    def runTest(self) -> None:
        job = self.add_job(0x902, 1, job_index=22)
        with self.assertRaises(P4RuntimeError) as duplicate:
            self.client.insert(self.job_entry(job))
        self.assertIn(code_pb2.ALREADY_EXISTS, _codes(duplicate.exception), str(duplicate.exception))
        missing = self.entities.table_entry("LhcIngress.jobs", {"hdr.lhc.job_id": 0x903})
        with self.assertRaises(P4RuntimeError) as absent:
            self.client.delete(missing)
        self.assertIn(code_pb2.NOT_FOUND, _codes(absent.exception), str(absent.exception))


def _codes(error: P4RuntimeError) -> set[int]:
    """The google.rpc codes an error carries: each failing update's, and the call's own."""
    codes = {e.code for e in error.errors}
    if error.code is not None:
        codes.add(error.code.value[0])
    return codes


class BackupCannotWrite(LhcTest):
    """A second controller with a lower election id is a backup: it may read, its writes are refused with
    PERMISSION_DENIED, and the primary keeps writing."""

    def runTest(self) -> None:
        backup = P4RuntimeClient(
            self.client.address,
            device_id=self.client.device_id,
            election_id=SESSION_ELECTION_ID - 5,
            p4info=self.client.p4info,
        ).connect(require_primary=False)
        try:
            self.assertFalse(backup.is_primary)
            self.assertEqual(backup.read_table("LhcIngress.jobs"), [])
            entry = self.entities.table_entry("LhcIngress.jobs", {"hdr.lhc.job_id": 0x904})
            with self.assertRaises(P4RuntimeError) as refused:
                backup.insert(entry)
            self.assertIn(code_pb2.PERMISSION_DENIED, _codes(refused.exception), str(refused.exception))
        finally:
            backup.close()
        self.assertTrue(self.client.is_primary)
        self.add_job(0x904, 1, job_index=23)
