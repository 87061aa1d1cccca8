"""The lhc packet on the wire: one layout, three faces.

Everything here is derived from ``lhc_ina.constants.HEADER_FIELDS``:

- ``PACKET_DTYPE``: a numpy structured dtype of the lhc header plus its ``LANES`` payload words, for the
  data path: a batch of packets packs or parses in one vectorized call (``pack_packets`` /
  ``parse_packets``), never a Python loop over words.
- ``LhcHeader`` with ``pack``/``unpack``: one header via ``struct``, for control code and tests.
- ``LHC`` / ``LHCPayload``: scapy layers bound to the lhc UDP port range, for PTF tests and captures.

A test checks that all three produce the same bytes. Frames (Ethernet/IPv4/UDP around the lhc bytes)
are built by ``build_frame`` for raw-socket users; the UDP transport sends the lhc bytes alone.
"""

from __future__ import annotations

import struct
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from lhc_ina import constants as c


class MalformedPacket(ValueError):
    """A buffer that is not a well-formed lhc packet; the message says what is wrong."""


def _byte_groups() -> list[list[tuple[str, int]]]:
    """Split HEADER_FIELDS into groups that each fill whole bytes (sub-byte fields share a byte)."""
    groups: list[list[tuple[str, int]]] = []
    current: list[tuple[str, int]] = []
    bits = 0
    for name, width in c.HEADER_FIELDS:
        current.append((name, width))
        bits += width
        if bits % 8 == 0:
            groups.append(current)
            current, bits = [], 0
    if current:
        raise AssertionError("HEADER_FIELDS does not end on a byte boundary")
    return groups


_GROUPS = _byte_groups()
_STRUCT_CODES = {8: "B", 16: "H", 32: "I"}
_GROUP_BITS = [sum(width for _, width in group) for group in _GROUPS]
HEADER_STRUCT = struct.Struct("!" + "".join(_STRUCT_CODES[bits] for bits in _GROUP_BITS))
assert HEADER_STRUCT.size == c.HEADER_BYTES

def _field_positions() -> tuple[dict[str, int], dict[str, int]]:
    """Each field's byte offset in the header (of the byte group holding it) and its shift in that group."""
    offsets: dict[str, int] = {}
    shifts: dict[str, int] = {}
    offset = 0
    for group, bits in zip(_GROUPS, _GROUP_BITS, strict=True):
        left = bits
        for name, width in group:
            left -= width
            offsets[name], shifts[name] = offset, left
        offset += bits // 8
    return offsets, shifts


HEADER_OFFSETS, HEADER_SHIFTS = _field_positions()

#: Header fields packed into a shared byte get one dtype field per group, named after the group.
_DTYPE_NAMES = ["_".join(name for name, _ in group) if len(group) > 1 else group[0][0] for group in _GROUPS]
HEADER_DTYPE = np.dtype(
    [(name, f">u{bits // 8}") for name, bits in zip(_DTYPE_NAMES, _GROUP_BITS, strict=True)]
)
PACKET_DTYPE = np.dtype([*HEADER_DTYPE.descr, ("payload", ">u4", (c.LANES,))])
assert PACKET_DTYPE.itemsize == c.HEADER_BYTES + c.PAYLOAD_BYTES


@dataclass(frozen=True)
class LhcHeader:
    """One lhc header. Field names and widths are those of ``constants.HEADER_FIELDS``."""

    msg_type: int = c.MsgType.DATA
    op: int = c.Op.ADD
    ver: int = 0
    flags: int = 0
    worker_id: int = 0
    job_id: int = 0
    slot: int = 0
    epoch: int = 0
    seq: int = 0
    bitmap: int = 0

    def __post_init__(self) -> None:
        for name, width in c.HEADER_FIELDS:
            value = getattr(self, name)
            if not 0 <= int(value) < (1 << width):
                raise ValueError(f"lhc header field {name}={value} does not fit in {width} bits")

    def pack(self) -> bytes:
        values = []
        for group in _GROUPS:
            word, shift = 0, sum(width for _, width in group)
            for name, width in group:
                shift -= width
                word |= int(getattr(self, name)) << shift
            values.append(word)
        return HEADER_STRUCT.pack(*values)

    @classmethod
    def unpack(cls, buf: bytes | memoryview) -> LhcHeader:
        if len(buf) < c.HEADER_BYTES:
            raise MalformedPacket(f"lhc header needs {c.HEADER_BYTES} bytes, got {len(buf)}")
        out: dict[str, int] = {}
        for group, word in zip(_GROUPS, HEADER_STRUCT.unpack_from(buf), strict=True):
            shift = sum(width for _, width in group)
            for name, width in group:
                shift -= width
                out[name] = (word >> shift) & ((1 << width) - 1)
        return cls(**out)

    def replace(self, **changes: int) -> LhcHeader:
        return LhcHeader(**{**asdict(self), **changes})


