"""Who is alive: heartbeats in memory, and the checks that fail a job whose workers are not.

Heartbeats are not persisted (one write per beat would be pointless churn): a controller that starts
gives every member a fresh grace period of its job's heartbeat timeout. Join deadlines count from the
job's creation time, which the store keeps. Only the primary controller fails jobs, since agents
heartbeat to it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from controller.path_reports import PathReports
from controller.records import JobRecord, JobState
from controller.store import JobStore
from controller.topology import Topology


class Liveness:
    def __init__(
        self,
        store: JobStore,
        *,
        period: float = 0.5,
        enabled: Callable[[], bool] = lambda: True,
        on_failed: Callable[[int, str], None] = lambda job_id, reason: None,
        topology: Topology | None = None,
    ) -> None:
        self.store = store
        self.topology = topology
        self.period = period
        self.enabled = enabled
        self.on_failed = on_failed
        self._seen: dict[tuple[int, int], float] = {}
        #: What the members' heartbeats say of their paths (``controller.path_reports``).
        self.paths = PathReports()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="liveness", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def beat(self, job_id: int, rank: int) -> None:
        with self._lock:
            self._seen[(job_id, rank)] = time.monotonic()

    def age(self, job_id: int, rank: int) -> float:
        with self._lock:
            seen = self._seen.get((job_id, rank))
        return 0.0 if seen is None else time.monotonic() - seen

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            if not self.enabled():
                # Not primary: agents heartbeat to the primary. Forget what was seen, so that taking
                # primaryship (back) starts every member's grace period afresh.
                with self._lock:
                    self._seen.clear()
                continue
            for job in self.store.jobs():
                reason = self.check(job, time.time(), time.monotonic())
                if reason and self.store.fail(job.job_id, reason):
                    self.on_failed(job.job_id, reason)

    def _expected(self, job: JobRecord, rank: int) -> str:
        """How to name a worker that never joined: its rank, and its name and address when known."""
        if not job.hosts:
            return f"rank {rank}"
        name = job.hosts[rank]
        if self.topology is not None and name in self.topology.hosts:
            return f"rank {rank} {name!r} {self.topology.hosts[name].ip}"
        return f"rank {rank} {name!r}"

    def check(self, job: JobRecord, now: float, mono: float) -> str:
        """Why ``job`` has failed, or "" while it is alive."""
        if job.state is JobState.PENDING and now - job.created_at > job.join_timeout_s:
            joined = "; ".join(m.describe() for m in job.members) or "none"
            missing = sorted(set(range(job.workers)) - {m.rank for m in job.members})
            return (
                f"{len(missing)} of {job.workers} workers did not join within {job.join_timeout_s:g} s: "
                f"{'; '.join(self._expected(job, r) for r in missing)}; joined: {joined}"
            )
        if job.state is not JobState.ACTIVE:
            return ""
        silent = []
        with self._lock:
            for m in job.members:
                if m.left:
                    continue
                seen = self._seen.setdefault((job.job_id, m.rank), mono)
                if mono - seen > job.heartbeat_timeout_s:
                    silent.append(f"{m.describe()} (silent {mono - seen:.1f} s)")
        if silent:
            return f"no heartbeat within {job.heartbeat_timeout_s:g} s from " + "; ".join(silent)
        return ""
