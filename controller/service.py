"""The gRPC job service: callers authenticated, requests checked, turned into store transactions,
answered with the job's state.

Every RPC first learns who calls (``controller.auth``: the operator, or one job's workers) and refuses
what that caller may not do with PERMISSION_DENIED, before it touches the store. Every store change wakes
the switch session (the switch follows the store) and every Watch stream. The JoinJob that completes a
job waits (briefly) for the entries to reach the switch, so its reply can already say ``installed``; the
other workers see it through Watch or Heartbeat.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from controller import admission, auth, path_reports, watches
from controller.auth import Authority, Caller
from controller.liveness import Liveness
from controller.records import JobRecord, JobState
from controller.session import PROBE_TIMEOUT_S
from controller.sessions import Sessions
from controller.spans import wire_identity
from controller.store import JobStore
from controller.targets import Target
from controller.topology import SINGLE, Topology
from controller.watches import Changes, WatchLimits
from lhc_ina import constants as c
from lhc_ina.jobservice import errors
from lhc_ina.jobservice import jobservice_pb2 as pb
from lhc_ina.jobservice import jobservice_pb2_grpc as pb_grpc
from lhc_ina.jobservice.errors import ControllerError

#: The fields of a JobInfo that carry a JobRecord's field of the same name as it is stored.
_JOB_INFO_AS_STORED = ("name", "job_id", "epoch", "workers", "slot_base", "slot_count", "lanes", "job_index",
                       "failure", "join_timeout_s", "heartbeat_timeout_s", "epoch_changes", "hosts")

log = logging.getLogger("lhc-controller.jobs")


def _rpc(method: Callable) -> Callable:
    """Authenticate the caller, pass it on, and turn a ControllerError into the RPC's status."""

    def wrapper(self: JobService, request, context):
        try:
            return method(self, request, context, self.authority.caller(context))
        except ControllerError as exc:
            context.abort(exc.code, exc.message)

    wrapper.__name__ = method.__name__
    wrapper.__doc__ = method.__doc__
    return wrapper


