"""The worker's UDP socket, with optional loss and duplication in both directions for tests and benchmarks.

Impairments sit here, at the agent's socket, because this kernel has no netem: what the channel drops or
doubles is counted, so a lossy run can show that the loss it asked for really happened.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field

from lhc_ina.udp import ReceiveBatch, batch_io


@dataclass(frozen=True)
class Impairment:
    """Probabilities of dropping or duplicating a datagram, each direction on its own. ``burst`` > 1 loses
    datagrams in runs of that many (a UDP GSO send dropped whole at an interface, a queue overflowing):
    the loss rate stays ``loss``, the losses come together."""

    loss: float = 0.0
    duplicate: float = 0.0
    seed: int | None = None
    burst: int = 1

    def __post_init__(self) -> None:
        for name in ("loss", "duplicate"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} probability must be in [0, 1), not {value}")
        if self.burst < 1:
            raise ValueError(f"a loss burst is at least one datagram, not {self.burst}")

    @property
    def active(self) -> bool:
        return self.loss > 0 or self.duplicate > 0


class BurstLoss:
    """Which datagrams of one direction are lost: a batch (one send, one receive) is cut into runs of
    ``burst`` datagrams, and one draw decides whether a whole run is lost, as an interface drops a UDP GSO
    send whole. A run never reaches into the next batch: a lone retransmission later is a run of its own.
    With ``burst`` 1 each datagram draws on its own. ``engine_io.c``'s ``lost`` is the same on the native
    engine's generator."""

    def __init__(self, impairment: Impairment, draw: random.Random) -> None:
        self._loss, self._burst, self._draw = impairment.loss, impairment.burst, draw
        self._left, self._dropping = 0, False

    def new_batch(self) -> None:
        self._left = 0

    def lost(self) -> bool:
        if self._left == 0:
            self._left, self._dropping = self._burst, self._draw.random() < self._loss
        self._left -= 1
        return self._dropping


@dataclass
class ChannelCounters:
    sent: int = 0
    received: int = 0
    dropped_out: int = 0
    dropped_in: int = 0
    duplicated_out: int = 0
    duplicated_in: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


#: Socket buffers: a window of results arriving while the I/O thread waits for a core must not overflow
#: them (each overflow is a loss to recover).
BUFFER_BYTES = 4 << 20
#: SO_RCVBUFFORCE / SO_SNDBUFFORCE (Linux): above net.core.rmem_max / wmem_max, with CAP_NET_ADMIN.
_FORCE = {socket.SO_RCVBUF: 33, socket.SO_SNDBUF: 32}


def _large_buffers(sock: socket.socket) -> None:
    """``BUFFER_BYTES`` each way: forced past the system's cap where this process may (root), else as
    much as the cap allows (the kernel clamps a plain request silently)."""
    for option, forced in _FORCE.items():
        try:
            sock.setsockopt(socket.SOL_SOCKET, forced, BUFFER_BYTES)
        except OSError:  # not permitted: the plain request, clamped to the system's cap
            sock.setsockopt(socket.SOL_SOCKET, option, BUFFER_BYTES)


@dataclass
class Channel:
    """One bound UDP socket that talks to one switch address, a batch of datagrams per system call.

    ``native`` picks the batched I/O layer (``lhc_ina/udp.py``): None takes sendmmsg/recvmmsg where the
    extension is built, False forces one system call per datagram. Impairments and counters are per
    datagram either way, drawn in the same order, so a seed gives the same losses on both layers.
    """

    local: tuple[str, int]
    switch: tuple[str, int] = ("0.0.0.0", 0)  # set once the controller says where the switch is
    impairment: Impairment = field(default_factory=Impairment)
    native: bool | None = None

    def __post_init__(self) -> None:
        self.io = batch_io(self.native)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        _large_buffers(self.sock)
        self.sock.bind(self.local)
        self.sock.setblocking(False)
        self.local = self.sock.getsockname()
        self.counters = ChannelCounters()
        self._random = random.Random(self.impairment.seed)
        self._loss_out = BurstLoss(self.impairment, self._random)
        self._loss_in = BurstLoss(self.impairment, self._random)
        self._resolved: tuple[tuple[str, int], tuple[str, int]] | None = None  # switch -> dotted address

    def fileno(self) -> int:
        return self.sock.fileno()

    def send_many(self, datagrams: Sequence[bytes | memoryview]) -> None:
        """Send ``datagrams`` to the switch in order (lost, in runs, or doubled when impaired);
        a datagram the kernel refuses (full socket buffer) is lost, as on a full link."""
        if self.impairment.active:
            datagrams = self._impair_outgoing(datagrams)
        if not datagrams:
            return
        sent, failed = self.io.send(self.sock, datagrams, self.destination())
        self.counters.sent += sent
        self.counters.dropped_out += failed

    def _impair_outgoing(self, datagrams: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
        kept: list[bytes | memoryview] = []
        self._loss_out.new_batch()
        for datagram in datagrams:
            if self._loss_out.lost():
                self.counters.dropped_out += 1
                continue
            if self._random.random() < self.impairment.duplicate:
                self.counters.duplicated_out += 1
                kept.append(datagram)
            kept.append(datagram)
        return kept

    def destination(self) -> tuple[str, int]:
        """The switch as a dotted IPv4 address and port (resolved once per address)."""
        if self._resolved is None or self._resolved[0] != self.switch:
            host, port = self.switch
            self._resolved = (self.switch, (socket.gethostbyname(host), port))
        return self._resolved[1]

    def receive_many(self, batch: ReceiveBatch) -> int:
        """Refill ``batch`` with the datagrams waiting (at most its capacity); returns how many were taken
        from the socket, so ``== batch.capacity`` means more may be waiting. ``len(batch)`` is how many
        it delivers after impairment: losses are left out, a duplicate follows its original."""
        received = self.io.receive(self.sock, batch.buffer, batch.slot, batch.capacity)
        self.counters.received += len(received)
        if not self.impairment.active:
            batch.entries = [(at, length, source) for at, (length, source) in enumerate(received)]
            return len(received)
        entries = []
        self._loss_in.new_batch()
        for at, (length, source) in enumerate(received):
            if self._loss_in.lost():
                self.counters.dropped_in += 1
                continue
            entries.append((at, length, source))
            if self._random.random() < self.impairment.duplicate and source == self.switch:
                self.counters.duplicated_in += 1
                entries.append((at, length, source))
        batch.entries = entries
        return len(received)

    def close(self) -> None:
        self.sock.close()
