"""Many datagrams per system call (sendmmsg, recvmmsg in ``_udp.c``), or one per call where it is not built.

The worker's channel (``host_agent/transport/channel.py``) and softswitch's UDP ports use it. Both
implementations have the same contract, so what runs above them behaves the same either way: a batch
leaves in order, a datagram the kernel refuses (full buffer, unreachable port, an address this socket may
not send to) is counted as failed, under its errno, and skipped, and received datagrams land one per slot
of a caller's buffer. Only an errno of ``constants.UDP_FATAL_ERRORS`` (the socket's own faults) raises.
"""

from __future__ import annotations

import errno
import os
import socket
from types import ModuleType
from typing import Protocol

from lhc_ina import constants as c

_native: ModuleType | None
try:
    from . import _udp as _native
except ImportError:  # built without a C compiler
    _native = None

#: A UDP payload is at most 65,507 bytes on IPv4: a slot this long never cuts a datagram.
MAX_DATAGRAM = 65536
#: The errnos that make a socket unusable (``constants.UDP_FATAL_ERRORS``; udp_batch.c's twin is
#: udp_error_is_fatal); any other send or receive error loses only its datagram.
FATAL_ERRNOS = frozenset(getattr(errno, name) for name in c.UDP_FATAL_ERRORS)
#: recvmmsg takes at most this many messages per call (the kernel's UIO_MAXIOV).
MAX_BATCH = 1024


def is_fatal(error: OSError) -> bool:
    """Whether ``error`` is the socket's own fault (raise), not one datagram's (a drop, as on a lost link)."""
    return error.errno in FATAL_ERRNOS


def errno_names(drops: dict[int, int]) -> dict[str, int]:
    """``{errno: count}`` as ``{"EINVAL": count}``, sorted by name: how counters show drops."""
    return dict(sorted((errno.errorcode.get(number, str(number)), count) for number, count in drops.items()))

Address = tuple[str, int]
Received = list[tuple[int, Address]]


class BatchIO(Protocol):
    """What the channel needs of a batched socket layer."""

    def send(self, sock: socket.socket, datagrams: list, address: Address) -> tuple[int, int]:
        """Send ``datagrams`` to ``address`` in order: (sent, failed)."""
        ...

    def send_each(self, sock: socket.socket, datagrams: list, destinations: list[bytes]) -> tuple[int, int]:
        """Send datagram i to ``destinations[i]`` (6 bytes: IPv4 address and port, network order), in
        order: (sent, failed)."""
        ...

    def receive(self, sock: socket.socket, buffer: bytearray, slot: int, capacity: int) -> Received:
        """Up to ``capacity`` waiting datagrams into ``buffer``'s slots: [(length, source)]."""
        ...

    @property
    def drops(self) -> dict[int, int]:
        """``{errno: datagrams dropped for it}`` over every send so far (a fatal error counts the datagrams
        of its call that never left under its own errno)."""
        ...


class NativeIO:
    """sendmmsg and recvmmsg over ``udp_batch.c``: one system call per batch, datagrams to one destination
    as UDP GSO runs where the kernel takes them (one instance per socket: it keeps the socket's GSO state)."""

    name = "native"

    def __init__(self) -> None:
        self._sender = _native.Sender(c.UDP_GSO_SEGMENTS, c.UDP_GSO_REFUSALS, c.UDP_GSO_BYTES)

    @property
    def gso(self) -> bool:
        """Whether sends still go as GSO runs (off after ``UDP_GSO_REFUSALS`` refusals)."""
        return self._sender.gso

    @property
    def drops(self) -> dict[int, int]:
        return self._sender.drops

    def send(self, sock: socket.socket, datagrams: list, address: Address) -> tuple[int, int]:
        return self._sender.send_batch(_fileno(sock), datagrams, address[0], address[1])

    def send_each(self, sock: socket.socket, datagrams: list, destinations: list[bytes]) -> tuple[int, int]:
        return self._sender.send_each(_fileno(sock), datagrams, destinations)

    def receive(self, sock: socket.socket, buffer: bytearray, slot: int, capacity: int) -> Received:
        return _native.recv_batch(_fileno(sock), buffer, slot, capacity)


def _fileno(sock: socket.socket) -> int:
    """The socket's descriptor; a closed socket raises EBADF here rather than pass -1 (or a number since
    given to another socket) to the kernel."""
    fd = sock.fileno()
    if fd < 0:
        raise OSError(errno.EBADF, os.strerror(errno.EBADF), "a closed socket")
    return fd


