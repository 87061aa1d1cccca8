"""Desired switch state from the job store, actual state from P4Runtime reads, and the writes between them.

Both sides are sets of hashable specs (``lhc_ina.jobs.TableEntrySpec`` with match fields and params in
name order, ``MulticastGroupSpec`` with replicas in (instance, port) order), named with v1model's field
names whatever the target, so desired and actual compare exactly and only the difference is written.

Write order keeps the data plane consistent at every instant: removals take a job's `jobs` entry away
first (its packets then count as DROP_UNKNOWN_JOB), additions put it in last, after its workers, replicas
and multicast group, so a packet never finds a job whose other entries are missing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2

from controller.records import JobRecord, JobState
from controller.spans import job_switch_entries
from controller.targets import Target
from controller.topology import SINGLE, Topology
from lhc_ina import jobs as lj
from lhc_ina.jobs import MulticastGroupSpec, TableEntrySpec
from lhc_ina.jobservice.errors import ControllerError
from lhc_ina.p4rt import EntityBuilder, P4RuntimeClient, decode_table_entry

log = logging.getLogger("lhc-controller.reconcile")

#: The tables the controller owns, in the order a removal clears them (`full_round`: TNA only).
MANAGED_TABLES = (
    lj.JOBS_TABLE,
    lj.UPLINKS_TABLE,
    lj.WORKERS_TABLE,
    lj.FULL_ROUND_TABLE,
    lj.REPLICAS_TABLE,
    "LhcIngress.ipv4_routes",
    "LhcIngress.l2_forward",
)
_UPDATE = p4runtime_pb2.Update


@dataclass(frozen=True)
class SwitchState:
    tables: frozenset[TableEntrySpec]
    groups: frozenset[MulticastGroupSpec]

    def job_ids(self) -> set[int]:
        return {dict(e.match)["hdr.lhc.job_id"] for e in self.tables if e.table == lj.JOBS_TABLE}


def normalized(entry: TableEntrySpec) -> TableEntrySpec:
    return TableEntrySpec(entry.table, tuple(sorted(entry.match)), entry.action, tuple(sorted(entry.params)))


def normalized_group(group: MulticastGroupSpec) -> MulticastGroupSpec:
    return MulticastGroupSpec(group.group_id, tuple(sorted(group.replicas, key=lambda r: (r[1], r[0]))))


def desired_state(
    jobs: Iterable[JobRecord], topology: Topology | None, switch: str = SINGLE, *,
    data_plane: lj.Target = "v1model",
) -> SwitchState:
    """What ``switch`` must hold: the entries and group of every ACTIVE job that spans it
    (``controller.spans``), and the topology's forwarding for it; ``data_plane`` "tna" adds TNA's
    `full_round` entries."""
    tables: set[TableEntrySpec] = set()
    groups: set[MulticastGroupSpec] = set()
    for job in jobs:
        if job.state is not JobState.ACTIVE:
            continue
        try:
            entries = job_switch_entries(job, topology, target=data_plane).get(switch)
        except (lj.InvalidJob, ControllerError) as exc:  # admission checked it; a store edited by hand no
            log.error("job %r is not installed: %s", job.name, exc)
            continue
        if entries is None:
            continue
        tables.update(normalized(e) for e in entries.tables)
        groups.add(normalized_group(entries.group))
    if topology is not None:
        tables.update(normalized(e) for e in topology.forwarding_entries(switch))
    return SwitchState(frozenset(tables), frozenset(groups))


def read_state(client: P4RuntimeClient, target: Target) -> SwitchState:
    """What the switch holds in the managed tables and the PRE's multicast groups."""
    renamed = {v: k for k, v in target.field_names.items()}
    index = target.p4info
    tables: set[TableEntrySpec] = set()
    for table in MANAGED_TABLES:
        if table == lj.FULL_ROUND_TABLE and target.data_plane != "tna":
            continue
        for raw in client.read_table(table):
            entry = decode_table_entry(index, raw)
            tables.add(
                normalized(
                    TableEntrySpec(
                        entry.table,
                        tuple((renamed.get(k, k), v) for k, v in entry.match.items()),
                        entry.action or "",
                        tuple(entry.params.items()),
                    )
                )
            )
    groups = set()
    for group in client.read_multicast_groups():
        replicas = tuple(
            (
                r.egress_port if r.WhichOneof("port_kind") != "port" else int.from_bytes(r.port, "big"),
                r.instance,
            )
            for r in group.replicas
        )
        groups.add(normalized_group(MulticastGroupSpec(group.multicast_group_id, replicas)))
    return SwitchState(frozenset(tables), frozenset(groups))


