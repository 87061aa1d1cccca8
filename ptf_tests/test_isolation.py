"""Tenant isolation on the data plane (docs/controller.md, "Threat model"): two jobs run a round each while
a worker of the other tenant, or a process forging a worker's identity, attacks the first. Every attack
is dropped and counted under its own reason, and both rounds end exact, their results going to their own
workers only.

One test per attack: another job's id, another worker's id, a worker's address from another UDP port or
another switch port, a stale epoch, a slot outside the attacker's range, and a forged first packet whose
bogus seq would otherwise pin a fresh slot copy's round so that the real packets were dropped as stale."""

from __future__ import annotations

from lhc_ina import constants as c
from ptf_tests import frames
from ptf_tests.base import Job, LhcTest

A, B = 22, 23  # job indexes (counter rows) of the attacked job and of the attacker's
SEQ = 1
SLOT = 1
BOGUS_SEQ = 0x7E57_0000


class _Isolation(LhcTest):
    """Job A (3 workers) and job B (2 workers) in neighbouring slot ranges; :meth:`attack` sends its
    frames while both rounds are open (or, with ``first``, before any real packet reaches the copy) and
    returns the counter cells they must move."""

    first = False

    def attack(self, a: Job, b: Job) -> dict[tuple[int, c.Stat], int]:
        raise NotImplementedError

    def runTest(self) -> None:
        a = self.add_job(0x800, 3, job_index=A, slot_base=0, slot_count=4)
        b = self.add_job(0x801, 2, job_index=B, slot_base=4, slot_count=4)
        pa = [[(w + 1) * 3] * c.LANES for w in range(3)]
        pb = [[(w + 1) * 1000] * c.LANES for w in range(2)]
        drops: dict[tuple[int, c.Stat], int] = {}
        if self.first:
            drops = self.attack(a, b)
            self.wait_stats(drops)
        for job, payloads in ((a, pa), (b, pb)):
            for worker, words in zip(job.workers[:-1], payloads[:-1], strict=True):
                self.contribute(job, worker, words, slot=SLOT, seq=SEQ)
        absorbed = {(A, c.Stat.ABSORBED): 2, (B, c.Stat.ABSORBED): 1}
        self.wait_stats(absorbed)
        if not self.first:
            drops = self.attack(a, b)
            self.wait_stats({**absorbed, **drops})
        self.expect_silence()
        for job, payloads in ((a, pa), (b, pb)):
            last = self.contribute(job, job.workers[-1], payloads[-1], slot=SLOT, seq=SEQ)
            self.expect_result(job, last, frames.aggregate(payloads, c.Op.ADD))
        self.assert_stats({**absorbed, **drops, (A, c.Stat.RESULT): 1, (B, c.Stat.RESULT): 1})

    def forge(self, sender: frames.Worker, job: Job, *, port: int | None = None, **fields: int | str) -> None:
        """One DATA frame of ``sender``'s identity (header fields and source overridable), 10,000 in every
        lane, sent on ``port`` (default: the sender's own)."""
        source = {k: fields.pop(k) for k in ("src_ip", "sport") if k in fields}
        header = job.header(sender, **{"slot": SLOT, "seq": SEQ, **fields})
        frame = frames.data_frame(sender, header, [10_000] * c.LANES, **source)
        self.send(sender.port if port is None else port, frame)


def _other_port(test: LhcTest, worker: frames.Worker) -> int:
    return next(p for p in test.ports if p != worker.port)


class AnotherJobsId(_Isolation):
    """B's worker, from its own address, sends A's job id, epoch and round as A's rank 0 and rank 1."""

    def attack(self, a: Job, b: Job) -> dict[tuple[int, c.Stat], int]:
        intruder = b.workers[0]
        for rank in (0, 2):
            self.forge(intruder, a, worker_id=rank)
        return {(A, c.Stat.DROP_BAD_WORKER): 2}


class AnotherWorkersId(_Isolation):
    """A's rank 1 (or B's rank 1) claims A's rank 2, whose packet would finish the round early."""

    def attack(self, a: Job, b: Job) -> dict[tuple[int, c.Stat], int]:
        self.forge(a.workers[1], a, worker_id=2)
        self.forge(b.workers[1], a, worker_id=2)
        return {(A, c.Stat.DROP_BAD_WORKER): 2}


class AnotherUdpPort(_Isolation):
    """Rank 2's address and rank, from another UDP port of its host (another process there): the review's
    attack that once returned 1002 where 3 was due."""

    def attack(self, a: Job, b: Job) -> dict[tuple[int, c.Stat], int]:
        victim = a.workers[2]
        for sport in (victim.udp_port + 1, 12345):
            self.forge(victim, a, sport=sport)
        return {(A, c.Stat.DROP_BAD_WORKER): 2}


class AnotherSwitchPort(_Isolation):
    """Rank 2's whole identity (address, UDP port, rank) arriving on a switch port that does not reach it."""

    def attack(self, a: Job, b: Job) -> dict[tuple[int, c.Stat], int]:
        victim = a.workers[2]
        self.forge(victim, a, port=_other_port(self, victim))
        return {(A, c.Stat.DROP_BAD_WORKER): 1}


class StaleEpoch(_Isolation):
    """A's rank 2 with an epoch A no longer has (a worker of an earlier admission, or a replay)."""

    def attack(self, a: Job, b: Job) -> dict[tuple[int, c.Stat], int]:
        for epoch in ((a.epoch - 1) & 0xFFFF, (a.epoch + 1) & 0xFFFF):
            self.forge(a.workers[2], a, epoch=epoch)
        return {(A, c.Stat.DROP_STALE_EPOCH): 2}


class SlotOutsideTheRange(_Isolation):
    """B's worker, in its own job, aims past B's range at cells that would be A's (B's slot 4 and up are
    no cell of B; A's base is below B's, and a wrapping slot would land there)."""

    def attack(self, a: Job, b: Job) -> dict[tuple[int, c.Stat], int]:
        for slot in (b.slot_count, 0xFFFF - b.slot_base + 1 + SLOT):
            self.forge(b.workers[0], b, slot=slot)
        return {(B, c.Stat.DROP_SLOT_RANGE): 2}


class PinningSeq(_Isolation):
    """Before any real packet reaches A's copy, forged first packets with a bogus seq (rank 0's address from
    another UDP port, and from another switch port): had one started the copy's round, the real packets
    would be dropped as stale and the job would stall."""

    first = True

    def attack(self, a: Job, b: Job) -> dict[tuple[int, c.Stat], int]:
        victim = a.workers[0]
        self.forge(victim, a, seq=BOGUS_SEQ, sport=victim.udp_port + 7)
        self.forge(victim, a, seq=BOGUS_SEQ, port=_other_port(self, victim))
        return {(A, c.Stat.DROP_BAD_WORKER): 2}


# PTF runs every class of the module that has a runTest: the base is not a test of its own.
del _Isolation
