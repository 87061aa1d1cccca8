"""The ``switch`` backend: a worker joined to a controller-admitted job, aggregating through the switch.

Joining goes through the controller's job service: the rank, the job's slots, its epoch and the switch's
address all come from there, and the entries are on the switch before the first packet leaves. Heartbeats
keep the membership alive and bring back what the controller learns: an epoch change (the stream
resynchronises under it) or a failed job (every pending aggregation raises, naming the workers).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import grpc
import numpy as np
import torch

from host_agent.agent_backend import Backend, LinkEstimate
from host_agent.errors import AggregationError
from host_agent.transport.channel import Channel, Impairment
from host_agent.transport.packets import StreamIdentity
from host_agent.transport.stream import PacketStream
from lhc_ina.constants import Op
from lhc_ina.jobservice import jobservice_pb2 as pb
from lhc_ina.jobservice.client import JobClient, Joined, from_environment
from lhc_ina.jobservice.errors import ControllerError
from lhc_ina.tls import TlsConfig

#: A member whose heartbeats are older than this is named silent when a packet stalls.
SILENT_AFTER_S = 3.0
#: How long the I/O thread's stall diagnosis and a closing worker's leave wait for the controller: both are
#: courtesies, and a controller that is gone must not stretch an error or a shutdown.
COURTESY_RPC_S = 2.0


def _tensor_copy(words: np.ndarray) -> torch.Tensor:
    """A message's aggregated words as the agent takes them, made on the stream's I/O thread."""
    return torch.from_numpy(words.copy())


class SwitchBackend(Backend):
    """One member of a job on the switch; see :meth:`join`."""

    path = "switch"

    def __init__(self, client: JobClient, job: str, joined: Joined, channel: Channel, *,
                 timeout_s: float, heartbeat_s: float, engine: str | None = None) -> None:
        self.client = client
        self.job = job
        #: How this member names its job to the controller once joined: its id, so that a job deleted and
        #: created again under the same name is never taken for this one (its beats say NOT_FOUND instead).
        self.ref = str(joined.job_id)
        self.joined = joined
        self.rank = joined.rank
        self.world_size = joined.job.workers
        self.channel = channel
        self._engine = engine
        self.timeout_s = timeout_s
        #: None until the job is installed (:meth:`wait_installed`, :meth:`reopen`).
        self.stream: PacketStream | None = None
        self._left = False
        self._fallen_epoch: int | None = None  # the epoch under which the path layer left the switch
        #: What the heartbeats tell the controller of this worker's paths (set by ``host_agent.paths``).
        self.path_report = ""
        self.heartbeats = client.start_heartbeats(self.ref, joined.rank, heartbeat_s,
                                                  on_change=self._on_change, report=lambda: self.path_report)

    @classmethod
    def join(cls, controller: str, job: str, *, install_timeout_s: float = 60.0,
             **options: Any) -> SwitchBackend:
        """Join ``job`` on the controller at ``controller`` (:meth:`enrol`) and return once the job's
        entries are on the switch (within ``install_timeout_s``; else leave and raise)."""
        member = cls.enrol(controller, job, rpc_timeout_s=min(30.0, install_timeout_s), **options)
        try:
            member.wait_installed(install_timeout_s)
        except BaseException:
            member.close()
            raise
        return member

    @classmethod
    def enrol(cls, controller: str, job: str, *, ip: str = "127.0.0.1", udp_port: int = 0, host: str = "",
              name: str = "", token: str | None = None, impairment: Impairment | None = None,
              timeout_s: float = 30.0, heartbeat_s: float = 0.5, rpc_timeout_s: float = 30.0,
              world_size: int | None = None, engine: str | None = None,
              tls: TlsConfig | None = None) -> SwitchBackend:
        """A member of ``job`` on the controller at ``controller``, joined from ``ip:udp_port`` (0: a free
        port) or as topology host ``host``, heartbeating; it aggregates once the job is installed
        (:meth:`wait_installed`). ``world_size``: the size the caller's run expects (its process group's);
        a job of another size is refused at once. ``timeout_s``: a packet's stall deadline.
        ``rpc_timeout_s``: the controller's answers' deadline. ``engine``: the stream's per-packet engine,
        "native" (``_engine.c``), "python" (the reference) or None (native where built). ``token`` (the
        job's credential) and ``tls`` (the CA that signed the controller's certificate) default to
        ``LHC_TOKEN_FILE`` and ``LHC_TLS_*``."""
        _engine_choice(engine)
        token, tls = from_environment(token, tls)
        client = JobClient(controller, token=token, tls=tls, timeout=rpc_timeout_s)
        channel = Channel((ip, udp_port), impairment=impairment or Impairment())
        try:
            joined = client.join(job, udp_port=channel.local[1], ip="" if host else ip, host=host, name=name)
            if world_size is not None and joined.job.workers != world_size:
                with contextlib.suppress(Exception):
                    client.leave(str(joined.job_id), joined.rank, timeout=COURTESY_RPC_S)
                raise ValueError(
                    f"job {job!r} has {joined.job.workers} workers but this run has {world_size}: every "
                    "worker of a job must belong to one run of that size (another run joined this job name?)"
                )
            channel.switch = (joined.switch_ip, joined.switch_udp_port)
        except BaseException:
            channel.close()
            client.close()
            raise
        return cls(client, job, joined, channel, timeout_s=timeout_s, heartbeat_s=heartbeat_s, engine=engine)

    def wait_installed(self, timeout_s: float) -> None:
        """Until the job's entries are on the switch (every worker joined), then open the stream under the
        job's epoch then; the controller's error (FAILED, not within ``timeout_s``) is raised."""
        installed = self.client.wait_installed(self.job, timeout=timeout_s)
        self._open(installed)

    def reduce(self, op: Op, words: torch.Tensor) -> Future[torch.Tensor]:
        if self.stream is None:
            raise AggregationError(f"job {self.job!r} is not installed on its switch(es) yet")
        return self.stream.submit(op, words.detach().cpu().numpy())  # the stream delivers a tensor

    def link_estimate(self) -> LinkEstimate | None:
        if self.stream is None:
            return None
        rtt, rate = self.stream.rtt.srtt, self.stream.bytes_per_s
        return LinkEstimate(rtt, rate) if rtt is not None and rate else None

    def counters(self) -> dict[str, int]:
        return self.stream.counters() if self.stream is not None else {}

    def abandon(self, error: Exception) -> None:
        """This worker is out of step: fail its pending messages and leave the job at once, so that the
        peers' errors name it as gone (``_silent_ranks``) instead of waiting for its heartbeats to age."""
        if self.stream is not None:
            self.stream.fail(error if isinstance(error, AggregationError) else AggregationError(str(error)))
        self.heartbeats.stop()
        self._leave()

    # --- the path layer (host_agent.paths) -------------------------------------------------------------
    @property
    def job_id(self) -> int:
        return self.joined.job_id

    def leave_path(self) -> None:
        """The ranks went on over the hosts: stop the stream (it sends nothing more) and remember its
        epoch; the membership and its heartbeats stay, so that the job can be used again."""
        if self.stream is not None:
            self._fallen_epoch = self.stream.who.epoch
            self.stream.close()

    def return_epoch(self) -> int:
        """The epoch a new stream could use: the job, this very one, installed under an epoch newer than
        the one the path left (a switch back empty, a job re-admitted, a job installed at last), as the
        last heartbeat said; else 0."""
        info = self.heartbeats.latest
        usable = (self.heartbeats.error is None and info is not None and info.state == pb.ACTIVE
                  and info.installed and info.job_id == self.joined.job_id)
        return info.epoch if usable and info.epoch != self._fallen_epoch else 0

    def gone(self) -> str:
        """Why this membership can never serve again (the job failed, or the controller no longer knows
        it: deleted, ended, created again under its name, a controller that lost its store); "" else."""
        error, info = self.heartbeats.error, self.heartbeats.latest
        if error is not None and error.code == grpc.StatusCode.NOT_FOUND:
            return f"job {self.job!r} (id {self.joined.job_id}) is gone from the controller: {error}"
        if error is None and info is not None and info.state == pb.FAILED:
            return f"job {self.job!r} failed: {info.failure}"
        return ""

    def refresh(self) -> None:
        """Ask the controller now (one heartbeat), so that :meth:`return_epoch` reads its present answer."""
        self.heartbeats.beat_now(COURTESY_RPC_S)

    def reopen(self, epoch: int) -> None:
        """A fresh stream under ``epoch``, from position 0 (every rank does it at the same call), with the
        job as the last heartbeat showed it installed (the wire identities of a job joined on the hosts)."""
        if self.stream is not None:
            self.stream.close()
        info = self.heartbeats.latest
        self._open(info if info is not None and info.job_id == self.joined.job_id else self.joined.job, epoch)
        self._fallen_epoch = None

    def _open(self, installed: pb.JobInfo, epoch: int | None = None) -> None:
        self.joined = replace(self.joined, epoch=installed.epoch if epoch is None else epoch, job=installed)
        self.stream = self._new_stream(self.joined.epoch, self.timeout_s)

    def _new_stream(self, epoch: int, timeout_s: float) -> PacketStream:
        who = StreamIdentity(self.joined.job_id, self.rank, epoch, self.joined.slot_count,
                             worker_id=_wire_id(self.joined))
        return PacketStream(self.channel, who, self.world_size, timeout_s=timeout_s, diagnose=self._diagnose,
                            native=_engine_choice(self._engine), deliver=_tensor_copy,
                            result_mask=self.joined.job.result_mask)

    def close(self) -> None:
        self.heartbeats.stop()
        if self.stream is not None:
            self.stream.close()
        self.channel.close()
        self._leave()
        self.client.close()

    def _leave(self) -> None:
        if self._left:
            return
        self._left = True
        with contextlib.suppress(Exception):  # the controller may be gone; leaving is a courtesy
            self.client.leave(self.ref, self.rank, timeout=COURTESY_RPC_S)

    # --- what the controller says --------------------------------------------------------------------
    def _on_change(self, info: pb.JobInfo) -> None:
        if self.stream is None or info.job_id != self.joined.job_id:
            return  # nothing sent yet, or another job under this name: gone() tells the path layer
        if info.state == pb.FAILED:
            self.stream.fail(AggregationError(
                f"job {self.job} failed: {info.failure}", _silent_ranks(info, exclude=self.rank)
            ))
        elif info.installed and info.epoch != self.stream.who.epoch:
            self.stream.change_epoch(info.epoch)

    def _diagnose(self, what: str) -> tuple[str, tuple[int, ...]]:
        try:
            info = self.client.status(self.ref, timeout=COURTESY_RPC_S)
        except Exception as exc:  # the error must name what is known even then
            if isinstance(exc, ControllerError) and exc.code == grpc.StatusCode.NOT_FOUND:
                return f"{what}; job {self.job!r} (id {self.joined.job_id}) is gone from the controller", ()
            return f"{what}; the controller did not answer ({exc})", ()
        ranks = _silent_ranks(info, exclude=self.rank)
        if info.state == pb.FAILED:
            return f"{what}; job {self.job} failed: {info.failure}", ranks
        named = ", ".join(
            f"rank {m.rank} ({m.name or m.address.ip}:{m.address.udp_port}, last heartbeat "
            f"{m.last_heartbeat_age_s:.1f} s ago)" for m in info.members if m.rank in ranks
        )
        if named:
            return f"{what}; silent workers: {named}", ranks
        return f"{what}; {_switches_said(info)}", ranks


