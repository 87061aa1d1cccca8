"""Every switch the controller drives, one ``SwitchSession`` each, and the questions asked of all of them.

One switch (no topology, or a one-switch topology) is one session, named ``switch``, at ``serve
--switch``. A leaf/spine topology gives one session per switch, at its ``p4runtime`` address and device
id, each with its own election (the same ``--election-id`` on every switch: a controller is primary or
backup for the fabric as a whole, switch by switch) and reconcile. A job is installed when every switch it
spans (``controller.spans``) holds it with its current epoch.
"""

from __future__ import annotations

import time

import grpc

from controller.records import JobRecord, JobState
from controller.session import SessionContext, SwitchSession
from controller.spans import job_switches
from controller.topology import SINGLE
from lhc_ina import constants as c
from lhc_ina.jobservice import errors
from lhc_ina.jobservice.errors import ControllerError


class Sessions:
    def __init__(self, context: SessionContext, switch_address: str, *, device_id: int = 1) -> None:
        self.topology, self.target = context.topology, context.target
        if self.topology is not None and self.topology.fabric:
            places = [(s.name, s.p4runtime, s.device_id) for s in self.topology.switches.values()]
        else:
            places = [(SINGLE, switch_address, device_id)]
        self.by_name = {name: SwitchSession(context, address, device_id=device, name=name,
                                            on_renewed=self._on_renewed)
                        for name, address, device in places}

    @property
    def all(self) -> list[SwitchSession]:
        return list(self.by_name.values())

    def role(self, name: str) -> str:
        known = self.topology is not None and name in self.topology.switches
        return self.topology.switches[name].role if known else SINGLE

    def start(self) -> None:
        for session in self.all:
            session.start()

    def stop(self) -> None:
        for session in self.all:
            session.stop()

    def request_reconcile(self) -> None:
        for session in self.all:
            session.request_reconcile()

    def _on_renewed(self, renewed: dict[int, int]) -> None:
        """A switch came back empty and renewed its jobs' epochs: every switch must carry the new ones."""
        self.request_reconcile()

    def sync(self, timeout: float) -> bool:
        """Reconcile every switch now and wait (at most ``timeout`` s in all) until each equals the store;
        False when one could not be done in time (away, not primary)."""
        deadline = time.monotonic() + timeout
        tickets = [(session, session.request_reconcile()) for session in self.all]
        done = [session.wait_served(ticket, max(0.0, deadline - time.monotonic()))
                for session, ticket in tickets]
        return all(done)

    def switches_of(self, job: JobRecord) -> list[str]:
        return job_switches(job, self.topology)

    def installed(self, job: JobRecord) -> bool:
        """ACTIVE, and every switch it spans held its entries with its current epoch at its last reconcile."""
        if job.state is not JobState.ACTIVE:
            return False
        names = self.switches_of(job)
        return bool(names) and all(
            name in self.by_name and self.by_name[name].status.installed.get(job.job_id) == job.epoch
            for name in names
        )

    def require_primary(self) -> None:
        """Refuse a mutating call while a switch runs another pipeline, or another controller is primary."""
        for name, session in self.by_name.items():
            status = session.status
            who = "the switch" if name == SINGLE else f"switch {name}"
            if status.mismatch:
                raise errors.precondition(
                    f"{who} runs a different pipeline than the {self.target.name} target's: {status.mismatch}"
                )
            if status.connected and not status.primary:
                raise ControllerError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"this controller is a backup (another one is primary for {who})",
                )

    def counters(self, job: JobRecord) -> dict[str, list[int]]:
        """The job's ``lhc_stats`` row on each switch it spans (that answers), by switch name."""
        rows = {}
        for name in self.switches_of(job) or [next(iter(self.by_name))]:
            session = self.by_name.get(name)
            read = session.read_counters() if session is not None else None
            if read is not None:
                rows[name] = read.get(job.job_index, [0] * c.NUM_STATS)
        return rows
