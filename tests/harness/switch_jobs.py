"""What softswitch's tests add to ``lhc_launch.switch_job``: where a packet of a job's stream goes, a job
whose `set_job` entry breaks an admission invariant on purpose, and a job of loopback UDP sockets written
straight into a pipeline."""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence

from p4.v1 import p4runtime_pb2 as p4v1

from lhc_ina.jobs import SET_JOB, JobLayout, WorkerEndpoint
from lhc_ina.p4info import P4InfoIndex
from lhc_ina.p4rt.values import canonical
from lhc_ina.wire import stream_position
from lhc_launch.switch_job import job_updates, make_job
from softswitch.entity_store import Entities
from softswitch.pipeline import Pipeline


def position(job: JobLayout, p: int) -> dict[str, int]:
    """Where packet ``p`` of the job's stream goes: slot, copy and seq (``lhc_ina.wire.stream_position``)."""
    return stream_position(p, job.slot_count)


def broken_job_updates(index: P4InfoIndex, job: JobLayout, broken: Mapping[str, int],
                       kind: int = p4v1.Update.INSERT) -> list[p4v1.Update]:
    """``job_updates`` with `set_job` parameters overridden *after* validation (e.g. ``{"job_index":
    MAX_JOBS}``), for tests of what the data plane does with a table that breaks an admission invariant:
    a broken entry is always explicit at the call site."""
    action = index.action(SET_JOB)
    ids = {name: action.param(name).id for name in broken}
    updates = job_updates(index, job, kind)
    for up in updates:
        entity = up.entity.table_entry
        if up.entity.HasField("table_entry") and entity.action.action.action_id == action.id:
            for param in entity.action.action.params:
                for name, param_id in ids.items():
                    if param.param_id == param_id:
                        param.value = canonical(broken[name])
            return updates
    raise AssertionError(f"no set_job entry among the job's updates: {updates}")


def loopback_sockets(count: int, timeout_s: float = 3.0) -> list[socket.socket]:
    """``count`` UDP sockets on 127.0.0.1, each on a free port: one a rank."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(count)]
    for sock in socks:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(timeout_s)
    return socks


def loopback_job(index: P4InfoIndex, pipeline: Pipeline, ranks: Sequence[socket.socket], job_id: int,
                 job_index: int, **layout: int) -> JobLayout:
    """A job whose rank r is ``ranks[r]`` (behind switch port 1), written into ``pipeline``'s tables the
    way the P4Runtime server writes it; ``layout``: ``make_job``'s slot and epoch arguments."""
    members = [WorkerEndpoint(r, "127.0.0.1", sock.getsockname()[1], "02:00:00:00:00:01", 1)
               for r, sock in enumerate(ranks)]
    job = make_job(job_id, job_index, members, **layout)
    entities = Entities(pipeline, index.p4info)
    for up in job_updates(index, job):
        entities.write(up)
    return job
