"""A job written straight into a switch by raw P4Runtime updates, no controller, and its workers' frames,
from names: for softswitch's benchmark (``lhc-bench switch``) and its tests.

A job is an ``lhc_ina.jobs.JobLayout`` and its entries come from ``job_entries``, the one validated
function every job model goes through. Deliberately independent of the controller and of
``lhc_ina.p4rt``: softswitch is tested against the raw protos, so a fault in a client cannot hide a fault
in the server.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from p4.v1 import p4runtime_pb2 as p4v1

from lhc_ina import constants as c
from lhc_ina.jobs import JobLayout, WorkerEndpoint, job_entries
from lhc_ina.p4info import P4InfoIndex
from lhc_ina.p4rt.values import canonical
from lhc_ina.wire import LhcHeader, build_frame, pack_packet

SWITCH_MAC = "02:00:00:00:00:fe"
SWITCH_IP = "10.0.0.254"


def table_entry(index: P4InfoIndex, table: str, match: dict[str, int | tuple[int, int]], action: str,
                **params: int) -> p4v1.TableEntry:
    """A TableEntry by names; an LPM field's value is (value, prefix_len)."""
    info = index.table(table)
    entry = p4v1.TableEntry(table_id=info.id)
    for name, value in match.items():
        mf = info.match_field(name)
        fm = entry.match.add(field_id=mf.id)
        if isinstance(value, tuple):
            fm.lpm.value, fm.lpm.prefix_len = canonical(value[0]), value[1]
        else:
            fm.exact.value = canonical(value)
    spec = index.action(action)
    entry.action.action.action_id = spec.id
    for name, value in params.items():
        entry.action.action.params.add(param_id=spec.param(name).id, value=canonical(value))
    return entry


def update(kind: int, entity: p4v1.TableEntry | p4v1.MulticastGroupEntry) -> p4v1.Update:
    up = p4v1.Update(type=kind)
    if isinstance(entity, p4v1.TableEntry):
        up.entity.table_entry.CopyFrom(entity)
    else:
        up.entity.packet_replication_engine_entry.multicast_group_entry.CopyFrom(entity)
    return up


def job_updates(index: P4InfoIndex, job: JobLayout, kind: int = p4v1.Update.INSERT) -> list[p4v1.Update]:
    """The `jobs`, `workers` and `replicas` entries plus the multicast group of ``job``, as
    ``lhc_ina.jobs.job_entries`` validates and describes them."""
    entries = job_entries(job)
    updates = [
        update(kind, table_entry(index, spec.table, dict(spec.match), spec.action, **dict(spec.params)))
        for spec in entries.tables
    ]
    group = p4v1.MulticastGroupEntry(multicast_group_id=entries.group.group_id)
    for port, rank in entries.group.replicas:
        group.replicas.add(egress_port=port, instance=rank)
    updates.append(update(kind, group))
    return updates


def data_packet(job: JobLayout, rank: int, words: np.ndarray | list[int], *, slot: int = 0, ver: int = 0,
                seq: int = 0, op: int = c.Op.ADD, **header: int) -> bytes:
    """The lhc bytes (header + LANES words) of worker ``rank``'s DATA packet."""
    fields = {"msg_type": c.MsgType.DATA, "op": op, "ver": ver, "worker_id": rank, "job_id": job.job_id,
              "slot": slot, "epoch": job.epoch, "seq": seq, **header}
    return pack_packet(LhcHeader(**fields), words)


def data_frame(job: JobLayout, rank: int, words: np.ndarray | list[int], *, src_ip: str | None = None,
               dst_port: int = c.UDP_PORT_BASE, **kwargs: int) -> bytes:
    """The Ethernet frame of ``data_packet``, from the worker's address to the switch's."""
    worker = job.workers[rank]
    return build_frame(
        data_packet(job, rank, words, **kwargs), src_mac=worker.mac, dst_mac=SWITCH_MAC,
        src_ip=src_ip or worker.ip, dst_ip=SWITCH_IP, src_port=worker.udp_port, dst_port=dst_port,
    )


def make_job(job_id: int, job_index: int, workers: int | Sequence[WorkerEndpoint], *, first_port: int = 1,
             slot_base: int = 0, slot_count: int = 16, epoch: int = 1, mcast_grp: int = 0,
             fan_in: int = 0) -> JobLayout:
    """A job; ``workers`` is a list of endpoints (in rank order) or a count: rank r at
    10.<job_index>.0.<r+1>, behind switch port first_port + r. ``mcast_grp`` 0 means job_index + 1."""
    if isinstance(workers, int):
        workers = [
            WorkerEndpoint(rank, f"10.{job_index}.0.{rank + 1}", 40000 + rank,
                           f"02:00:00:{job_index:02x}:00:{rank + 1:02x}", first_port + rank)
            for rank in range(workers)
        ]
    return JobLayout(job_id=job_id, job_index=job_index, slot_base=slot_base, slot_count=slot_count,
                     epoch=epoch, mcast_grp=mcast_grp or job_index + 1, workers=tuple(workers),
                     fan_in=fan_in)
