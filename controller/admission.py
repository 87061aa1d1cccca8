"""Admission checks that the data plane cannot make, and worker addresses resolved to endpoints.

Every refusal is a ``ControllerError`` whose message names the job and the problem. The switch-level
invariants (`job_index`, slot range, epoch, ranks, MACs, ports) are checked once more, by the same
function that builds the entries (``lhc_ina.jobs.validate``), before a join is committed.
"""

from __future__ import annotations

import ipaddress
from dataclasses import replace

from controller.records import JobRecord, MemberRecord
from controller.spans import check_reach, fabric_job, member_switches
from controller.targets import Target
from controller.topology import Topology
from lhc_ina import constants as c
from lhc_ina.fabric import fabric_layouts
from lhc_ina.jobs import InvalidJob, validate
from lhc_ina.jobservice import errors

#: Default slots per job: the host transport keeps this many packets in flight per worker, which keeps a
#: softswitch or BMv2 pipe busy at loopback round-trip times (64 x 256 B = 16 KiB in flight per worker);
#: 4096 slots hold 64 such jobs.
DEFAULT_SLOTS = 64


def check_job_request(name: str, workers: int, slots: int, lanes: int, topology: Topology | None = None
                      ) -> tuple[int, int]:
    """(slots, lanes) with defaults filled in; refuses what can never fit: more than ``MAX_WORKERS``
    workers fit only a fabric, whose leaves hold up to ``MAX_WORKERS`` each (docs/switch.md, "Ranks per
    level")."""
    if not name or len(name) > 64 or not name.isprintable() or name.isdigit():
        raise errors.invalid(f"job name {name!r}: 1..64 printable characters, not all digits")
    if not 1 <= workers <= c.MAX_JOB_WORKERS:
        raise errors.invalid(
            f"job {name!r}: {workers} workers; a job has 1..{c.MAX_JOB_WORKERS} (MAX_JOB_WORKERS: "
            f"{c.MAX_WORKERS} per leaf under {c.MAX_LEAVES} leaves)"
        )
    if workers > c.MAX_WORKERS and (topology is None or not topology.fabric):
        raise errors.invalid(
            f"job {name!r}: {workers} workers on one switch; a switch holds 1..{c.MAX_WORKERS} of a job "
            f"(MAX_WORKERS: one bit each in its 32-bit contributor bitmap). More workers need a leaf/spine "
            "topology, whose leaves hold up to 32 each"
        )
    slots = slots or DEFAULT_SLOTS
    if slots > c.MAX_SLOTS:
        raise errors.invalid(f"job {name!r}: {slots} slots; the switch has {c.MAX_SLOTS}")
    lanes = lanes or c.LANES
    if lanes != c.LANES:
        raise errors.invalid(f"job {name!r}: {lanes} lanes; this switch aggregates {c.LANES} per packet")
    return slots, lanes


def check_hosts(name: str, workers: int, hosts: list[str], topology: Topology | None) -> tuple[str, ...]:
    """The expected workers of a job, when given: W distinct names, topology hosts where there is a
    topology (so that a failure to join can give their addresses)."""
    if not hosts:
        return ()
    if len(hosts) != workers:
        raise errors.invalid(f"job {name!r}: {len(hosts)} hosts named for {workers} workers")
    if len(set(hosts)) != len(hosts) or not all(h and "," not in h for h in hosts):
        raise errors.invalid(f"job {name!r}: hosts {hosts} must be distinct non-empty names without commas")
    if topology is not None:
        placed = [replace(_UNPLACED, rank=i, switch=topology.host(h).switch) for i, h in enumerate(hosts)]
        check_reach(name, placed, topology)  # an unknown host: INVALID_ARGUMENT naming it
    return tuple(hosts)


_UNPLACED = MemberRecord(0, "", "0.0.0.0", 1, "", 0)


def default_mac(ip: str) -> str:
    """02:00:a:b:c:d, softswitch's MAC for a UDP-mode address (its MACs are never used there)."""
    return "02:00:" + ":".join(f"{b:02x}" for b in ipaddress.IPv4Address(ip).packed)


def resolve_member(
    name: str,
    host: str,
    ip: str,
    udp_port: int,
    mac: str,
    switch_port: int,
    topology: Topology | None,
    default_port: int | None,
) -> MemberRecord:
    """A joining worker's endpoint, from the topology (``host``) or from the request itself. In a fabric
    topology a worker joining by address must be one of its hosts (its ip), so that its leaf is known."""
    switch = ""
    placed = host
    if not host and topology is not None and topology.fabric:
        at = topology.host_at(ip)
        if at is None:
            known = ", ".join(f"{h.name} {h.ip}" for h in topology.hosts.values()) or "none"
            raise errors.invalid(
                f"worker {ip}:{udp_port} is no host of the topology, so no leaf is known to reach it "
                f"(hosts: {known})"
            )
        placed = at.name
    if placed:
        if topology is None:
            raise errors.invalid(
                f"worker joins as topology host {host!r}, but the controller has no topology"
            )
        known = topology.host(placed)
        ip, mac = ip or known.ip, mac or known.mac
        switch_port = known.port if switch_port < 0 else switch_port
        switch = known.switch if topology.fabric else ""
    try:
        ip = str(ipaddress.IPv4Address(ip))
    except ValueError:
        raise errors.invalid(f"worker address {ip!r} is not an IPv4 address") from None
    if not 0 < udp_port < 1 << 16:
        raise errors.invalid(f"worker {ip}: UDP port {udp_port} is outside 1..65535")
    if switch_port < 0:
        if default_port is None:
            raise errors.invalid(
                f"worker {ip}:{udp_port}: no switch port given and the controller has no "
                "--dataplane port to default to"
            )
        switch_port = default_port
    return MemberRecord(
        0, name or host or f"{ip}:{udp_port}", ip, udp_port, mac or default_mac(ip), switch_port,
        switch=switch,
    )


def check_member(
    job: JobRecord, member: MemberRecord, target: Target, topology: Topology | None = None
) -> None:
    """The job with ``member`` (at its rank) added must still be one the switches can run exactly
    (lhc_ina.jobs.validate, on each switch when its workers sit under several leaves), the topology must
    reach its workers together, and on Tofino all its workers must share one pipe of one switch."""
    members = sorted((*job.members, member), key=lambda m: m.rank)
    # validate() wants ranks 0..n-1; a job still filling may have holes, and what it checks here (addresses,
    # MACs, ports, duplicates) does not depend on the rank, so the trial numbers the members densely.
    trial = replace(job, members=tuple(replace(m, rank=i) for i, m in enumerate(members)))
    check_reach(job.name, members, topology)
    try:
        if len(member_switches(members)) > 1:
            assert topology is not None
            # Each switch's layout for its own target: on Tofino one pipe per switch, checked there.
            for layout in fabric_layouts(fabric_job(trial, topology)).values():
                validate(layout, target=target.data_plane)
            return
        validate(replace(trial.layout(), fan_in=len(members)))
    except InvalidJob as exc:
        raise errors.invalid(f"job {job.name!r}: {exc}") from None
    pipes = {target.pipe_of(m.switch_port) for m in members}
    if len(pipes) > 1:
        raise errors.invalid(
            f"job {job.name!r}: worker {member.address} is behind port {member.switch_port} (pipe "
            f"{target.pipe_of(member.switch_port)}), the job's other workers on pipe "
            f"{target.pipe_of(job.members[0].switch_port)}; a job's workers must share one pipe on Tofino"
        )
