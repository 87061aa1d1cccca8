"""The addresses of a test topology and the exact frames the suite sends and expects.

Pure functions over scapy: nothing here talks to the switch, so the expected packets of docs/switch.md
("Addresses of results") are written once, where they can be read side by side with the contract.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw

from lhc_ina import constants as c
from lhc_ina.wire import LhcHeader, scapy_layers

LHC, LHCPayload = scapy_layers()

#: The switch's own lhc address, as workers address it (results carry it as their source).
SWITCH_MAC = "02:00:00:00:00:fe"
SWITCH_IP = "10.255.0.1"
#: IP fields the switch must leave alone in results (only addresses, ports and checksums change).
IP_ID = 0x1234
TTL = 64


@dataclass(frozen=True)
class Worker:
    """One worker of one job: its rank, the PTF port that reaches it and its addresses."""

    rank: int
    port: int
    mac: str
    ip: str
    udp_port: int

    @property
    def bit(self) -> int:
        return 1 << self.rank


def make_workers(job_id: int, count: int, ports: Sequence[int]) -> list[Worker]:
    """``count`` workers of a job spread round-robin over ``ports`` (several workers may share a port).
    Addresses are unique per (job, rank), so two jobs never share a worker address."""
    return [
        Worker(
            rank=rank,
            port=ports[rank % len(ports)],
            mac=f"02:{job_id >> 8:02x}:{job_id & 0xFF:02x}:00:00:{rank + 1:02x}",
            ip=f"10.{job_id & 0xFF}.{job_id >> 8}.{rank + 1}",
            udp_port=40000 + rank,
        )
        for rank in range(count)
    ]


def to_words(values: Iterable[int]) -> list[int]:
    """Payload lanes as unsigned 32-bit words (negative ints wrap, as int32 two's complement)."""
    return [int(v) & 0xFFFFFFFF for v in values]


def aggregate(payloads: Sequence[Sequence[int]], op: c.Op) -> list[int]:
    """What the switch must compute lane by lane: ADD mod 2^32, or OR."""
    lanes = np.array([to_words(p) for p in payloads], dtype=np.uint64)
    if op == c.Op.ADD:
        return [int(v) for v in (lanes.sum(axis=0) % (1 << 32))]
    return [int(v) for v in np.bitwise_or.reduce(lanes, axis=0)]


def lhc_frame(
    header: LhcHeader,
    words: Sequence[int] | None,
    *,
    eth_src: str,
    eth_dst: str,
    ip_src: str,
    ip_dst: str,
    sport: int,
    dport: int,
    extra: bytes = b"",
) -> Packet:
    """Ethernet/IPv4/UDP/lhc with UDP checksum 0 and a correct IPv4 checksum. ``words`` None leaves the
    payload out; ``extra`` appends raw bytes (for malformed frames). Lengths follow the content."""
    frame = (
        Ether(src=eth_src, dst=eth_dst)
        / IP(src=ip_src, dst=ip_dst, ttl=TTL, id=IP_ID)
        / UDP(sport=sport, dport=dport, chksum=0)
        / LHC(**{name: getattr(header, name) for name, _ in c.HEADER_FIELDS})
    )
    if words is not None:
        frame = frame / LHCPayload(words=to_words(words))
    if extra:
        frame = frame / Raw(extra)
    return frame


def data_frame(
    worker: Worker,
    header: LhcHeader,
    words: Sequence[int] | None,
    *,
    src_ip: str | None = None,
    sport: int | None = None,
    switch_ip: str = SWITCH_IP,
    dport: int = c.UDP_PORT_BASE,
    extra: bytes = b"",
) -> Packet:
    """A packet from ``worker`` to the switch at ``switch_ip``:``dport`` (``src_ip`` and ``sport``
    override the source address and UDP port, to spoof)."""
    return lhc_frame(
        header,
        words,
        eth_src=worker.mac,
        eth_dst=SWITCH_MAC,
        ip_src=src_ip or worker.ip,
        ip_dst=switch_ip,
        sport=worker.udp_port if sport is None else sport,
        dport=dport,
        extra=extra,
    )


def result_copy(
    sent: LhcHeader,
    words: Sequence[int],
    bitmap: int,
    to: Worker,
    *,
    switch_ip: str = SWITCH_IP,
    dport: int = c.UDP_PORT_BASE,
) -> Packet:
    """The multicast RESULT copy for worker ``to`` when the packet with header ``sent`` finished the slot:
    the source becomes the switch address the worker used; the replica entry sets the destination."""
    return _from_switch(sent.replace(msg_type=c.MsgType.RESULT, bitmap=bitmap), words, to, switch_ip, dport)


def retx_reply(
    sent: LhcHeader, words: Sequence[int], bitmap: int, asker: Worker, *, dport: int = c.UDP_PORT_BASE
) -> Packet:
    """The unicast RESULT_RETX answering ``asker``'s duplicate: addresses and ports swapped."""
    header = sent.replace(msg_type=c.MsgType.RESULT_RETX, bitmap=bitmap)
    return _from_switch(header, words, asker, SWITCH_IP, dport)


def _from_switch(header: LhcHeader, words: Sequence[int], to: Worker, switch_ip: str, sport: int) -> Packet:
    """A frame the switch sends to worker ``to``, from its own MAC and the address ``switch_ip``."""
    return lhc_frame(
        header, words, eth_src=SWITCH_MAC, eth_dst=to.mac, ip_src=switch_ip, ip_dst=to.ip, sport=sport,
        dport=to.udp_port,
    )


def describe(frame: bytes) -> str:
    """One line per layer with the fields that matter, for failure messages."""
    packet = Ether(frame)
    parts = [f"{len(frame)} B", f"eth {packet.src}->{packet.dst} type={packet.type:#06x}"]
    if IP in packet:
        ip = packet[IP]
        parts.append(f"ip {ip.src}->{ip.dst} ttl={ip.ttl} id={ip.id:#x} len={ip.len} chksum={ip.chksum:#06x}")
    if UDP in packet:
        udp = packet[UDP]
        parts.append(f"udp {udp.sport}->{udp.dport} len={udp.len} chksum={udp.chksum:#06x}")
    if LHC in packet:
        lhc = packet[LHC]
        parts.append("lhc " + " ".join(f"{name}={getattr(lhc, name)}" for name, _ in c.HEADER_FIELDS))
    if LHCPayload in packet:
        words = packet[LHCPayload].words
        parts.append(f"payload {len(words)} words [{', '.join(hex(w) for w in words[:4])}, ...]")
    return " | ".join(parts)


def difference(expected: bytes, got: bytes) -> str:
    """Where two frames differ, field by field (header fields, then the first differing lanes)."""
    exp, rcv = Ether(expected), Ether(got)
    diffs: list[str] = []
    for layer in (Ether, IP, UDP, LHC):
        if layer in exp and layer in rcv:
            for field in exp[layer].fields_desc:
                a, b = exp[layer].getfieldval(field.name), rcv[layer].getfieldval(field.name)
                if a != b:
                    diffs.append(f"{layer.__name__}.{field.name}: expected {a!r}, got {b!r}")
        elif layer in exp or layer in rcv:
            diffs.append(f"{layer.__name__}: present in only one of them")
    if LHCPayload in exp and LHCPayload in rcv:
        a, b = exp[LHCPayload].words, rcv[LHCPayload].words
        lanes = [i for i in range(min(len(a), len(b))) if a[i] != b[i]]
        if len(a) != len(b):
            diffs.append(f"payload: expected {len(a)} words, got {len(b)}")
        for i in lanes[:4]:
            diffs.append(f"lane {i}: expected {a[i]:#x}, got {b[i]:#x}")
        if len(lanes) > 4:
            diffs.append(f"... {len(lanes)} lanes differ")
    return "; ".join(diffs) or "bytes differ beyond the parsed fields"


def with_ip(frame: Packet, **fields: int) -> Packet:
    """A copy of ``frame`` with IPv4 fields changed (ttl, tos, ...) and its checksum recomputed."""
    out = frame.copy()
    for name, value in fields.items():
        setattr(out[IP], name, value)
    out[IP].chksum = None
    return Ether(bytes(out))
