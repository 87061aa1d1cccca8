"""Jobs and members as the store holds them, and their conversion to the switch's `JobLayout`."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from lhc_ina.jobs import JobLayout, WorkerEndpoint


class JobState(str, Enum):
    PENDING = "PENDING"
    ACTIVE = "ACTIVE"
    FAILED = "FAILED"


@dataclass(frozen=True)
class MemberRecord:
    rank: int
    name: str
    ip: str
    udp_port: int
    mac: str
    switch_port: int
    left: bool = False
    #: The switch the worker sits under (a fabric's leaf; "" or "switch" for the one switch).
    switch: str = ""

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.udp_port}"

    def describe(self) -> str:
        """``rank 2 'h3' 10.0.0.3:40000``: how failures and logs name a worker."""
        return f"rank {self.rank} {self.name!r} {self.address}"


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
