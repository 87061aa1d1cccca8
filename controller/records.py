"""Jobs and members as the store holds them, and their conversion to the switch's `JobLayout`."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from lhc_ina.jobs import JobLayout, WorkerEndpoint
from lhc_ina.jobservice.client import Peer


class JobState(str, Enum):
    PENDING = "PENDING"
    ACTIVE = "ACTIVE"
    FAILED = "FAILED"


@dataclass(frozen=True)
class MemberRecord(Peer):
    """A member as the store keeps it: what its peers are told (``Peer``), whether it left, and where."""

    left: bool = False
    #: The switch the worker sits under (a fabric's leaf; "" or "switch" for the one switch).
    switch: str = ""


@dataclass(frozen=True)
class JobRecord:
    job_id: int
    name: str
    state: JobState
    workers: int
    slot_base: int
    slot_count: int
    lanes: int
    job_index: int
    epoch: int
    join_timeout_s: float
    heartbeat_timeout_s: float
    created_at: float
    failure: str = ""
    epoch_changes: int = 0
    #: The expected workers' names in rank order (empty: any workers, ranks in join order).
    hosts: tuple[str, ...] = ()
    members: tuple[MemberRecord, ...] = field(default_factory=tuple)

    @property
    def mcast_grp(self) -> int:
        """One multicast group per counter row: the job index (1..MAX_JOBS-1) is never 0 and unique."""
        return self.job_index

    def member(self, rank: int) -> MemberRecord | None:
        return next((m for m in self.members if m.rank == rank), None)

    def layout(self) -> JobLayout:
        """What the switch holds for this job (only meaningful once every worker joined)."""
        return JobLayout(
            job_id=self.job_id,
            job_index=self.job_index,
            slot_base=self.slot_base,
            slot_count=self.slot_count,
            epoch=self.epoch,
            mcast_grp=self.mcast_grp,
            workers=tuple(
                WorkerEndpoint(m.rank, m.ip, m.udp_port, m.mac, m.switch_port) for m in self.members
            ),
        )
