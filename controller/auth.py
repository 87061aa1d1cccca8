"""Who calls the job service, and what they may do: the operator, or the workers of one job.

Credentials ride as the call metadata ``lhc-token``:

- the **operator token** (``serve --token-file``): creates and deletes jobs, reads everything, and may
  join a worker from any address (it vouches for it);
- a **job credential** ``lhcjob.<job id>.<secret>``, minted by CreateJob and shown to its caller once:
  join, heartbeat, watch, read and leave that one job. The store keeps the SHA-256 of the secret, never
  the secret, so a restarted controller keeps honouring it, and the job's deletion revokes it.

Comparisons are constant-time (``hmac.compare_digest``). A controller without ``--token-file`` is open
(today's behaviour, meant for loopback): every caller is the operator.

A join with a job credential is tied to the caller: the worker's IPv4 must be the gRPC peer's own (any
loopback address when the peer is loopback), or the topology must vouch for the peer (the host entry of
that IPv4 lists the peer in ``control_ips``); its MAC and switch port come from the topology or the
controller's defaults. Otherwise one tenant could point a job's results at another host.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
from dataclasses import dataclass

import grpc

from controller.records import MemberRecord
from controller.store import JobStore
from controller.topology import Topology
from lhc_ina.jobservice.errors import ControllerError

TOKEN_METADATA = "lhc-token"
_JOB_CREDENTIAL = re.compile(r"^lhcjob\.(\d{1,5})\.([A-Za-z0-9_-]{20,})$")
_PEER = re.compile(r"^ipv[46]:(?:\[(?P<v6>[^\]]+)\]|(?P<v4>[0-9.]+)):\d+$")


def denied(message: str) -> ControllerError:
    return ControllerError(grpc.StatusCode.PERMISSION_DENIED, message)


def unauthenticated(message: str) -> ControllerError:
    return ControllerError(grpc.StatusCode.UNAUTHENTICATED, message)


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def mint() -> tuple[str, str]:
    """A fresh secret (256 random bits) and its digest, the one the store keeps."""
    secret = secrets.token_urlsafe(32)
    return secret, digest(secret)


def job_credential(job_id: int, secret: str) -> str:
    """What a job's workers present; the job id in it tells the controller which digest to compare."""
    return f"lhcjob.{job_id}.{secret}"


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: the operator (``job_id`` None) or the workers of job ``job_id``."""

    job_id: int | None
    peer: str  # grpc's context.peer(): ipv4:A:P, ipv6:[A]:P, unix:...

    @property
    def operator(self) -> bool:
        return self.job_id is None

    @property
    def key(self) -> str:
        """Whose quota a watch counts against (one per credential)."""
        return "operator" if self.job_id is None else f"job {self.job_id}"


class Authority:
    """Turns a call's metadata into a ``Caller`` (UNAUTHENTICATED when it proves nothing)."""

    def __init__(self, store: JobStore, operator_token: str | None) -> None:
        self.store = store
        self._operator = operator_token.encode() if operator_token else None

    @property
    def open(self) -> bool:
        """No operator token: every caller is the operator (loopback demos and tests)."""
        return self._operator is None

    def caller(self, context: grpc.ServicerContext) -> Caller:
        peer = context.peer()
        if self._operator is None:
            return Caller(None, peer)
        token = dict(context.invocation_metadata() or ()).get(TOKEN_METADATA, "")
        if not isinstance(token, str) or not token:
            raise unauthenticated(
                f"missing {TOKEN_METADATA}: this controller needs the operator's token or a job credential"
            )
        if hmac.compare_digest(token.encode(), self._operator):
            return Caller(None, peer)
        match = _JOB_CREDENTIAL.match(token)
        stored = self.store.credential_digest(int(match.group(1))) if match else None
        if match and stored and hmac.compare_digest(digest(match.group(2)).encode(), stored.encode()):
            return Caller(int(match.group(1)), peer)
        raise unauthenticated(
            f"wrong {TOKEN_METADATA}: neither the operator's token nor the credential of a job that exists "
            "(a deleted job's credential is revoked with it)"
        )


def require_operator(caller: Caller, action: str) -> None:
    if not caller.operator:
        raise denied(f"{action} needs the operator's credential; this one is job {caller.job_id}'s")


def peer_ip(peer: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The peer's IP address (an IPv4-mapped IPv6 one as IPv4); None for a unix socket or the unknown."""
    match = _PEER.match(peer)
    if match is None:
        return None
    ip = ipaddress.ip_address(match.group("v4") or match.group("v6"))
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped or ip


def check_join_address(caller: Caller, member: MemberRecord, topology: Topology | None,
                       chose_link: bool) -> None:
    """A job credential joins only its own host's address (see the module's docstring); the operator's
    vouches for any. ``chose_link``: the request named a MAC or switch port itself."""
    if caller.operator:
        return
    if chose_link:
        raise denied(
            f"worker {member.address}: a job credential cannot choose the MAC or switch port (they come from "
            "the topology or the controller's --dataplane); the operator's credential can"
        )
    ip = ipaddress.IPv4Address(member.ip)
    peer = peer_ip(caller.peer)
    local = caller.peer.startswith("unix:") or (peer is not None and peer.is_loopback)
    if peer == ip or (local and ip.is_loopback):
        return
    host = next((h for h in topology.hosts.values() if h.ip == member.ip), None) if topology else None
    if host is not None and peer is not None and str(peer) in host.control_ips:
        return
    raise denied(
        f"worker address {member.ip} is not the caller's ({caller.peer}): a job credential joins from its "
        "own address only; the operator's credential, or the topology host's control_ips, may vouch for "
        "another"
    )
