"""The gRPC job service: requests checked, turned into store transactions, answered with the job's state.

Every store change wakes the switch session (the switch follows the store) and every Watch stream. The
JoinJob that completes a job waits (briefly) for the entries to reach the switch, so its reply can
already say ``installed``; the other workers see it through Watch or Heartbeat.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from controller import admission
from controller.liveness import Liveness
from controller.records import JobRecord, JobState
from controller.session import SwitchSession
from controller.store import JobStore
from controller.targets import Target
from controller.topology import Topology
from lhc_ina import constants as c
from lhc_ina.jobservice import errors
from lhc_ina.jobservice import jobservice_pb2 as pb
from lhc_ina.jobservice import jobservice_pb2_grpc as pb_grpc
from lhc_ina.jobservice.errors import ControllerError

log = logging.getLogger("lhc-controller.jobs")


class Changes:
    """A version number and a condition: watchers wait for the next change of anything."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.version = 0

    def notify(self) -> None:
        with self._cond:
            self.version += 1
            self._cond.notify_all()

    def wait(self, seen: int, timeout: float) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self.version != seen, timeout)
            return self.version


def _rpc(method: Callable) -> Callable:
    """Turn a ControllerError into the RPC's status, with its message."""

    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except ControllerError as exc:
            context.abort(exc.code, exc.message)

    wrapper.__name__ = method.__name__
    wrapper.__doc__ = method.__doc__
    return wrapper


