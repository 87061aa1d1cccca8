"""A Python client of the job service, for the host agent, the CLI and tests.

    client = JobClient("127.0.0.1:9560")
    client.create_job("train", workers=2)
    joined = client.join("train", ip="127.0.0.1", udp_port=40000)   # rank, slots, epoch, switch address
    job = client.wait_installed("train")     # entries on the switch: send DATA with job.epoch (it
                                             # changes if the switch lost its state since the join)
    beats = client.start_heartbeats("train", joined.rank)           # or call heartbeat() yourself
    ...
    beats.stop(); client.leave("train", joined.rank)

Every refusal raises ``ControllerError`` with the service's gRPC code and message.

Credentials and TLS are explicit here (``token``: the operator's token or a job credential; ``tls``: a
``lhc_ina.tls.TlsConfig`` with the CA that signed the controller's certificate). Programs that take them
from the environment (the CLIs, ``SwitchBackend.join``) call ``from_environment``: ``LHC_TOKEN_FILE`` and
the ``LHC_TLS_*`` variables.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from lhc_ina.jobservice import jobservice_pb2 as pb
from lhc_ina.jobservice import jobservice_pb2_grpc as pb_grpc
from lhc_ina.jobservice.errors import ControllerError
from lhc_ina.tls import TlsConfig, client_channel, explain_refusal

DEFAULT_CONTROLLER = "127.0.0.1:9560"
TOKEN_FILE_ENV = "LHC_TOKEN_FILE"
#: The trailing metadata of a Watch the controller ended at its --watch-limit: open the next one.
WATCH_EXPIRED = ("lhc-watch", "expired")


def read_token(path: Path | str) -> str:
    """A credential file's content (the operator's token or a job credential), without whitespace."""
    token = Path(path).read_text().strip()
    if not token:
        raise ValueError(f"credential file {path} is empty")
    return token


def from_environment(
    token: str | None = None, tls: TlsConfig | None = None
) -> tuple[str | None, TlsConfig | None]:
    """``token`` and ``tls`` where given, else from ``LHC_TOKEN_FILE`` and ``LHC_TLS_*``."""
    if token is None and os.environ.get(TOKEN_FILE_ENV):
        token = read_token(os.environ[TOKEN_FILE_ENV])
    return token, tls if tls is not None else TlsConfig.from_env()


@dataclass(frozen=True)
class Peer:
    """A member of a job as the job service names it to its peers (the controller's store keeps the same
    fields and more: ``controller.records.MemberRecord``)."""

    rank: int
    name: str
    ip: str
    udp_port: int
    mac: str
    switch_port: int

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.udp_port}"

    def describe(self) -> str:
        """``rank 2 'h3' 10.0.0.3:40000``: how failures and logs name a worker."""
        return f"rank {self.rank} {self.name!r} {self.address}"


@dataclass(frozen=True)
class Joined:
    """What a worker needs to aggregate: its rank and the job's slots, epoch and switch address."""

    rank: int
    job_id: int
    slot_base: int
    slot_count: int
    epoch: int
    switch_ip: str
    switch_udp_port: int
    lanes: int
    peers: tuple[Peer, ...]
    job: pb.JobInfo


def _error(error: grpc.RpcError, address: str, tls: TlsConfig | None) -> ControllerError:
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    if code == grpc.StatusCode.UNAVAILABLE:
        details = explain_refusal(address, tls, details or "") or details
    return ControllerError(code, details)


def _expired(error: grpc.RpcError) -> bool:
    trailing = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    return WATCH_EXPIRED in tuple(trailing or ())


class Heartbeats:
    """A thread that heartbeats one member every ``interval`` s and keeps the latest answer.

    ``on_change`` (optional) is called from that thread with the job whenever its state, epoch or
    installation differs from the previous answer (the first answer included): how an agent learns a
    new epoch after a switch restart, or that its job failed, without polling fast.
    """

    def __init__(
        self, client: JobClient, job: str, rank: int, interval: float,
        on_change: Callable[[pb.JobInfo], None] | None = None, report: Callable[[], str] | None = None,
    ) -> None:  # fmt: skip
        self.latest: pb.JobInfo | None = None
        self._report = report
        self.error: ControllerError | None = None
        self._on_change = on_change
        self._seen: tuple | None = None
        self._beating = threading.Lock()  # the thread's beats and ``beat_now``'s, one at a time
        self._member = (client, job, rank)
        self._stop = threading.Event()
        # A beat that takes longer than a few intervals is as good as missed; waiting longer would only
        # delay ``stop`` (and a worker's shutdown) when the controller is gone.
        self._rpc_timeout = max(1.0, 3 * interval)
        self._thread = threading.Thread(
            target=self._run, args=(interval,), daemon=True, name=f"heartbeat-{job}-{rank}"
        )
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.is_set():
            self.beat_now(self._rpc_timeout)
            self._stop.wait(interval)

    def beat_now(self, timeout: float) -> None:
        """One beat now, within ``timeout`` s (its answer in ``latest``, or its error in ``error``): what a
        caller that decides from ``latest`` does when a beat's age matters."""
        client, job, rank = self._member
        with self._beating:
            try:
                report = self._report() if self._report is not None else ""
                self.latest = client.heartbeat(job, rank, timeout=timeout, report=report)
                self.error = None
            except ControllerError as exc:
                self.error = exc
                return
            key = (self.latest.state, self.latest.epoch, self.latest.installed)
            if key != self._seen and self._on_change is not None:
                self._on_change(self.latest)
            self._seen = key

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():  # on_change may stop its own heartbeats
            self._thread.join(timeout=self._rpc_timeout + 1)


