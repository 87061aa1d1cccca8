"""One job across a leaf/spine fabric: which ranks sit under which leaf, and each switch's entries.

A two-level job (docs/switch.md, "Two levels: leaf and spine") is one job id, one epoch and one
``slot_count`` on every switch it touches; each switch has its own counter row, slot range and multicast
group. A leaf aggregates its own workers and sends the partial up through its `uplinks` entry; the spine
admits each leaf as one member with one bit (the leaf's index), which stands for all the leaf's workers
because a leaf sends up only complete partials. Ranks are per level (docs/switch.md, "Ranks per level"):
the description holds job-global ranks (0..W-1, W up to ``MAX_JOB_WORKERS``), and each worker's wire
``worker_id`` is its rank within its leaf (:func:`wire_ranks`). :func:`fabric_layouts` turns a
:class:`FabricJob` into one :class:`~lhc_ina.jobs.JobLayout` per switch, after the checks that no single
switch can make (the leaves' ranks cover 0..W-1 once, at most ``MAX_LEAVES`` leaves), and
:func:`fabric_entries` gives each switch's entries through :func:`~lhc_ina.jobs.job_entries`, which
validates each layout as for a one-switch job.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from lhc_ina import constants as c
from lhc_ina.jobs import (
    InvalidJob,
    JobEntries,
    JobLayout,
    Target,
    Uplink,
    WorkerEndpoint,
    job_entries,
)


@dataclass(frozen=True)
class LeafLink:
    """The link between one leaf and the spine, and the lhc addresses at its two ends.

    ``leaf_ip``/``leaf_udp_port``/``leaf_mac`` are the leaf's address as its workers send to it: the spine's
    results for this leaf are addressed there, and the leaf sources its workers' results from it. The
    spine's address is where the leaf sends its partial; the spine's results come from it."""

    leaf_port: int
    spine_port: int
    leaf_mac: str
    leaf_ip: str
    leaf_udp_port: int
    spine_mac: str
    spine_ip: str
    spine_udp_port: int = c.UDP_PORT_BASE


@dataclass(frozen=True)
class SwitchShare:
    """What admission gave the job on one switch: its counter row, slot range and multicast group."""

    job_index: int
    slot_base: int
    mcast_grp: int


@dataclass(frozen=True)
class Leaf:
    """A leaf of the job: its switch, its share of it, its workers (job-global ranks) and its link up."""

    switch: str
    share: SwitchShare
    workers: tuple[WorkerEndpoint, ...]
    link: LeafLink

    def local_workers(self) -> tuple[WorkerEndpoint, ...]:
        """The leaf's workers as the leaf admits them: numbered 0..n-1 in the order of their job ranks."""
        ordered = sorted(self.workers, key=lambda w: w.rank)
        return tuple(replace(w, rank=i) for i, w in enumerate(ordered))


@dataclass(frozen=True)
class FabricJob:
    """One job over a spine and its leaves (two levels)."""

    job_id: int
    epoch: int
    slot_count: int
    spine: str
    spine_share: SwitchShare
    leaves: tuple[Leaf, ...]

    @property
    def world_size(self) -> int:
        return sum(len(leaf.workers) for leaf in self.leaves)

    @property
    def result_mask(self) -> int:
        """The bitmap of the spine's results: one bit per leaf, every leaf in (so every worker)."""
        return (1 << len(self.leaves)) - 1


def wire_ranks(leaves: Sequence[Sequence[int]]) -> dict[int, tuple[int, int]]:
    """Job rank -> (leaf index, rank within the leaf) for leaves given as their workers' job ranks, in
    leaf order: the wire ``worker_id`` of a worker is its rank within its leaf, and the leaf's index is
    its bit at the spine."""
    return {rank: (index, local) for index, ranks in enumerate(leaves)
            for local, rank in enumerate(sorted(ranks))}


def _fail(job: FabricJob, message: str) -> InvalidJob:
    return InvalidJob(f"job {job.job_id}: {message}")


