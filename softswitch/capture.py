"""``lhc-softswitch --pcap FILE``: every frame the data plane receives and sends, as a pcapng file.

Why pcapng rather than classic pcap: one capture holds all the switch's ports, and a reader must see
which port a frame crossed and in which direction. Each switch port is one pcapng interface (named as the
startup line names the port, e.g. ``1@127.0.0.1:19520/udp``) and each frame carries the direction flag
(inbound: received by the switch; outbound: sent by it), which Wireshark shows as ``frame.interface_name``
and ``frame.packet_flags_direction``.

Frames are the pipeline's own Ethernet frames (link type Ethernet): on an AF_PACKET port the bytes on the
wire; on a UDP port the frame the port synthesizes around each datagram it receives (docs/softswitch.md)
and, for a frame it sends, the frame whose UDP payload leaves as the datagram, to the frame's (ipv4.dst,
udp.dst). A frame is recorded when it enters the pipeline and when the pipeline hands it to a port to
send, so a datagram the kernel then refuses is still in the capture; frames the pipeline drops, or sends
to a port with nothing attached, are not. Timestamps are per burst (microseconds): the frames of one
burst share the time the burst began, in the order the pipeline handled them.

Both pipelines feed ``record``: the Python data plane per frame, the native one through a list its C
burst appends ``(direction, port, frame)`` to only while a capture is configured (``Dataplane.set_capture``),
so a switch without ``--pcap`` pays one pointer test per frame.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

#: Direction codes: the native engine's list carries them, and they are pcapng's epb_flags values.
INBOUND = 1
OUTBOUND = 2

_SECTION_HEADER = 0x0A0D0D0A
_INTERFACE_DESCRIPTION = 0x00000001
_ENHANCED_PACKET = 0x00000006
_BYTE_ORDER_MAGIC = 0x1A2B3C4D
_LINKTYPE_ETHERNET = 1
_SNAPLEN = 0  # no limit: frames are recorded whole
_OPT_END, _OPT_SHB_USERAPPL, _OPT_IF_NAME, _OPT_IF_DESCRIPTION, _OPT_EPB_FLAGS = 0, 4, 2, 3, 2


def _option(code: int, value: bytes) -> bytes:
    return struct.pack("<HH", code, len(value)) + value + bytes(-len(value) % 4)


def _block(kind: int, body: bytes) -> bytes:
    """A pcapng block: type, total length, body (padded to 32 bits), total length again."""
    body += bytes(-len(body) % 4)
    length = 12 + len(body)
    return struct.pack("<II", kind, length) + body + struct.pack("<I", length)


class PcapngWriter:
    """A pcapng file with one Ethernet interface per switch port; ``record`` appends a frame."""

    def __init__(self, path: str | Path, ports: Iterable[tuple[int, str]]) -> None:
        """``ports``: (switch port number, its name) for every port, in the order they were opened."""
        self.path = Path(path)
        self._file: BinaryIO = open(self.path, "wb")  # noqa: SIM115 -- open for the switch's life
        self._interface: dict[int, int] = {}
        self.frames = 0
        end = _option(_OPT_END, b"")
        shb = struct.pack("<IHHq", _BYTE_ORDER_MAGIC, 1, 0, -1)  # version 1.0, section length unknown
        shb += _option(_OPT_SHB_USERAPPL, b"lhc-softswitch")
        blocks = [_block(_SECTION_HEADER, shb + end)]
        for number, name in ports:
            self._interface[number] = len(self._interface)
            idb = struct.pack("<HHI", _LINKTYPE_ETHERNET, 0, _SNAPLEN) + _option(_OPT_IF_NAME, name.encode())
            idb += _option(_OPT_IF_DESCRIPTION, f"softswitch port {number}".encode()) + end
            blocks.append(_block(_INTERFACE_DESCRIPTION, idb))
        self._file.write(b"".join(blocks))
        self._file.flush()

    def record(self, direction: int, port: int, frame: bytes, timestamp_us: int | None = None) -> None:
        """One frame that crossed switch port ``port`` in ``direction`` (INBOUND or OUTBOUND)."""
        if timestamp_us is None:
            timestamp_us = time.time_ns() // 1000
        flags = _option(_OPT_EPB_FLAGS, struct.pack("<I", direction)) + _option(_OPT_END, b"")
        header = struct.pack("<IIIII", self._interface[port], timestamp_us >> 32, timestamp_us & 0xFFFFFFFF,
                             len(frame), len(frame))
        self._file.write(_block(_ENHANCED_PACKET, header + bytes(frame) + bytes(-len(frame) % 4) + flags))
        self.frames += 1

    def record_all(self, records: Iterable[tuple[int, int, bytes]], timestamp_us: int) -> None:
        """``(direction, port, frame)`` records of one burst, all stamped ``timestamp_us``."""
        for direction, port, frame in records:
            self.record(direction, port, frame, timestamp_us)

    def flush(self) -> None:
        """Out to the file: after every burst, so a reader (or a killed switch) loses nothing recorded."""
        self._file.flush()

    def close(self) -> None:
        self._file.close()
