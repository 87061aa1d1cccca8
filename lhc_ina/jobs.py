"""A job as the switch holds it, and the one validated function that turns it into table entries.

The data plane trusts its tables (docs/switch.md, "Admission invariants"): a `worker_bit` of 0, a `fan_in`
of 0, a multicast group 0, a job index past the counter or a slot range past the registers all make the
switch misbehave without a word. Every job model in the tree (the controller, the PTF suite, softswitch's
test helpers) therefore goes through :func:`job_entries`, which rejects such a job with an error that names
the broken invariant, and describes the entries by P4Info names so that each caller turns them into its
own messages.

A job may span two levels of switches (docs/switch.md, "Two levels: leaf and spine"): a leaf's layout has an
:class:`Uplink` to its parent, and the parent's layout has one member per leaf (:attr:`WorkerEndpoint.leaf`).
Ranks are per level (docs/switch.md, "Ranks per level"): every layout's members are ranks 0..n-1 with one
bitmap bit each, a leaf's workers by their rank within the leaf, a spine's leaves by their index.
``lhc_ina.fabric`` builds both from one description of the job.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from lhc_ina import constants as c

JOBS_TABLE = "LhcIngress.jobs"
WORKERS_TABLE = "LhcIngress.workers"
REPLICAS_TABLE = "LhcEgress.replicas"
UPLINKS_TABLE = "LhcIngress.uplinks"
SET_JOB = "LhcIngress.set_job"
ADMIT_WORKER = "LhcIngress.admit_worker"
SET_REPLICA_DST = "LhcEgress.set_replica_dst"
SET_UPLINK = "LhcIngress.set_uplink"
#: TNA only (p4src/tna): what a round's bitmap means for the job, one entry per job.
FULL_ROUND_TABLE = "LhcIngress.full_round"
ROUND_IS_FULL = "LhcIngress.round_is_full"
ROUND_AWAITS_PARENT = "LhcIngress.round_awaits_parent"

#: Widths of the action parameters the checks below guard (docs/switch.md, "Names").
_EPOCH_BITS = 16
_JOB_ID_BITS = 16
_MCAST_GRP_BITS = 16
_PORT_BITS = 9
#: v1model's drop port (511 for 9-bit ports): a replica there is never delivered.
DROP_PORT = (1 << _PORT_BITS) - 1
#: The data planes a job can be validated for.
Target = Literal["v1model", "tna"]
_MAC = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")


class InvalidJob(ValueError):
    """A job that breaks an admission invariant; the message names the job and the invariant."""


@dataclass(frozen=True)
class WorkerEndpoint:
    """Where one member of a job lives on the data plane: a worker, or at a spine a leaf switch (``leaf``).

    ``rank`` is the member's rank on this switch, its wire ``worker_id``, and its bit is ``1 << rank``: a
    worker's rank within its leaf (its job rank on a one-switch job), a leaf's index among the job's
    leaves at the spine. A leaf sends up only complete partials, so its one bit stands for all its
    workers."""

    rank: int
    ip: str
    udp_port: int
    mac: str
    switch_port: int
    leaf: bool = False

    @property
    def bit(self) -> int:
        return 1 << self.rank


@dataclass(frozen=True)
class Uplink:
    """A leaf's way to its parent for one job: the port towards the parent and the addresses of the
    partial it sends up (DATA from ``src_*`` to ``dst_*``). The parent's results come back from the
    ``dst_*`` address on that port and are accepted from nowhere else. ``src_addr``/``src_port`` (and
    ``src_mac``) must be the address the leaf's workers send to: the leaf's results to them are sourced
    from where the parent's result was addressed. ``worker_id`` is the leaf's rank at the parent (its
    index among the job's leaves)."""

    port: int
    worker_id: int
    src_mac: str
    dst_mac: str
    src_addr: str
    dst_addr: str
    src_port: int
    dst_port: int


@dataclass(frozen=True)
class JobLayout:
    """What admission decided for one job: ids, its slot range, its epoch, its group and its workers.

    ``fan_in`` defaults to the number of workers; a smaller value (tests only) completes a round with the
    first ``fan_in`` distinct contributors. ``uplink`` makes the switch a leaf of a two-level job, and
    ``result_mask`` is then the bitmap of its parent's results (the mask of the job's leaves;
    ``lhc_ina.fabric`` sets it): workers check results against it.
    0 means the members' own mask.
    """

    job_id: int
    job_index: int
    slot_base: int
    slot_count: int
    epoch: int
    mcast_grp: int
    workers: tuple[WorkerEndpoint, ...]
    fan_in: int = 0
    uplink: Uplink | None = None
    result_mask: int = 0

    @property
    def world_size(self) -> int:
        return self.fan_in or len(self.workers)

    @property
    def countdown(self) -> int:
        """`set_job`'s ``fan_in``: the contributions a round of this switch counts down. A leaf counts
        its parent's result as one more, so a copy whose workers are all in (count-down 1) awaits it."""
        return self.world_size + (1 if self.uplink is not None else 0)

    @property
    def full_mask(self) -> int:
        return sum(w.bit for w in self.workers)


@dataclass(frozen=True)
class TableEntrySpec:
    """One table entry by P4Info names. Hashable: desired and actual state compare as sets."""

    table: str
    match: tuple[tuple[str, int], ...]
    action: str
    params: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class MulticastGroupSpec:
    """A PRE multicast group: replicas as (egress_port, instance = rank), in rank order."""

    group_id: int
    replicas: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class JobEntries:
    """Everything the switch needs for one job: the `jobs` entry, a leaf's `uplinks` entry, one `workers`
    and one `replicas` entry per member, and the multicast group."""

    tables: tuple[TableEntrySpec, ...]
    group: MulticastGroupSpec


def ip_to_int(address: str) -> int:
    return int(ipaddress.IPv4Address(address))


def mac_to_int(mac: str) -> int:
    return int(mac.replace(":", ""), 16)


def _require(condition: bool, job: JobLayout, message: str) -> None:
    if not condition:
        raise InvalidJob(f"job {job.job_id}: {message}")


def _check_worker(job: JobLayout, worker: WorkerEndpoint) -> None:
    who = f"rank {worker.rank}"
    try:
        ipaddress.IPv4Address(worker.ip)
    except ValueError:
        raise InvalidJob(f"job {job.job_id}: {who}: {worker.ip!r} is not an IPv4 address") from None
    _require(bool(_MAC.match(worker.mac)), job, f"{who}: {worker.mac!r} is not a MAC address (aa:bb:..)")
    _require(0 < worker.udp_port < 1 << 16, job, f"{who}: UDP port {worker.udp_port} is outside 1..65535")
    in_range = worker.udp_port & c.UDP_PORT_MASK == c.UDP_PORT_BASE
    if worker.leaf:
        _require(
            in_range, job,
            f"{who} (a leaf): UDP port {worker.udp_port} is outside the lhc range; the leaf would not parse "
            "the results sent there",
        )
    else:
        _require(
            not in_range, job,
            f"{who}: UDP port {worker.udp_port} is in the lhc range; results sent there would be taken for "
            "DATA",
        )
    _require(
        0 <= worker.switch_port < DROP_PORT, job,
        f"{who}: switch port {worker.switch_port} is outside 0..{DROP_PORT - 1} ({DROP_PORT} drops)",
    )


def validate(job: JobLayout, *, target: Target = "v1model", stamped_epochs: Collection[int] = ()) -> None:
    """Raise :class:`InvalidJob` unless the data plane can run ``job`` exactly (docs/switch.md, "Admission
    invariants").

    ``target`` "tna" adds Tofino's limits (one pipe, no recirculation port). ``stamped_epochs`` are the
    epochs that cells of the job's slot range may still carry from earlier jobs (the controller's record):
    reusing one would revive their state, so it is rejected."""
    _require(0 <= job.job_id < 1 << _JOB_ID_BITS, job, f"job id must fit {_JOB_ID_BITS} bits")
    _require(
        0 < job.job_index < c.MAX_JOBS, job,
        f"job index {job.job_index} must be in 1..{c.MAX_JOBS - 1} (row 0 counts packets of no job; "
        "a larger index has no counter row)",
    )
    _require(job.slot_count > 0, job, "slot count must be at least 1")
    _require(
        job.slot_base >= 0 and job.slot_base + job.slot_count <= c.MAX_SLOTS, job,
        f"slots {job.slot_base}..{job.slot_base + job.slot_count - 1} run past the switch's "
        f"{c.MAX_SLOTS} slots",
    )
    _require(
        0 < job.epoch < 1 << _EPOCH_BITS, job,
        f"epoch {job.epoch} must be in 1..{(1 << _EPOCH_BITS) - 1} (0 is the registers' reset value)",
    )
    _require(
        0 < job.mcast_grp < 1 << _MCAST_GRP_BITS, job,
        f"multicast group {job.mcast_grp} must be in 1..{(1 << _MCAST_GRP_BITS) - 1} (0 means no "
        "multicast: results would leave by port 0)",
    )
    count = len(job.workers)
    _require(
        0 < count <= c.MAX_WORKERS, job,
        f"{count} members on one switch; a switch holds 1..{c.MAX_WORKERS} of a job (one bit each in the "
        f"32-bit contributor bitmap; up to {c.MAX_JOB_WORKERS} workers span {c.MAX_LEAVES} leaves and a "
        "spine)",
    )
    ranks = sorted(w.rank for w in job.workers)
    _require(ranks == list(range(count)), job, f"ranks must be 0..{count - 1} once each, got {ranks}")
    _require(
        0 < job.world_size <= count, job,
        f"fan-in {job.world_size} must be in 1..{count} (0 never completes a round)",
    )
    if job.uplink is not None:
        _check_uplink(job, job.uplink)
    _require(
        job.result_mask == 0 or (job.uplink is not None and 0 < job.result_mask < 1 << c.MAX_LEAVES
                                 and job.result_mask >> job.uplink.worker_id & 1),
        job, f"result mask {job.result_mask:#x} must be a leaf's parent's mask of leaves, holding the leaf's "
             "own bit",
    )
    seen: dict[tuple[str, int], int] = {}
    for worker in job.workers:
        _check_worker(job, worker)
        address = (worker.ip, worker.udp_port)
        _require(
            address not in seen, job,
            f"ranks {seen.get(address)} and {worker.rank} share the address {worker.ip}:{worker.udp_port}",
        )
        seen[address] = worker.rank
    _require(
        job.epoch not in stamped_epochs, job,
        f"epoch {job.epoch} may still stamp cells of slots {job.slot_base}.."
        f"{job.slot_base + job.slot_count - 1} (an earlier job's): their old state would look current",
    )
    if target == "tna":
        _check_tna(job)
    elif target != "v1model":
        raise ValueError(f"unknown target {target!r}: v1model or tna")


def _check_uplink(job: JobLayout, up: Uplink) -> None:
    """A leaf: every worker counts (the partial it sends up must hold them all), and its way up is a port
    and two lhc addresses (the parent parses the partial, and the leaf parses the results)."""
    _require(
        job.world_size == len(job.workers), job,
        f"fan-in {job.world_size} must equal the {len(job.workers)} workers of a leaf (its partial stands "
        "for all of them at the parent)",
    )
    _require(
        all(not w.leaf for w in job.workers), job,
        "a leaf's members are workers (three levels are not built)",
    )
    _require(
        0 <= up.worker_id < c.MAX_LEAVES, job,
        f"uplink worker id {up.worker_id} (the leaf's index at its parent) must be below {c.MAX_LEAVES}",
    )
    _require(0 <= up.port < DROP_PORT, job, f"uplink port {up.port} is outside 0..{DROP_PORT - 1}")
    for name in ("src_addr", "dst_addr"):
        try:
            ipaddress.IPv4Address(getattr(up, name))
        except ValueError:
            raise InvalidJob(f"job {job.job_id}: uplink {name} {getattr(up, name)!r} is not an IPv4 "
                             "address") from None
    for name in ("src_mac", "dst_mac"):
        _require(bool(_MAC.match(getattr(up, name))), job,
                 f"uplink {name} {getattr(up, name)!r} is not a MAC address (aa:bb:..)")
    for name in ("src_port", "dst_port"):
        port = getattr(up, name)
        _require(
            port & c.UDP_PORT_MASK == c.UDP_PORT_BASE and 0 < port < 1 << 16, job,
            f"uplink {name} {port} is outside the lhc range {c.UDP_PORT_BASE}.."
            f"{c.UDP_PORT_BASE + c.UDP_PORT_COUNT - 1} (the partial and the results are lhc packets)",
        )


def _check_tna(job: JobLayout) -> None:
    """Tofino: registers are per pipe, so a job's workers share one; the recirculation port is taken; and
    a round is finished when its bitmap is the full mask, so every admitted worker contributes."""
    _require(
        job.world_size == len(job.workers), job,
        f"fan-in {job.world_size} must equal the {len(job.workers)} workers on Tofino (a round is "
        "finished when every worker's bit is in its bitmap)",
    )
    pipes = sorted({w.switch_port >> c.TNA_PIPE_SHIFT for w in job.workers})
    _require(len(pipes) == 1, job, f"workers on pipes {pipes}: a job's workers must share one pipe on Tofino")
    for worker in job.workers:
        _require(
            worker.switch_port & ((1 << c.TNA_PIPE_SHIFT) - 1) != c.TNA_RECIRC_PORT_LOCAL, job,
            f"rank {worker.rank}: switch port {worker.switch_port} is its pipe's recirculation port",
        )


def job_entries(
    job: JobLayout, *, target: Target = "v1model", stamped_epochs: Collection[int] = ()
) -> JobEntries:
    """The table entries and multicast group that admit ``job``; raises :class:`InvalidJob` first
    (``target`` and ``stamped_epochs`` as for :func:`validate`)."""
    validate(job, target=target, stamped_epochs=stamped_epochs)
    workers = sorted(job.workers, key=lambda w: w.rank)
    tables = [TableEntrySpec(
        JOBS_TABLE, (("hdr.lhc.job_id", job.job_id),), SET_JOB,
        (("job_index", job.job_index), ("slot_base", job.slot_base), ("slot_count", job.slot_count),
         ("fan_in", job.countdown), ("mcast_grp", job.mcast_grp), ("epoch", job.epoch)),
    )]
    if job.uplink is not None:
        up = job.uplink
        tables.append(TableEntrySpec(
            UPLINKS_TABLE, (("hdr.lhc.job_id", job.job_id),), SET_UPLINK,
            (("port", up.port), ("worker_id", up.worker_id), ("src_mac", mac_to_int(up.src_mac)),
             ("dst_mac", mac_to_int(up.dst_mac)), ("src_addr", ip_to_int(up.src_addr)),
             ("dst_addr", ip_to_int(up.dst_addr)), ("src_port", up.src_port), ("dst_port", up.dst_port)),
        ))
    for w in workers:
        tables.append(TableEntrySpec(
            WORKERS_TABLE,
            (("hdr.lhc.job_id", job.job_id), ("hdr.lhc.worker_id", w.rank),
             ("hdr.ipv4.src_addr", ip_to_int(w.ip)), ("hdr.udp.src_port", w.udp_port),
             ("standard_metadata.ingress_port", w.switch_port)),
            ADMIT_WORKER, (("worker_bit", w.bit),),
        ))
    for w in workers:
        tables.append(TableEntrySpec(
            REPLICAS_TABLE, (("hdr.lhc.job_id", job.job_id), ("standard_metadata.egress_rid", w.rank)),
            SET_REPLICA_DST,
            (("dst_mac", mac_to_int(w.mac)), ("dst_addr", ip_to_int(w.ip)), ("dst_port", w.udp_port)),
        ))
    if target == "tna":
        tables += _full_round_entries(job)
    group = MulticastGroupSpec(job.mcast_grp, tuple((w.switch_port, w.rank) for w in workers))
    return JobEntries(tuple(tables), group)


def _full_round_entries(job: JobLayout) -> list[TableEntrySpec]:
    """TNA's `full_round`, one entry per job: the members' mask finishes a round, except on a leaf, where
    its workers' mask makes the copy await its parent (the copy's state, not this table, then tells a
    final copy: its workers' mask may equal the parent's mask of leaves)."""
    action = ROUND_AWAITS_PARENT if job.uplink is not None else ROUND_IS_FULL
    match = (("hdr.lhc.job_id", job.job_id), ("hdr.lhc.bitmap", job.full_mask))
    return [TableEntrySpec(FULL_ROUND_TABLE, match, action, ())]