class JobClient:
    def __init__(
        self, address: str = DEFAULT_CONTROLLER, *, token: str | None = None, timeout: float = 30.0,
        tls: TlsConfig | None = None,
    ) -> None:
        self.address = address
        self.timeout = timeout
        self.tls = tls
        self._metadata = (("lhc-token", token),) if token else ()
        self._channel = client_channel(address, tls)
        self._stub = pb_grpc.JobServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> JobClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, request, timeout: float | None = None, metadata: tuple = ()):
        timeout = self.timeout if timeout is None else timeout
        try:
            return getattr(self._stub, method)(request, timeout=timeout, metadata=self._metadata + metadata)
        except grpc.RpcError as error:
            raise _error(error, self.address, self.tls) from None

    def create_job(
        self,
        name: str,
        workers: int,
        *,
        slots: int = 0,
        lanes: int = 0,
        join_timeout_s: float = 0.0,
        heartbeat_timeout_s: float = 0.0,
        hosts: list[str] | tuple[str, ...] = (),
    ) -> pb.JobInfo:
        """Admit a job; ``hosts`` (optional) names its W workers in rank order. The reply's
        ``job_credential`` is what its workers join with; the controller shows it this once."""
        return self._call(
            "CreateJob",
            pb.CreateJobRequest(
                name=name,
                workers=workers,
                slots=slots,
                lanes=lanes,
                join_timeout_s=join_timeout_s,
                heartbeat_timeout_s=heartbeat_timeout_s,
                hosts=list(hosts),
            ),
        )

    def join(
        self,
        job: str,
        *,
        udp_port: int,
        ip: str = "",
        host: str = "",
        mac: str = "",
        switch_port: int = -1,
        name: str = "",
    ) -> Joined:
        """Join ``job`` from ``ip:udp_port`` (or topology ``host``); ``switch_port`` -1: the controller's
        default (its --dataplane port or the host's)."""
        reply = self._call(
            "JoinJob",
            pb.JoinJobRequest(
                job=job,
                name=name,
                address=pb.WorkerAddress(
                    host=host, ip=ip, udp_port=udp_port, mac=mac, switch_port=switch_port
                ),
            ),
        )
        peers = tuple(
            Peer(m.rank, m.name, m.address.ip, m.address.udp_port, m.address.mac, m.address.switch_port)
            for m in reply.peers
        )
        return Joined(
            reply.rank,
            reply.job_id,
            reply.slot_base,
            reply.slot_count,
            reply.epoch,
            reply.switch_ip,
            reply.switch_udp_port,
            reply.lanes,
            peers,
            reply.job,
        )

    def heartbeat(self, job: str, rank: int, timeout: float | None = None, report: str = "") -> pb.JobInfo:
        """``report``: what the worker says of its paths, as the call metadata ``lhc-path``
        (``controller.path_reports``; empty: none)."""
        metadata = (("lhc-path", report),) if report else ()
        return self._call("Heartbeat", pb.HeartbeatRequest(job=job, rank=rank), timeout, metadata)

    def start_heartbeats(
        self, job: str, rank: int, interval: float = 1.0,
        on_change: Callable[[pb.JobInfo], None] | None = None, report: Callable[[], str] | None = None,
    ) -> Heartbeats:  # fmt: skip
        """Heartbeat in a thread (see ``Heartbeats``); keep ``interval`` well below the job's
        heartbeat timeout (a third of it, say). ``report`` gives each beat's path report."""
        return Heartbeats(self, job, rank, interval, on_change, report)

    def status(self, job: str, timeout: float | None = None) -> pb.JobInfo:
        return self._call("JobStatus", pb.JobStatusRequest(job=job), timeout)

    def list_jobs(self) -> list[pb.JobInfo]:
        return list(self._call("ListJobs", pb.ListJobsRequest()).jobs)

    def leave(self, job: str, rank: int, timeout: float | None = None) -> bool:
        """Leave ``job``; True when this was its last member and the job ended."""
        return self._call("LeaveJob", pb.LeaveJobRequest(job=job, rank=rank), timeout).job_ended

    def delete_job(self, job: str) -> None:
        self._call("DeleteJob", pb.DeleteJobRequest(job=job))

    def switch_status(self) -> pb.SwitchStatusReply:
        return self._call("SwitchStatus", pb.SwitchStatusRequest())

    def watch(self, job: str, timeout: float = 3600.0) -> Iterator[pb.JobInfo]:
        """The job now, then on every change of state, epoch, installation or membership, until
        ``timeout`` s have passed (then DEADLINE_EXCEEDED: a watch never outlives its caller's patience).
        A stream the controller ends at its own limit is opened again, starting with the job as it is."""
        deadline = time.monotonic() + timeout
        while True:
            left = max(0.0, deadline - time.monotonic())
            stream = self._stub.Watch(pb.WatchRequest(job=job), timeout=left, metadata=self._metadata)
            try:
                yield from stream
                return
            except grpc.RpcError as error:
                if not _expired(error) or time.monotonic() >= deadline:
                    raise _error(error, self.address, self.tls) from None
            finally:
                stream.cancel()

    def wait_installed(self, job: str, timeout: float = 60.0) -> pb.JobInfo:
        """Block until the job is ACTIVE with its entries on the switch, and return it: its ``epoch`` is
        the one to send with (a switch that lost its state since the join gave the job a new one).
        FAILED or the timeout raise."""
        deadline = time.monotonic() + timeout
        try:
            for info in self.watch(job, timeout=timeout):
                if info.state == pb.FAILED:
                    raise ControllerError(grpc.StatusCode.ABORTED, f"job {job!r} failed: {info.failure}")
                if info.installed:
                    return info
        except ControllerError as exc:
            if exc.code != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
        waited = timeout - max(0.0, deadline - time.monotonic())
        raise ControllerError(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"job {job!r} was not installed on the switch within {waited:.0f} s",
        )