def _check_fabric(job: FabricJob) -> None:
    """What no one switch's layout shows: the leaves' ranks cover 0..W-1 once, switches are distinct."""
    if not job.leaves:
        raise _fail(job, "a two-level job needs at least one leaf")
    if any(not leaf.workers for leaf in job.leaves):
        empty = [leaf.switch for leaf in job.leaves if not leaf.workers]
        raise _fail(job, f"leaves {empty} have no workers (a leaf that contributes nothing never completes)")
    switches = [job.spine, *(leaf.switch for leaf in job.leaves)]
    if len(set(switches)) != len(switches):
        raise _fail(job, f"switches must be distinct, got spine {job.spine!r} and leaves "
                         f"{[leaf.switch for leaf in job.leaves]}")
    if len(job.leaves) > c.MAX_LEAVES:
        raise _fail(job, f"{len(job.leaves)} leaves; a job spans 1..{c.MAX_LEAVES} (one bit each in the "
                         "spine's 32-bit bitmap)")
    crowded = [leaf.switch for leaf in job.leaves if len(leaf.workers) > c.MAX_WORKERS]
    if crowded:
        raise _fail(job, f"leaves {crowded} hold more than {c.MAX_WORKERS} workers of the job (one bit "
                         "each in a leaf's 32-bit bitmap)")
    ranks = sorted(w.rank for leaf in job.leaves for w in leaf.workers)
    if ranks != list(range(len(ranks))):
        shown = ranks if len(ranks) <= 40 else f"{len(ranks)} ranks from {ranks[0]} to {ranks[-1]}"
        raise _fail(job, f"the leaves' ranks must be 0..{len(ranks) - 1} once each, got {shown}")


def leaf_layout(job: FabricJob, index: int) -> JobLayout:
    """Leaf ``index``'s own job: its workers by their rank within it, and its uplink to the spine under its
    index; its results carry the spine's mask of leaves."""
    leaf = job.leaves[index]
    link = leaf.link
    uplink = Uplink(
        port=link.leaf_port, worker_id=index, src_mac=link.leaf_mac, dst_mac=link.spine_mac,
        src_addr=link.leaf_ip, dst_addr=link.spine_ip, src_port=link.leaf_udp_port,
        dst_port=link.spine_udp_port,
    )
    share = leaf.share
    return JobLayout(job.job_id, share.job_index, share.slot_base, job.slot_count, job.epoch, share.mcast_grp,
                     leaf.local_workers(), uplink=uplink, result_mask=job.result_mask)


def spine_layout(job: FabricJob) -> JobLayout:
    """The spine's job: one member per leaf (rank = the leaf's index), reached over its link."""
    members = tuple(
        WorkerEndpoint(rank=index, ip=leaf.link.leaf_ip, udp_port=leaf.link.leaf_udp_port,
                       mac=leaf.link.leaf_mac, switch_port=leaf.link.spine_port, leaf=True)
        for index, leaf in enumerate(job.leaves)
    )
    share = job.spine_share
    return JobLayout(job.job_id, share.job_index, share.slot_base, job.slot_count, job.epoch, share.mcast_grp,
                     members)


def fabric_layouts(job: FabricJob) -> dict[str, JobLayout]:
    """Each switch's layout of ``job``, by switch name; raises :class:`InvalidJob` for a fabric-wide
    fault (the per-switch ones are :func:`~lhc_ina.jobs.validate`'s)."""
    _check_fabric(job)
    layouts = {leaf.switch: leaf_layout(job, i) for i, leaf in enumerate(job.leaves)}
    layouts[job.spine] = spine_layout(job)
    return layouts


def fabric_entries(
    job: FabricJob, *, target: Target = "v1model", stamped_epochs: Mapping[str, Collection[int]] | None = None
) -> dict[str, JobEntries]:
    """Each switch's entries and multicast group for ``job``, every layout validated first (none is
    returned unless all are valid). ``stamped_epochs`` maps a switch to the epochs its job's slot range
    may still carry there (as for :func:`~lhc_ina.jobs.validate`)."""
    stamped = stamped_epochs or {}
    layouts = fabric_layouts(job)
    return {switch: job_entries(layout, target=target, stamped_epochs=stamped.get(switch, ()))
            for switch, layout in layouts.items()}