def _table_entry(
    builder: EntityBuilder, target: Target, spec: TableEntrySpec, with_action: bool
) -> p4runtime_pb2.TableEntry:
    match = {target.field_names.get(k, k): v for k, v in spec.match}
    if not with_action:
        return builder.table_entry(spec.table, match)
    return builder.table_entry(spec.table, match, spec.action, dict(spec.params))


def _group(spec: MulticastGroupSpec) -> p4runtime_pb2.Entity:
    """A multicast group with ``Replica.egress_port``, the form PI's Tofino backend reads (and all take)."""
    entity = p4runtime_pb2.Entity()
    group = entity.packet_replication_engine_entry.multicast_group_entry
    group.multicast_group_id = spec.group_id
    for port, instance in spec.replicas:
        group.replicas.add(egress_port=port, instance=instance)
    return entity


def plan(desired: SwitchState, actual: SwitchState, target: Target) -> list[p4runtime_pb2.Update]:
    """The updates that turn ``actual`` into ``desired``, in a data-plane-safe order (module docstring)."""
    builder = EntityBuilder(target.p4info)
    want = {(e.table, e.match): e for e in desired.tables}
    have = {(e.table, e.match): e for e in actual.tables}
    order = {name: i for i, name in enumerate(MANAGED_TABLES)}

    def update(kind: int, spec: TableEntrySpec) -> p4runtime_pb2.Update:
        entry = _table_entry(builder, target, spec, with_action=kind != _UPDATE.DELETE)
        return _UPDATE(type=kind, entity=p4runtime_pb2.Entity(table_entry=entry))

    gone = sorted((have[k] for k in have.keys() - want.keys()), key=lambda e: (order[e.table], e.match))
    changed = sorted(
        (want[k] for k in want.keys() & have.keys() if want[k] != have[k]),
        key=lambda e: (-order[e.table], e.match),
    )
    new = sorted((want[k] for k in want.keys() - have.keys()), key=lambda e: (-order[e.table], e.match))
    want_groups = {g.group_id: g for g in desired.groups}
    have_groups = {g.group_id: g for g in actual.groups}
    updates = [update(_UPDATE.DELETE, e) for e in gone]
    for gid in sorted(have_groups.keys() - want_groups.keys()):
        updates.append(_UPDATE(type=_UPDATE.DELETE, entity=_group(have_groups[gid])))
    for gid in sorted(want_groups):
        if gid not in have_groups:
            updates.append(_UPDATE(type=_UPDATE.INSERT, entity=_group(want_groups[gid])))
        elif have_groups[gid] != want_groups[gid]:
            updates.append(_UPDATE(type=_UPDATE.MODIFY, entity=_group(want_groups[gid])))
    updates += [update(_UPDATE.MODIFY, e) for e in changed]
    updates += [update(_UPDATE.INSERT, e) for e in new]
    return updates


def pipeline_differences(ours: p4info_pb2.P4Info, theirs: p4info_pb2.P4Info) -> list[str]:
    """Entity by entity (ids included: our entries carry our ids), every way the switch's P4Info differs."""
    problems = []
    for field in ("tables", "actions", "counters", "direct_counters", "meters", "registers", "digests"):
        mine = {e.preamble.name: e for e in getattr(ours, field)}
        loaded = {e.preamble.name: e for e in getattr(theirs, field)}
        problems += [
            f"the switch's program has no {field[:-1]} {n}" for n in sorted(mine.keys() - loaded.keys())
        ]
        problems += [
            f"the switch's program has an unknown {field[:-1]} {n}"
            for n in sorted(loaded.keys() - mine.keys())
        ]
        for name in sorted(mine.keys() & loaded.keys()):
            if mine[name].SerializeToString(deterministic=True) != loaded[name].SerializeToString(
                deterministic=True
            ):
                problems.append(
                    f"{field[:-1]} {name} differs (id {loaded[name].preamble.id:#x}, "
                    f"ours {mine[name].preamble.id:#x})"
                )
    return problems
