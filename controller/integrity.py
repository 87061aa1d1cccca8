"""Invariants of a job store, checked as a whole: what the crash tests assert after kill -9, and what
``serve`` checks at start (a store that breaks them is refused, not reconciled onto a switch)."""

from __future__ import annotations

from controller.records import JobState
from controller.slots import SlotPool, SlotPoolError, SlotRange
from controller.store import JobStore
from controller.topology import SINGLE, Topology
from lhc_ina import constants as c


def store_problems(store: JobStore, topology: Topology | None = None) -> list[str]:
    """Every broken invariant, as sentences; empty for a consistent store. Ranks are distinct and below
    W (a pending job may have holes left by workers who left before it started). With a topology, every
    member sits under one of its switches (a topology that lost a leaf with workers on it is refused)."""
    problems = []
    switches = set(topology.switches) if topology is not None and topology.fabric else {SINGLE}
    jobs = store.jobs()
    pool = SlotPool(c.MAX_SLOTS)
    for job in sorted(jobs, key=lambda j: j.slot_base):
        try:
            pool.take(SlotRange(job.slot_base, job.slot_count))
        except SlotPoolError as exc:
            problems.append(f"job {job.name!r}: {exc} (ranges overlap)")
    indexes = [j.job_index for j in jobs]
    if len(set(indexes)) != len(indexes) or not all(0 < i < c.MAX_JOBS for i in indexes):
        problems.append(f"job indexes {sorted(indexes)} are not distinct values in 1..{c.MAX_JOBS - 1}")
    epochs = [j.epoch for j in jobs]
    if len(set(epochs)) != len(epochs):
        problems.append(f"two jobs share an epoch: {sorted(epochs)}")
    for job in jobs:
        ranks = [m.rank for m in job.members]
        if len(set(ranks)) != len(ranks) or not all(0 <= r < job.workers for r in ranks):
            problems.append(f"job {job.name!r}: ranks {ranks} for {job.workers} workers")
        full = len(ranks) == job.workers
        if job.state is JobState.ACTIVE and not full:
            problems.append(f"job {job.name!r} is ACTIVE with {len(ranks)} of {job.workers} workers")
        if job.state is JobState.PENDING and full:
            problems.append(f"job {job.name!r} is PENDING with all its workers")
        lost = sorted({m.switch or SINGLE for m in job.members} - switches)
        if lost:
            problems.append(f"job {job.name!r} has workers under {lost}, which the topology has not")
        if job.state is JobState.FAILED and not job.failure:
            problems.append(f"job {job.name!r} FAILED without a reason")
    return problems