class JobService(pb_grpc.JobServiceServicer):
    def __init__(
        self,
        store: JobStore,
        sessions: Sessions,
        liveness: Liveness,
        target: Target,
        topology: Topology | None,
        dataplane: tuple[str, int, int | None],
        *,
        join_timeout_s: float,
        heartbeat_timeout_s: float,
        changes: Changes,
        authority: Authority,
        watch_limits: WatchLimits,
        install_wait_s: float = 5.0,
    ) -> None:
        self.store = store
        self.authority = authority
        self.watch_limits = watch_limits
        self.sessions = sessions
        self.liveness = liveness
        self.target = target
        self.topology = topology
        self.switch_ip, self.switch_udp_port, self.default_port = dataplane
        self.join_timeout_s = join_timeout_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.changes = changes
        self.install_wait_s = install_wait_s

    # -- helpers --
    def _changed(self) -> None:
        self.sessions.request_reconcile()
        self.changes.notify()

    def _job(self, caller: Caller, ref: str, action: str) -> JobRecord:
        """Job ``ref`` if ``caller`` may ``action`` it: the operator any job, a job credential its own. A
        refusal does not tell whether ``ref`` exists."""
        if caller.operator:
            return self.store.job(ref)
        own = self.store.job(str(caller.job_id))
        if ref not in (own.name, str(own.job_id)):
            raise auth.denied(f"this credential is job {own.name!r}'s: it may not {action} job {ref!r}")
        return own

    def _ref(self, caller: Caller, ref: str, action: str) -> str:
        """``ref`` for the store's own lookup inside its transaction: as given for the operator, the
        (checked) job id for a job credential."""
        return ref if caller.operator else str(self._job(caller, ref, action).job_id)

    def _require_primary(self) -> None:
        self.sessions.require_primary()

    def info(self, job: JobRecord, counters: bool = False) -> pb.JobInfo:
        installed = self.sessions.installed(job)
        worker_ids, result_mask = wire_identity(job)
        message = pb.JobInfo(
            **{name: getattr(job, name) for name in _JOB_INFO_AS_STORED},
            state=pb.JobState.Value(job.state.value),
            mcast_group=job.mcast_grp,
            installed=installed,
            switches=self.sessions.switches_of(job) if len(job.members) == job.workers else [],
            result_mask=result_mask,
        )
        for m in job.members:
            message.members.add(
                rank=m.rank,
                name=m.name,
                left=m.left,
                address=pb.WorkerAddress(ip=m.ip, udp_port=m.udp_port, mac=m.mac, switch_port=m.switch_port),
                last_heartbeat_age_s=self.liveness.age(job.job_id, m.rank),
                switch=m.switch or SINGLE,
                worker_id=worker_ids.get(m.rank, 0),
            )
        if counters:
            rows = self.sessions.counters(job)
            for name, row in rows.items():
                per_switch = message.switch_counters.add(switch=name)
                for stat in c.Stat:
                    per_switch.counters[stat.name] = row[stat]
                    message.counters[stat.name] += row[stat]
        return message

    # -- RPCs --
    @_rpc
    def CreateJob(self, request: pb.CreateJobRequest, context, caller: Caller) -> pb.JobInfo:
        auth.require_operator(caller, "creating a job")
        self._require_primary()
        slots, lanes = admission.check_job_request(
            request.name, request.workers, request.slots, request.lanes, self.topology
        )
        secret, digest = auth.mint()
        job = self.store.create_job(
            request.name,
            request.workers,
            slots,
            lanes,
            request.join_timeout_s or self.join_timeout_s,
            request.heartbeat_timeout_s or self.heartbeat_timeout_s,
            time.time(),
            admission.check_hosts(request.name, request.workers, list(request.hosts), self.topology),
            credential_digest=digest,
        )
        log.info(
            "job %r created: id %d, slots %d..%d, epoch %d",
            job.name,
            job.job_id,
            job.slot_base,
            job.slot_base + job.slot_count - 1,
            job.epoch,
        )
        self._changed()
        info = self.info(job)
        info.job_credential = auth.job_credential(job.job_id, secret)  # this reply only, never logged
        return info

    @_rpc
    def JoinJob(self, request: pb.JoinJobRequest, context, caller: Caller) -> pb.JoinJobReply:
        ref = self._ref(caller, request.job, "join")
        self._require_primary()
        a = request.address
        port = a.switch_port if a.host or a.ip else -1
        member = self._resolve(request.name, a, a.mac, port)
        if not caller.operator:
            try:
                chose_link = member != self._resolve(request.name, a, "", -1)
            except ControllerError:  # no default port: the request named one
                chose_link = True
            auth.check_join_address(caller, member, self.topology, chose_link)
        job, rank = self.store.join(
            ref, member, lambda job, new: admission.check_member(job, new, self.target, self.topology)
        )
        self.liveness.beat(job.job_id, rank)
        log.info("job %r: rank %d joined from %s (peer %s)", job.name, rank, member.address, caller.peer)
        self._changed()
        if job.state is JobState.ACTIVE:
            self.sessions.sync(self.install_wait_s)
            job = self.store.job(str(job.job_id))
        info = self.info(job)
        switch_ip, switch_udp_port = self.switch_ip, self.switch_udp_port
        if member.switch:  # a fabric: the worker sends to its own leaf
            leaf = self.topology.switches[member.switch]
            switch_ip, switch_udp_port = leaf.ip, leaf.udp_port
        return pb.JoinJobReply(
            rank=rank,
            job_id=job.job_id,
            slot_base=job.slot_base,
            slot_count=job.slot_count,
            epoch=job.epoch,
            switch_ip=switch_ip,
            switch_udp_port=switch_udp_port,
            lanes=job.lanes,
            peers=info.members,
            job=info,
        )

    def _resolve(self, name: str, a: pb.WorkerAddress, mac: str, port: int):
        return admission.resolve_member(
            name, a.host, a.ip, a.udp_port, mac, port, self.topology, self.default_port
        )

    @_rpc
    def LeaveJob(self, request: pb.LeaveJobRequest, context, caller: Caller) -> pb.LeaveJobReply:
        ref = self._ref(caller, request.job, "leave")
        self._require_primary()
        ended = self.store.leave(ref, request.rank)
        log.info("job %r: rank %d left%s", request.job, request.rank, "; job ended" if ended else "")
        self._changed()
        if ended:
            self.sessions.sync(self.install_wait_s)  # its entries are gone when the reply arrives
        return pb.LeaveJobReply(job_ended=ended)

    @_rpc
    def DeleteJob(self, request: pb.DeleteJobRequest, context, caller: Caller) -> pb.DeleteJobReply:
        auth.require_operator(caller, "deleting a job")
        self._require_primary()
        job = self.store.delete(request.job)
        log.info(
            "job %r deleted (slots %d..%d freed)", job.name, job.slot_base, job.slot_base + job.slot_count - 1
        )
        self._changed()
        self.sessions.sync(self.install_wait_s)
        return pb.DeleteJobReply()

    @_rpc
    def ListJobs(self, request: pb.ListJobsRequest, context, caller: Caller) -> pb.ListJobsReply:
        """Every job for the operator; a job credential sees its own job only."""
        jobs = self.store.jobs()
        visible = jobs if caller.operator else [j for j in jobs if j.job_id == caller.job_id]
        return pb.ListJobsReply(jobs=[self.info(job) for job in visible])

    @_rpc
    def JobStatus(self, request: pb.JobStatusRequest, context, caller: Caller) -> pb.JobInfo:
        return self.info(self._job(caller, request.job, "read"), counters=True)

    @_rpc
    def Heartbeat(self, request: pb.HeartbeatRequest, context, caller: Caller) -> pb.JobInfo:
        job = self._job(caller, request.job, "heartbeat for")
        if job.member(request.rank) is None:
            raise errors.not_found(f"job {job.name!r} has no rank {request.rank}")
        self.liveness.beat(job.job_id, request.rank)
        report = dict(context.invocation_metadata()).get(path_reports.METADATA_KEY)
        if report:
            self.liveness.paths.record(job.job_id, request.rank, report)
        return self.info(job)

    def Watch(self, request: pb.WatchRequest, context) -> Iterator[pb.JobInfo]:
        try:
            caller = self.authority.caller(context)
            job_id = self._job(caller, request.job, "watch").job_id
            held = self.watch_limits.acquire(caller.key, job_id)
        except ControllerError as exc:
            context.abort(exc.code, exc.message)
        try:
            yield from watches.stream(
                lambda: self._watched(job_id), self.changes, context, self.watch_limits.max_seconds
            )
        finally:
            self.watch_limits.release(held)

    def _watched(self, job_id: int) -> pb.JobInfo | None:
        try:
            return self.info(self.store.job(str(job_id)))
        except ControllerError:
            return None  # deleted: the stream ends OK

    @_rpc
    def SwitchStatus(self, request: pb.SwitchStatusRequest, context, caller: Caller) -> pb.SwitchStatusReply:
        auth.require_operator(caller, "reading the switch's status")
        free, total = self.store.slot_usage()
        each = []
        for name, session in self.sessions.by_name.items():
            s = session.status
            switch = self.topology.switches.get(name) if self.topology is not None else None
            dataplane = (f"{switch.ip}:{switch.udp_port}" if switch is not None and self.topology.fabric
                         else f"{self.switch_ip}:{self.switch_udp_port}")
            state = s.state if s.answering else (
                f"not answering: no P4Runtime reply within {PROBE_TIMEOUT_S:g} s, for "
                f"{time.monotonic() - s.silent_since:.1f} s (a hung or stopped switch)")
            each.append(pb.SwitchStatusReply(
                address=session.address, target=self.target.name, connected=s.connected and s.answering,
                primary=s.primary, state=state, election_id=session.election_id, reconciles=s.reconciles,
                updates_written=s.updates_written, last_error=s.last_error, slots_free=free,
                slots_total=total, dataplane=dataplane, name=name, role=self.sessions.role(name),
            ))
        if len(each) == 1:
            reply = pb.SwitchStatusReply()
            reply.CopyFrom(each[0])
        else:  # the fabric as a whole: connected and primary only when every switch is
            down = [e.name for e in each if not (e.connected and e.primary)]
            reply = pb.SwitchStatusReply(
                address=",".join(e.address for e in each), target=self.target.name,
                connected=all(e.connected for e in each), primary=all(e.primary for e in each),
                state=(f"fabric of {len(each)} switches: " + ("every one primary" if not down else
                       f"not connected or not primary: {', '.join(down)}")
                       + ("; pipeline mismatch" if any("mismatch" in e.state for e in each) else "")),
                election_id=each[0].election_id, reconciles=min(e.reconciles for e in each),
                updates_written=sum(e.updates_written for e in each),
                last_error="; ".join(f"{e.name}: {e.last_error}" for e in each if e.last_error),
                slots_free=free, slots_total=total, name="fabric", role="fabric",
            )
        reply.switches.extend(each)
        return reply