def _switches_said(info: pb.JobInfo) -> str:
    """What the controller knows of the job's switches when no worker is silent: the ones that did not
    answer its counter read (down, or hung: the controller probes them), else whether the job is installed."""
    answered = {row.switch for row in info.switch_counters}
    silent = [name for name in info.switches if name not in answered]
    if silent:
        who = "the switch" if silent == ["switch"] else f"switch {', '.join(silent)}"  # one switch's name
        return f"{who} does not answer the controller (down or hung); no worker is silent"
    if not info.installed:
        return "the job is not installed on its switch(es) now; no worker is silent"
    return "silent workers: none known to the controller, and its switches answer"


def _wire_id(joined: Joined) -> int:
    """This worker's wire ``worker_id``: its rank within its switch, as the installed job names it (the
    controller numbers a leaf's workers once every worker joined: docs/switch.md, "Ranks per level")."""
    me = next((m for m in joined.job.members if m.rank == joined.rank), None)
    if me is None or not joined.job.result_mask:
        raise AggregationError(f"job {joined.job.name!r}: the controller named no wire identity for rank "
                               f"{joined.rank} (a controller older than ranks per level?)")
    return me.worker_id


def _engine_choice(engine: str | None) -> bool | None:
    """``PacketStream``'s ``native`` for an engine named by a user."""
    choices = {None: None, "native": True, "python": False}
    if engine not in choices:
        raise ValueError(f"engine must be 'native', 'python' or None, not {engine!r}")
    return choices[engine]


def _silent_ranks(info: pb.JobInfo, exclude: int) -> tuple[int, ...]:
    return tuple(
        m.rank for m in info.members
        if m.rank != exclude and (m.left or m.last_heartbeat_age_s > SILENT_AFTER_S)
    )