class PythonIO:
    """sendto and recvfrom_into: one system call per datagram, where the extension is not built."""

    name = "python"

    def __init__(self) -> None:
        self._drops: dict[int, int] = {}

    @property
    def drops(self) -> dict[int, int]:
        return dict(self._drops)

    def _drop(self, error: int, count: int = 1) -> None:
        """``count`` datagrams lost to errno ``error`` (udp_batch.c's drop)."""
        self._drops[error] = self._drops.get(error, 0) + count

    def send(self, sock: socket.socket, datagrams: list, address: Address) -> tuple[int, int]:
        return self._send_all(sock, [(datagram, address) for datagram in datagrams])

    def send_each(self, sock: socket.socket, datagrams: list, destinations: list[bytes]) -> tuple[int, int]:
        if len(datagrams) != len(destinations):
            raise ValueError(f"{len(datagrams)} datagrams but {len(destinations)} destinations")
        if any(len(destination) != 6 for destination in destinations):
            raise ValueError("a destination has not 6 bytes (IPv4 address, port)")
        addresses = [(socket.inet_ntoa(d[:4]), int.from_bytes(d[4:], "big")) for d in destinations]
        return self._send_all(sock, list(zip(datagrams, addresses, strict=True)))

    def _send_all(self, sock: socket.socket, pairs: list[tuple[bytes | memoryview, Address]]
                  ) -> tuple[int, int]:
        """udp_batch.c's one_by_one: each datagram on its own, a drop counted under its errno."""
        failed = 0
        for at, (datagram, address) in enumerate(pairs):
            try:
                sock.sendto(datagram, address)
            except OSError as error:
                if is_fatal(error):  # the socket is unusable: nothing after it leaves either
                    self._drop(error.errno, len(pairs) - at)
                    raise
                self._drop(error.errno)
                failed += 1  # this datagram is lost, as in the native layer; the rest still leave
        return len(pairs) - failed, failed

    def receive(self, sock: socket.socket, buffer: bytearray, slot: int, capacity: int) -> Received:
        view = memoryview(buffer)
        received: Received = []
        for index in range(capacity):
            try:
                received.append(sock.recvfrom_into(view[index * slot : (index + 1) * slot]))
            except OSError as error:
                if is_fatal(error):
                    raise
                break
        return received


def native_udp_available() -> bool:
    """Whether setup.py built the batched I/O extension."""
    return _native is not None


def batch_io(native: bool | None = None) -> BatchIO:
    """The native layer when built (``native=None``), or the one asked for; a clear error when the
    native one is asked for and not built."""
    if native is None:
        native = _native is not None
    if native and _native is None:
        raise RuntimeError(
            "the batched UDP extension (lhc_ina/_udp.c) is not built: reinstall "
            "(pip install -e .) where a C compiler and the Python headers are present"
        )
    return NativeIO() if native else PythonIO()


class ReceiveBatch:
    """Room for ``capacity`` datagrams of up to ``slot`` bytes, refilled by each ``Channel.receive_many``.

    A longer datagram arrives cut to ``slot`` bytes, so a reader that accepts only datagrams of exactly
    n bytes can use ``slot = n + 1``: a cut one is then never mistaken for a whole one.
    """

    def __init__(self, capacity: int = 64, slot: int = MAX_DATAGRAM) -> None:
        if not 1 <= capacity <= MAX_BATCH:
            raise ValueError(f"a receive batch holds 1..{MAX_BATCH} datagrams, not {capacity}")
        if not 1 <= slot <= MAX_DATAGRAM:
            raise ValueError(f"a receive slot holds 1..{MAX_DATAGRAM} bytes, not {slot}")
        self.capacity = capacity
        self.slot = slot
        self.buffer = bytearray(capacity * slot)
        view = memoryview(self.buffer)
        self._slots = [view[i * slot : (i + 1) * slot] for i in range(capacity)]
        #: What the last receive delivered, in order: (slot index, length, source); a duplicated datagram
        #: is listed twice, one after the other, pointing at the same slot.
        self.entries: list[tuple[int, int, Address]] = []

    def __len__(self) -> int:
        return len(self.entries)

    def datagram(self, index: int) -> memoryview:
        """The ``index``-th datagram the last receive delivered."""
        at, length, _ = self.entries[index]
        return self._slots[at][:length]

    def source(self, index: int) -> Address:
        return self.entries[index][2]
