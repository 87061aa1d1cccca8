"""Switch ports: how frames get into the pipeline's receive buffer and out to the world.

Two kinds, both non-blocking sockets polled by ``receive_loop``:

- ``RawPort`` (``--port N@IFACE``): an AF_PACKET socket on a real interface (a veth for Mininet and PTF;
  needs root). Every frame the interface receives enters the pipeline; frames the host itself sends on
  that interface (PACKET_OUTGOING, which includes what this switch sends) are ignored, so the switch never
  re-reads its own output.
- ``UdpPort`` (``--udp N@HOST:UDPPORT``): a UDP socket, no root. A datagram's payload is the lhc bytes;
  the port wraps it in a synthesized Ethernet/IPv4/UDP frame built from the datagram's addresses so the
  same pipeline runs, and sends a frame leaving the port as a UDP datagram (the bytes after the UDP
  header) to the frame's (ipv4.dst, udp.dst). Frames leaving a UDP port are queued and sent together by
  ``flush`` (one sendmmsg, ``lhc_ina.udp``), which the data plane calls after each burst: a result's W
  copies, one per worker, then cost one system call instead of W.

Synthetic frames of a UDP port (documented in docs/softswitch.md): a datagram from ``A:p`` to the port's
``H:q`` becomes ``Ethernet(src=02:00:A, dst=02:00:H, type=IPv4) / IPv4(src=A, dst=H, ttl=64, DF, id=0,
valid checksum) / UDP(sport=p, dport=q, checksum=0)``, where ``02:00:A`` is a locally administered MAC whose
last four bytes are the IPv4 address. The frame's MACs are not used when it leaves a UDP port.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import struct
from dataclasses import dataclass

from lhc_ina import constants as c
from lhc_ina.udp import batch_io, errno_names, is_fatal
from lhc_ina.wire import (
    ETH_SRC,
    ETH_TYPE,
    FRAME_IPV4,
    FRAME_LHC,
    FRAME_UDP,
    IP_CHECKSUM,
    IP_DST,
    IP_PROTO,
    IP_SRC,
    IP_TOTAL_LEN,
    IPV4_VERSION_IHL,
    UDP_DPORT,
    UDP_LEN,
    UDP_SPORT,
    build_frame,
)

log = logging.getLogger(__name__)

_ETH_P_ALL = 0x0003
_PACKET_OUTGOING = 4
_PACKET_ADD_MEMBERSHIP = 1
_PACKET_MR_PROMISC = 1
_PACKET_IGNORE_OUTGOING = 23  # Linux >= 4.20; older kernels: the pkttype check below does the job
_SOL_PACKET = 263
#: The highest port number: ports are 9 bits and 511 is v1model's drop port.
MAX_PORT = (1 << 9) - 2
_SOCKET_BUFFER = 4 << 20  # bytes: absorbs bursts of a few thousand lhc packets
_U16 = struct.Struct("!H")


class PortSpecError(ValueError):
    """A --port or --udp argument that cannot be used; the message says what is wrong."""


@dataclass(frozen=True)
class PortSpec:
    """One switch port: its number and either an interface or a UDP (host, port) to bind."""

    number: int
    iface: str | None = None
    host: str | None = None
    udp_port: int | None = None

    def describe(self) -> str:
        """``N@IFACE`` or ``N@HOST:UDPPORT/udp``, as the startup line prints it."""
        if self.iface:
            return f"{self.number}@{self.iface}"
        return f"{self.number}@{self.host}:{self.udp_port}/udp"


def _port_number(text: str, spec: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= MAX_PORT:
        raise PortSpecError(f"{spec!r}: port number must be 0..{MAX_PORT} (511 is the drop port)")
    return int(text)


def parse_iface_spec(spec: str) -> PortSpec:
    """``N@IFACE`` -> PortSpec."""
    number, sep, iface = spec.partition("@")
    if not sep or not iface:
        raise PortSpecError(f"{spec!r}: expected N@IFACE, e.g. 1@veth1")
    return PortSpec(_port_number(number, spec), iface=iface)


_UDP_SPEC = re.compile(r"^(?:(\d+)@)?([^@:]+):(\d+)$")


def parse_udp_spec(spec: str, next_free: int) -> PortSpec:
    """``N@HOST:UDPPORT`` -> PortSpec; without ``N@`` the port is numbered ``next_free``."""
    match = _UDP_SPEC.match(spec)
    if not match:
        raise PortSpecError(f"{spec!r}: expected N@HOST:UDPPORT, e.g. 1@127.0.0.1:{c.UDP_PORT_BASE}")
    number = _port_number(match.group(1), spec) if match.group(1) else next_free
    try:
        host = socket.inet_ntoa(socket.inet_aton(match.group(2)))
    except OSError:
        raise PortSpecError(f"{spec!r}: {match.group(2)!r} is not an IPv4 address") from None
    udp_port = int(match.group(3))
    if udp_port != 0 and udp_port & c.UDP_PORT_MASK != c.UDP_PORT_BASE:
        raise PortSpecError(
            f"{spec!r}: UDP port {udp_port} is outside the lhc range {c.UDP_PORT_BASE}.."
            f"{c.UDP_PORT_BASE + c.UDP_PORT_COUNT - 1}: every datagram to it would be plain UDP, which the "
            "switch drops without a counter (use a port in the range, or 0 for a free one in it)"
        )
    return PortSpec(number, host=host, udp_port=udp_port)


def _bind_lhc_port(sock: socket.socket, spec: PortSpec) -> None:
    """Bind ``sock`` to the spec's address; port 0 takes the first free port of the lhc range (a port
    outside it would see only plain UDP)."""
    assert spec.host is not None and spec.udp_port is not None
    ports = [spec.udp_port] if spec.udp_port else range(c.UDP_PORT_BASE, c.UDP_PORT_BASE + c.UDP_PORT_COUNT)
    for port in ports:
        try:
            sock.bind((spec.host, port))
            return
        except OSError as exc:
            error = exc
    sock.close()
    raise PortSpecError(f"port {spec.describe()}: cannot bind: {error.strerror}") from None


def parse_port_specs(ifaces: list[str], udps: list[str]) -> list[PortSpec]:
    """All ports of a command line, checked for clashes (one number per port, one socket per address)."""
    specs = [parse_iface_spec(s) for s in ifaces]
    for text in udps:
        taken = {s.number for s in specs}
        next_free = next(n for n in range(1, MAX_PORT + 1) if n not in taken)
        specs.append(parse_udp_spec(text, next_free))
    numbers = [s.number for s in specs]
    duplicates = sorted({n for n in numbers if numbers.count(n) > 1})
    if duplicates:
        raise PortSpecError(f"port number(s) {duplicates} given twice")
    return specs


class UdpPort:
    """Port ``number`` as UDP on ``host:udp_port`` (see the module docstring for the synthetic frame)."""

    def __init__(self, spec: PortSpec, rx: bytearray) -> None:
        assert spec.host is not None and spec.udp_port is not None
        self.number = spec.number
        self.spec = spec
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER)
        _bind_lhc_port(self.sock, spec)
        self.sock.setblocking(False)
        self.address = self.sock.getsockname()
        self.spec = PortSpec(spec.number, host=spec.host, udp_port=self.address[1])  # port 0: the one bound
        self._rx = rx
        self._into = memoryview(rx)[FRAME_LHC:]
        local = socket.inet_aton(self.address[0])
        #: The headers every received datagram gets (the native pipeline synthesizes from it too).
        self.template = self._frame_template(local, self.address[1])
        # Sum of the IPv4 header's 16-bit words that never change (everything but src, total_len, csum).
        words = struct.unpack(f"!{c.IPV4_BYTES // 2}H", self.template[FRAME_IPV4:FRAME_UDP])
        changing = (IP_TOTAL_LEN, IP_CHECKSUM, IP_SRC.start, IP_SRC.start + 2)
        self._fixed_sum = sum(words) - sum(words[(at - FRAME_IPV4) // 2] for at in changing)
        self._sources: dict[str, tuple[bytes, int]] = {}
        self._io = batch_io()
        self._queued: list[bytes] = []  # datagrams to send at the next flush, in order
        self._destinations: list[bytes] = []  # theirs: IPv4 address and UDP port, as in the headers
        self.dropped_non_udp = 0

    @staticmethod
    def _frame_template(local: bytes, udp_port: int) -> bytes:
        """The headers every received datagram gets: to this port's address, from one filled in per
        datagram (source address and port, lengths and checksum are rewritten in ``receive``)."""
        return build_frame(
            b"",
            src_mac="02:00:00:00:00:00",
            dst_mac=":".join(f"{b:02x}" for b in b"\x02\x00" + local),
            src_ip="0.0.0.0",
            dst_ip=socket.inet_ntoa(local),
            src_port=0,
            dst_port=udp_port,
        )

    def fileno(self) -> int:
        return self.sock.fileno()

    def receive(self) -> int:
        """Receive one datagram as a frame into ``rx``; its length, or -1 when none is waiting."""
        try:
            size, (host, sport) = self.sock.recvfrom_into(self._into)
        except BlockingIOError:
            return -1
        source = self._sources.get(host)
        if source is None:
            if len(self._sources) > 4096:  # bounded: only live peers stay cached
                self._sources.clear()
            raw = socket.inet_aton(host)
            source = self._sources[host] = (raw, (raw[0] << 8 | raw[1]) + (raw[2] << 8 | raw[3]))
        raw, src_sum = source
        rx = self._rx
        rx[0:FRAME_LHC] = self.template
        rx[ETH_SRC.start + 2 : ETH_SRC.stop] = raw
        rx[IP_SRC] = raw
        total_len = c.IPV4_BYTES + c.UDP_BYTES + size
        total = self._fixed_sum + src_sum + total_len
        total = (total & 0xFFFF) + (total >> 16)
        total = (total & 0xFFFF) + (total >> 16)
        _U16.pack_into(rx, IP_TOTAL_LEN, total_len)
        _U16.pack_into(rx, IP_CHECKSUM, ~total & 0xFFFF)
        _U16.pack_into(rx, UDP_SPORT.start, sport)
        _U16.pack_into(rx, UDP_LEN, c.UDP_BYTES + size)
        return FRAME_LHC + size

    def send(self, frame: memoryview) -> bool:
        """A frame leaving this port: its UDP payload goes to (ipv4.dst, udp.dst) at the next ``flush``.
        False when the frame cannot leave (not IPv4/UDP) and is dropped."""
        if len(frame) < FRAME_LHC or _U16.unpack_from(frame, ETH_TYPE)[0] != c.ETHERTYPE_IPV4 \
                or frame[FRAME_IPV4] != IPV4_VERSION_IHL or frame[IP_PROTO] != c.IP_PROTO_UDP:
            self.dropped_non_udp += 1
            log.debug("port %d: dropped a frame that is not IPv4/UDP (UDP ports carry only UDP)", self.number)
            return False
        self._queued.append(bytes(frame[FRAME_LHC:]))
        self._destinations.append(bytes(frame[IP_DST]) + bytes(frame[UDP_DPORT]))
        return True

    @property
    def send_errors_by_errno(self) -> dict[str, int]:
        """Datagrams the kernel refused, per errno name (``{"EINVAL": 3}``)."""
        return errno_names(self._io.drops)

    @property
    def send_errors(self) -> int:
        """Datagrams the kernel refused (a full buffer, an address this socket may not send to, ...)."""
        return sum(self._io.drops.values())

    def flush(self) -> None:
        """Send the queued datagrams, in order; one the kernel refuses (a full socket buffer, an address
        this socket may not send to) is lost and counted under its errno, as on a full link, and the rest
        still leave. Raises OSError only when the socket itself is unusable (``lhc_ina.udp.is_fatal``):
        what had not left is then counted too."""
        if not self._queued:
            return
        queued, destinations = self._queued, self._destinations
        self._queued, self._destinations = [], []
        self._io.send_each(self.sock, queued, destinations)

    def close(self) -> None:
        self.sock.close()


class RawPort:
    """Port ``number`` on interface ``iface`` through an AF_PACKET socket (root)."""

    def __init__(self, spec: PortSpec, rx: bytearray) -> None:
        assert spec.iface is not None
        self.number = spec.number
        self.spec = spec
        try:
            ifindex = socket.if_nametoindex(spec.iface)
            # Protocol 0 receives nothing until bind() names the interface: no frame from elsewhere slips in.
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        except OSError as exc:
            raise PortSpecError(f"port {spec.describe()}: {exc.strerror or exc}") from None
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER)
            with contextlib.suppress(OSError):  # old kernel: receive() skips PACKET_OUTGOING frames itself
                self.sock.setsockopt(_SOL_PACKET, _PACKET_IGNORE_OUTGOING, 1)
            self.sock.bind((spec.iface, _ETH_P_ALL))
            membership = struct.pack("iHH8s", ifindex, _PACKET_MR_PROMISC, 0, b"")
            self.sock.setsockopt(_SOL_PACKET, _PACKET_ADD_MEMBERSHIP, membership)
        except OSError as exc:
            self.sock.close()
            raise PortSpecError(f"port {spec.describe()}: {exc.strerror or exc}") from None
        self.sock.setblocking(False)
        self._rx = memoryview(rx)
        self._drops: dict[int, int] = {}
        self._fatal: OSError | None = None  # the socket's own error, raised by the next flush
        self.dropped_non_udp = 0  # never counted: any frame may leave a raw port (for counters' one shape)

    def fileno(self) -> int:
        return self.sock.fileno()

    def receive(self) -> int:
        """Receive one frame into ``rx``; its length, 0 for a frame to skip (our own output), or -1 when none
        is waiting."""
        try:
            size, address = self.sock.recvfrom_into(self._rx)
        except BlockingIOError:
            return -1
        return 0 if address[2] == _PACKET_OUTGOING else size

    def send(self, frame: memoryview) -> bool:
        """Send the frame now; True: it was handed to the socket. A refused send (ENXIO when the
        interface went away, a full buffer) is lost and counted under its errno, and later frames still
        try; an error of the socket's own is also kept for ``flush`` to raise, as the native flush does."""
        try:
            self.sock.send(frame)
        except OSError as exc:
            self._drops[exc.errno] = self._drops.get(exc.errno, 0) + 1
            if is_fatal(exc) and self._fatal is None:
                self._fatal = exc
            log.debug("port %d: send failed: %s", self.number, exc)
        return True

    @property
    def send_errors_by_errno(self) -> dict[str, int]:
        return errno_names(self._drops)

    @property
    def send_errors(self) -> int:
        return sum(self._drops.values())

    def flush(self) -> None:
        """Nothing is queued (a raw port sends each frame as it leaves: a veth's frames are few); raises
        the socket's own error if a send of this burst met one."""
        fatal, self._fatal = self._fatal, None
        if fatal is not None:
            raise fatal

    def close(self) -> None:
        self.sock.close()


Port = UdpPort | RawPort


def open_port(spec: PortSpec, rx: bytearray) -> Port:
    """The socket for ``spec``, receiving into the pipeline's buffer ``rx``."""
    return RawPort(spec, rx) if spec.iface else UdpPort(spec, rx)