class JobService(pb_grpc.JobServiceServicer):
    def __init__(
        self,
        store: JobStore,
        session: SwitchSession,
        liveness: Liveness,
        target: Target,
        topology: Topology | None,
        dataplane: tuple[str, int, int | None],
        *,
        join_timeout_s: float,
        heartbeat_timeout_s: float,
        changes: Changes,
        install_wait_s: float = 5.0,
    ) -> None:
        self.store = store
        self.session = session
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
        self.session.request_reconcile()
        self.changes.notify()

    def _require_primary(self) -> None:
        status = self.session.status
        if status.mismatch:
            raise errors.precondition(
                f"the switch runs a different pipeline than the {self.target.name} target's: "
                f"{status.mismatch}"
            )
        if status.connected and not status.primary:
            raise ControllerError(
                grpc.StatusCode.UNAVAILABLE,
                "this controller is a backup (another one is primary for the switch)",
            )

    def info(self, job: JobRecord, counters: bool = False) -> pb.JobInfo:
        installed = (
            job.state is JobState.ACTIVE and self.session.status.installed.get(job.job_id) == job.epoch
        )
        message = pb.JobInfo(
            name=job.name,
            job_id=job.job_id,
            state=pb.JobState.Value(job.state.value),
            epoch=job.epoch,
            workers=job.workers,
            slot_base=job.slot_base,
            slot_count=job.slot_count,
            lanes=job.lanes,
            job_index=job.job_index,
            mcast_group=job.mcast_grp,
            failure=job.failure,
            join_timeout_s=job.join_timeout_s,
            heartbeat_timeout_s=job.heartbeat_timeout_s,
            epoch_changes=job.epoch_changes,
            hosts=job.hosts,
            installed=installed,
        )
        for m in job.members:
            message.members.add(
                rank=m.rank,
                name=m.name,
                left=m.left,
                address=pb.WorkerAddress(ip=m.ip, udp_port=m.udp_port, mac=m.mac, switch_port=m.switch_port),
                last_heartbeat_age_s=self.liveness.age(job.job_id, m.rank),
            )
        if counters:
            rows = self.session.read_counters()
            if rows is not None:
                row = rows.get(job.job_index, [0] * c.NUM_STATS)
                for stat in c.Stat:
                    message.counters[stat.name] = row[stat]
        return message

    # -- RPCs --
    @_rpc
    def CreateJob(self, request: pb.CreateJobRequest, context) -> pb.JobInfo:
        self._require_primary()
        slots, lanes = admission.check_job_request(
            request.name, request.workers, request.slots, request.lanes
        )
        job = self.store.create_job(
            request.name,
            request.workers,
            slots,
            lanes,
            request.join_timeout_s or self.join_timeout_s,
            request.heartbeat_timeout_s or self.heartbeat_timeout_s,
            time.time(),
            admission.check_hosts(request.name, request.workers, list(request.hosts), self.topology),
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
        return self.info(job)

    @_rpc
    def JoinJob(self, request: pb.JoinJobRequest, context) -> pb.JoinJobReply:
        self._require_primary()
        a = request.address
        member = admission.resolve_member(
            request.name,
            a.host,
            a.ip,
            a.udp_port,
            a.mac,
            a.switch_port if a.host or a.ip else -1,
            self.topology,
            self.default_port,
        )
        job, rank = self.store.join(
            request.job, member, lambda job, new: admission.check_member(job, new, self.target)
        )
        self.liveness.beat(job.job_id, rank)
        log.info("job %r: rank %d joined from %s", job.name, rank, member.address)
        self._changed()
        if job.state is JobState.ACTIVE:
            self.session.sync(self.install_wait_s)
            job = self.store.job(str(job.job_id))
        info = self.info(job)
        return pb.JoinJobReply(
            rank=rank,
            job_id=job.job_id,
            slot_base=job.slot_base,
            slot_count=job.slot_count,
            epoch=job.epoch,
            switch_ip=self.switch_ip,
            switch_udp_port=self.switch_udp_port,
            lanes=job.lanes,
            peers=info.members,
            job=info,
        )

    @_rpc
    def LeaveJob(self, request: pb.LeaveJobRequest, context) -> pb.LeaveJobReply:
        self._require_primary()
        ended = self.store.leave(request.job, request.rank)
        log.info("job %r: rank %d left%s", request.job, request.rank, "; job ended" if ended else "")
        self._changed()
        if ended:
            self.session.sync(self.install_wait_s)  # its entries are gone when the reply arrives
        return pb.LeaveJobReply(job_ended=ended)

    @_rpc
    def DeleteJob(self, request: pb.DeleteJobRequest, context) -> pb.DeleteJobReply:
        self._require_primary()
        job = self.store.delete(request.job)
        log.info(
            "job %r deleted (slots %d..%d freed)", job.name, job.slot_base, job.slot_base + job.slot_count - 1
        )
        self._changed()
        self.session.sync(self.install_wait_s)
        return pb.DeleteJobReply()

    @_rpc
    def ListJobs(self, request: pb.ListJobsRequest, context) -> pb.ListJobsReply:
        return pb.ListJobsReply(jobs=[self.info(job) for job in self.store.jobs()])

    @_rpc
    def JobStatus(self, request: pb.JobStatusRequest, context) -> pb.JobInfo:
        return self.info(self.store.job(request.job), counters=True)

    @_rpc
    def Heartbeat(self, request: pb.HeartbeatRequest, context) -> pb.JobInfo:
        job = self.store.job(request.job)
        if job.member(request.rank) is None:
            raise errors.not_found(f"job {job.name!r} has no rank {request.rank}")
        self.liveness.beat(job.job_id, request.rank)
        return self.info(job)

    def Watch(self, request: pb.WatchRequest, context) -> Iterator[pb.JobInfo]:
        try:
            job_id = self.store.job(request.job).job_id
        except ControllerError as exc:
            context.abort(exc.code, exc.message)
        last = None
        seen = self.changes.version
        while context.is_active():
            try:
                info = self.info(self.store.job(str(job_id)))
            except ControllerError:
                return  # deleted: the stream ends OK
            key = (
                info.state,
                info.epoch,
                info.installed,
                info.failure,
                tuple((m.rank, m.left) for m in info.members),
            )
            if key != last:
                last = key
                yield info
            seen = self.changes.wait(seen, 1.0)

    @_rpc
    def SwitchStatus(self, request: pb.SwitchStatusRequest, context) -> pb.SwitchStatusReply:
        s = self.session.status
        free, total = self.store.slot_usage()
        return pb.SwitchStatusReply(
            address=self.session.address,
            target=self.target.name,
            connected=s.connected,
            primary=s.primary,
            state=s.state,
            election_id=self.session.election_id,
            reconciles=s.reconciles,
            updates_written=s.updates_written,
            last_error=s.last_error,
            slots_free=free,
            slots_total=total,
            dataplane=f"{self.switch_ip}:{self.switch_udp_port}",
        )


class TokenAuth(grpc.ServerInterceptor):
    """Shared-token auth: every call must carry metadata ``lhc-token`` equal to the token."""

    def __init__(self, token: str) -> None:
        self.token = token

        def refuse(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong lhc-token (see --token-file)")

        self._refusal = grpc.unary_unary_rpc_method_handler(refuse)
        self._stream_refusal = grpc.unary_stream_rpc_method_handler(refuse)

    def intercept_service(self, continuation, handler_call_details):
        import hmac

        metadata = dict(handler_call_details.invocation_metadata or ())
        if hmac.compare_digest(metadata.get("lhc-token", ""), self.token):
            return continuation(handler_call_details)
        if handler_call_details.method.endswith("/Watch"):
            return self._stream_refusal
        return self._refusal
