"""Read back what ``softswitch.capture`` writes (a pcapng file), independently of it and of Wireshark: the
reference the dissector tests compare tshark's view with; and the classic pcap files tcpdump writes
(``mininet/run.py --pcap``)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

SECTION_HEADER, INTERFACE_DESCRIPTION, ENHANCED_PACKET = 0x0A0D0D0A, 1, 6
IF_NAME, EPB_FLAGS = 2, 2


@dataclass(frozen=True)
class Frame:
    interface: str  # the interface's if_name: the switch port as the startup line names it
    direction: int  # epb_flags bits 0-1: 1 inbound, 2 outbound
    timestamp_us: int
    data: bytes


def _options(raw: bytes) -> dict[int, bytes]:
    out, at = {}, 0
    while at + 4 <= len(raw):
        code, length = struct.unpack_from("<HH", raw, at)
        if code == 0:
            break
        out[code] = raw[at + 4 : at + 4 + length]
        at += 4 + length + (-length % 4)
    return out


def read_frames(path: Path) -> list[Frame]:
    """Every packet of a little-endian pcapng file with Ethernet interfaces, in file order."""
    raw = path.read_bytes()
    interfaces: list[str] = []
    frames: list[Frame] = []
    at = 0
    while at < len(raw):
        kind, length = struct.unpack_from("<II", raw, at)
        body = raw[at + 8 : at + length - 4]
        assert struct.unpack_from("<I", raw, at + length - 4)[0] == length, f"block at {at}: lengths differ"
        if kind == SECTION_HEADER:
            assert struct.unpack_from("<I", body)[0] == 0x1A2B3C4D, "not a little-endian pcapng section"
        elif kind == INTERFACE_DESCRIPTION:
            linktype = struct.unpack_from("<H", body)[0]
            assert linktype == 1, f"interface {len(interfaces)}: link type {linktype}, not Ethernet"
            interfaces.append(_options(body[8:])[IF_NAME].decode())
        elif kind == ENHANCED_PACKET:
            interface, high, low, captured, original = struct.unpack_from("<IIIII", body)
            assert captured == original, "a frame was cut short"
            options = _options(body[20 + captured + (-captured % 4):])
            direction = struct.unpack("<I", options[EPB_FLAGS])[0] & 3 if EPB_FLAGS in options else 0
            frames.append(Frame(interfaces[interface], direction, high << 32 | low, body[20 : 20 + captured]))
        at += length
    return frames


def read_pcap(path: Path) -> list[bytes]:
    """The frames of a classic pcap file with Ethernet link type (tcpdump -w), in file order."""
    raw = path.read_bytes()
    magic = raw[:4]
    order = {b"\xd4\xc3\xb2\xa1": "<", b"\xa1\xb2\xc3\xd4": ">", b"\x4d\x3c\xb2\xa1": "<",
             b"\xa1\xb2\x3c\x4d": ">"}[magic]
    linktype = struct.unpack_from(order + "I", raw, 20)[0]
    assert linktype == 1, f"{path}: link type {linktype}, not Ethernet"
    frames, at = [], 24
    while at + 16 <= len(raw):
        captured = struct.unpack_from(order + "I", raw, at + 8)[0]
        frames.append(raw[at + 16 : at + 16 + captured])
        at += 16 + captured
    return frames
