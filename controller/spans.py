"""Which switches a job spans, and each one's entries: the job store's job over the topology's fabric.

A job's workers each sit under one switch (``MemberRecord.switch``: the leaf its host is cabled to). A
job whose workers all sit under one switch runs there as a one-switch job (``JobRecord.layout``). One
whose workers sit under several leaves spans those leaves and the spine (docs/switch.md, "Two levels"):
``lhc_ina.fabric.fabric_entries`` builds every switch's entries, each leaf's uplink from its link in the
topology (the leaf's lhc address as its workers send to it, the spine's on that link).

The job holds the same slot range, counter row, multicast group and epoch on every switch it touches
(the controller's slot pool and rows are fabric-wide), so "one job, one range, one epoch" holds by
construction, and a slot range's epoch marks (``controller.epochs``) cover every switch.
"""

from __future__ import annotations

from collections.abc import Sequence

from controller.records import JobRecord, MemberRecord
from controller.topology import SINGLE, Topology
from lhc_ina import constants as c
from lhc_ina.fabric import FabricJob, Leaf, LeafLink, SwitchShare, fabric_entries, wire_ranks
from lhc_ina.jobs import JobEntries, WorkerEndpoint, job_entries
from lhc_ina.jobservice import errors


def member_switches(members: Sequence[MemberRecord]) -> list[str]:
    """The switches ``members`` sit under, in first-rank order."""
    return list(dict.fromkeys(m.switch or SINGLE for m in sorted(members, key=lambda m: m.rank)))


def job_switches(job: JobRecord, topology: Topology | None) -> list[str]:
    """Every switch ``job`` needs: its workers' switches, and the spine when there are several."""
    leaves = member_switches(job.members)
    if len(leaves) > 1 and topology is not None and topology.spine is not None:
        return [*leaves, topology.spine.name]
    return leaves


def wire_identity(job: JobRecord) -> tuple[dict[int, int], int]:
    """Once every worker joined: each rank's wire ``worker_id`` (its rank within its switch) and the bitmap
    of the job's results (docs/switch.md, "Ranks per level"); ({}, 0) while the job still fills. The
    leaves are numbered as ``fabric_job`` numbers them (first-rank order), so the spine's bits agree."""
    if len(job.members) != job.workers:
        return {}, 0
    switches = member_switches(job.members)
    by_switch = [[m.rank for m in job.members if (m.switch or SINGLE) == s] for s in switches]
    ids = {rank: local for rank, (_, local) in wire_ranks(by_switch).items()}
    bits = len(switches) if len(switches) > 1 else job.workers
    return ids, (1 << bits) - 1


def check_reach(name: str, members: Sequence[MemberRecord], topology: Topology | None) -> None:
    """Refuse a job whose workers the topology cannot join into one aggregation: at most ``MAX_WORKERS``
    under one switch, workers under several leaves need a spine, at most ``MAX_LEAVES`` leaves, and every
    one of those leaves a link to it."""
    leaves = member_switches(members)
    crowded = {leaf: n for leaf in leaves if (n := sum((m.switch or SINGLE) == leaf for m in members))
               > c.MAX_WORKERS}
    if crowded:
        raise errors.invalid(
            f"job {name!r}: {crowded} workers under one switch; a switch holds 1..{c.MAX_WORKERS} of a job "
            "(one bit each in its 32-bit contributor bitmap)"
        )
    if len(leaves) <= 1:
        return
    if topology is None or topology.spine is None:
        raise errors.invalid(f"job {name!r}: its workers sit under switches {leaves}, and the topology has "
                             "no spine to aggregate them")
    if len(leaves) > c.MAX_LEAVES:
        raise errors.invalid(f"job {name!r}: its workers sit under {len(leaves)} leaves; a job spans 1.."
                             f"{c.MAX_LEAVES} (one bit each in the spine's 32-bit bitmap)")
    unlinked = [leaf for leaf in leaves if leaf not in topology.links]
    if unlinked:
        raise errors.invalid(
            f"job {name!r}: its workers sit under leaves {leaves}, and {unlinked} have no link to spine "
            f"{topology.spine.name!r} in the topology: the topology cannot reach those workers together"
        )


def fabric_job(job: JobRecord, topology: Topology) -> FabricJob:
    """``job`` as a two-level job over the leaves its workers sit under (``check_reach`` holds)."""
    spine = topology.spine
    assert spine is not None
    share = SwitchShare(job.job_index, job.slot_base, job.mcast_grp)
    leaves = []
    for leaf in member_switches(job.members):
        me, link = topology.switches[leaf], topology.links[leaf]
        workers = tuple(WorkerEndpoint(m.rank, m.ip, m.udp_port, m.mac, m.switch_port)
                        for m in job.members if (m.switch or SINGLE) == leaf)
        leaves.append(Leaf(leaf, share, workers, LeafLink(
            leaf_port=link.leaf_port, spine_port=link.spine_port, leaf_mac=me.mac, leaf_ip=me.ip,
            leaf_udp_port=me.udp_port, spine_mac=link.spine_mac, spine_ip=link.spine_ip,
            spine_udp_port=link.spine_udp_port)))
    return FabricJob(job.job_id, job.epoch, job.slot_count, spine.name, share, tuple(leaves))


def job_switch_entries(job: JobRecord, topology: Topology | None, *, target: str = "v1model"
                       ) -> dict[str, JobEntries]:
    """Each switch's entries for ``job`` (ACTIVE: every worker joined), validated first; raises
    ``lhc_ina.jobs.InvalidJob`` or a ControllerError (``check_reach``) naming the problem."""
    switches = member_switches(job.members)
    if len(switches) == 1:
        return {switches[0]: job_entries(job.layout(), target=target)}
    check_reach(job.name, job.members, topology)
    assert topology is not None
    return fabric_entries(fabric_job(job, topology), target=target)