assert [f.name for f in fields(LhcHeader)] == [name for name, _ in c.HEADER_FIELDS]


def stream_position(p: int, slot_count: int) -> dict[str, int]:
    """The header fields of packet ``p`` of a job's stream (docs/protocol.md, section 3): ``slot = p mod S``,
    ``ver = (p div S) mod 2``, ``seq = p mod 2^32``, with S the job's ``slot_count``, so that packet ``p`` of
    every worker meets in one slot copy and ``seq`` names its round."""
    if p < 0 or slot_count < 1:
        raise ValueError(f"packet {p} of a stream over {slot_count} slots: need p >= 0 and slot_count >= 1")
    return {"slot": p % slot_count, "ver": (p // slot_count) % c.SLOT_COPIES, "seq": p & 0xFFFFFFFF}


def empty_packets(count: int) -> np.ndarray:
    """A zeroed array of ``count`` packets (``PACKET_DTYPE``), to fill field by field."""
    return np.zeros(count, dtype=PACKET_DTYPE)


def set_header_fields(packets: np.ndarray, **values: Any) -> None:
    """Assign header fields (scalars or per-packet arrays) by their HEADER_FIELDS names, in place."""
    for group, dtype_name in zip(_GROUPS, _DTYPE_NAMES, strict=True):
        names = [name for name, _ in group]
        if not any(name in values for name in names):
            continue
        if len(group) == 1:
            packets[dtype_name] = values[names[0]]
            continue
        word = packets[dtype_name].astype(np.uint32)
        shift = sum(width for _, width in group)
        for name, width in group:
            shift -= width
            if name in values:
                mask = ((1 << width) - 1) << shift
                column = np.asarray(values[name], dtype=np.uint32) << shift
                word = (word & ~np.uint32(mask)) | (column & mask)
        packets[dtype_name] = word


def header_field(packets: np.ndarray, name: str) -> np.ndarray:
    """One header field of every packet, as an unsigned array."""
    for group, dtype_name in zip(_GROUPS, _DTYPE_NAMES, strict=True):
        shift = sum(width for _, width in group)
        for field_name, width in group:
            shift -= width
            if field_name == name:
                column = packets[dtype_name].astype(np.uint32)
                return (column >> shift) & ((1 << width) - 1) if len(group) > 1 else column
    raise KeyError(f"no lhc header field {name!r}")


def pack_packets(packets: np.ndarray) -> list[bytes]:
    """Serialize a ``PACKET_DTYPE`` array into one bytes object per packet (lhc header + payload)."""
    raw = packets.astype(PACKET_DTYPE, copy=False).tobytes()
    size = PACKET_DTYPE.itemsize
    return [raw[i : i + size] for i in range(0, len(raw), size)]


def parse_packet(buf: bytes | memoryview) -> np.ndarray:
    """Parse one lhc packet (header + exactly ``LANES`` words) into a 0-d ``PACKET_DTYPE`` record."""
    if len(buf) != PACKET_DTYPE.itemsize:
        raise MalformedPacket(
            f"lhc packet must be {PACKET_DTYPE.itemsize} bytes (header + {c.LANES} lanes), got {len(buf)}"
        )
    return np.frombuffer(buf, dtype=PACKET_DTYPE, count=1)[0]


def pack_packet(header: LhcHeader, words: np.ndarray | list[int]) -> bytes:
    """Header and ``LANES`` payload words (int32 or uint32; negative values wrap) as lhc bytes."""
    lanes = np.asarray(words)
    if lanes.shape != (c.LANES,):
        raise ValueError(f"an lhc payload has exactly {c.LANES} words, got shape {lanes.shape}")
    return header.pack() + lanes.astype(np.int64).astype(np.uint32).astype(">u4").tobytes()


def unpack_packet(buf: bytes | memoryview) -> tuple[LhcHeader, np.ndarray]:
    """Inverse of ``pack_packet``: the header and the payload as uint32 words."""
    if len(buf) != PACKET_DTYPE.itemsize:
        raise MalformedPacket(
            f"lhc packet must be {PACKET_DTYPE.itemsize} bytes (header + {c.LANES} lanes), got {len(buf)}"
        )
    header = LhcHeader.unpack(buf)
    words = np.frombuffer(buf, dtype=">u4", offset=c.HEADER_BYTES, count=c.LANES).astype(np.uint32)
    return header, words


# --- Frames ----------------------------------------------------------------------------------------
# Where each header and each field a switch reads or rewrites sits in a whole frame (Ethernet, IPv4
# without options, UDP, lhc, payload): ints for single fields, slices for addresses and ports.
FRAME_IPV4 = c.ETHERNET_BYTES
FRAME_UDP = FRAME_IPV4 + c.IPV4_BYTES
FRAME_LHC = FRAME_UDP + c.UDP_BYTES
FRAME_PAYLOAD = FRAME_LHC + c.HEADER_BYTES
FRAME_END = FRAME_PAYLOAD + c.PAYLOAD_BYTES
ETH_DST, ETH_SRC, ETH_TYPE = slice(0, 6), slice(6, 12), 12
IP_TOTAL_LEN, IP_FRAG, IP_TTL, IP_PROTO = FRAME_IPV4 + 2, FRAME_IPV4 + 6, FRAME_IPV4 + 8, FRAME_IPV4 + 9
IP_CHECKSUM = FRAME_IPV4 + 10
IP_SRC, IP_DST = slice(FRAME_IPV4 + 12, FRAME_IPV4 + 16), slice(FRAME_IPV4 + 16, FRAME_IPV4 + 20)
UDP_SPORT, UDP_DPORT = slice(FRAME_UDP, FRAME_UDP + 2), slice(FRAME_UDP + 2, FRAME_UDP + 4)
UDP_LEN, UDP_CHECKSUM = FRAME_UDP + 4, FRAME_UDP + 6
#: The first byte of an IPv4 header without options: version 4, IHL 5 words (the only one parsed as IPv4).
IPV4_VERSION_IHL = 0x40 | c.IPV4_BYTES // 4
#: The fragment offset: the low 13 bits of the flags word at IP_FRAG.
IP_FRAG_OFFSET_MASK = 0x1FFF


def ipv4_checksum(header: bytes) -> int:
    """RFC 791 header checksum of an IPv4 header whose checksum field is zero."""
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def mac_bytes(mac: str) -> bytes:
    return bytes(int(part, 16) for part in mac.split(":"))


def ip_bytes(addr: str) -> bytes:
    return bytes(int(part) for part in addr.split("."))


def build_frame(
    lhc_bytes: bytes,
    *,
    src_mac: str,
    dst_mac: str,
    src_ip: str,
    dst_ip: str,
    src_port: int,
    dst_port: int = c.UDP_PORT_BASE,
    ttl: int = 64,
) -> bytes:
    """Ethernet/IPv4/UDP around lhc bytes, UDP checksum 0 (allowed over IPv4)."""
    udp_len = c.UDP_BYTES + len(lhc_bytes)
    ip = struct.pack(
        "!BBHHHBBH4s4s", IPV4_VERSION_IHL, 0, c.IPV4_BYTES + udp_len, 0, 0x4000, ttl, c.IP_PROTO_UDP, 0,
        ip_bytes(src_ip), ip_bytes(dst_ip),
    )
    ip = ip[:10] + struct.pack("!H", ipv4_checksum(ip)) + ip[12:]
    udp = struct.pack("!HHHH", src_port, dst_port, udp_len, 0)
    eth = mac_bytes(dst_mac) + mac_bytes(src_mac) + struct.pack("!H", c.ETHERTYPE_IPV4)
    return eth + ip + udp + lhc_bytes


# --- scapy -----------------------------------------------------------------------------------------
def _scapy_layers() -> tuple[type, type]:
    from scapy.fields import BitEnumField, BitField, FieldListField, IntField
    from scapy.layers.inet import UDP
    from scapy.packet import Packet, bind_layers

    enums = {
        "msg_type": {t.value: t.name for t in c.MsgType},
        "op": {o.value: o.name for o in c.Op},
    }
    header_fields = [
        BitEnumField(name, 0, width, enums[name]) if name in enums else BitField(name, 0, width)
        for name, width in c.HEADER_FIELDS
    ]

    class LHC(Packet):
        name = "LHC"
        fields_desc = header_fields

    class LHCPayload(Packet):
        name = "LHCPayload"
        fields_desc = [FieldListField("words", [], IntField("word", 0))]  # noqa: RUF012

    for port in range(c.UDP_PORT_BASE, c.UDP_PORT_BASE + c.UDP_PORT_COUNT):
        bind_layers(UDP, LHC, dport=port)
        bind_layers(UDP, LHC, sport=port)
    bind_layers(LHC, LHCPayload)
    return LHC, LHCPayload


_SCAPY: tuple[type, type] | None = None


def scapy_layers() -> tuple[type, type]:
    """The scapy classes ``(LHC, LHCPayload)``, bound to the lhc UDP ports (scapy is imported lazily:
    it is slow to import and the data path does not need it)."""
    global _SCAPY
    if _SCAPY is None:
        _SCAPY = _scapy_layers()
    return _SCAPY
