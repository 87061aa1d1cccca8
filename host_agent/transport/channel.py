"""The worker's UDP socket, with optional loss and duplication in both directions for tests and benchmarks.

Impairments sit here, at the agent's socket, because this kernel has no netem: what the channel drops or
doubles is counted, so a lossy run can show that the loss it asked for really happened.
"""

from __future__ import annotations

import random
import socket
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Impairment:
    """Probabilities of dropping or duplicating a datagram, each direction on its own."""

    loss: float = 0.0
    duplicate: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("loss", "duplicate"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} probability must be in [0, 1), not {value}")

    @property
    def active(self) -> bool:
        return self.loss > 0 or self.duplicate > 0


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


@dataclass
class Channel:
    """One bound UDP socket that talks to one switch address."""

    local: tuple[str, int]
    switch: tuple[str, int] = ("0.0.0.0", 0)  # set once the controller says where the switch is
    impairment: Impairment = field(default_factory=Impairment)

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        self.sock.bind(self.local)
        self.sock.setblocking(False)
        self.local = self.sock.getsockname()
        self.counters = ChannelCounters()
        self._random = random.Random(self.impairment.seed)
        self._held: bytes | None = None  # an incoming datagram to deliver a second time

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, datagram: bytes | memoryview) -> None:
        """Send one datagram to the switch (or lose or double it, when impaired)."""
        if self.impairment.active:
            if self._random.random() < self.impairment.loss:
                self.counters.dropped_out += 1
                return
            if self._random.random() < self.impairment.duplicate:
                self.counters.duplicated_out += 1
                self._sendto(datagram)
        self._sendto(datagram)

    def _sendto(self, datagram: bytes | memoryview) -> None:
        try:
            self.sock.sendto(datagram, self.switch)
        except (BlockingIOError, ConnectionRefusedError):
            self.counters.dropped_out += 1  # a full socket buffer loses it, as a full link would
            return
        self.counters.sent += 1

    def receive(self, buffer: bytearray) -> tuple[int, tuple[str, int]] | None:
        """One datagram into ``buffer``: (length, source), or None when nothing is waiting."""
        if self._held is not None:
            data, self._held = self._held, None
            buffer[: len(data)] = data
            return len(data), self.switch
        while True:
            try:
                length, source = self.sock.recvfrom_into(buffer)
            except BlockingIOError:
                return None
            self.counters.received += 1
            if not self.impairment.active:
                return length, source
            if self._random.random() < self.impairment.loss:
                self.counters.dropped_in += 1
                continue
            if self._random.random() < self.impairment.duplicate and source == self.switch:
                self.counters.duplicated_in += 1
                self._held = bytes(buffer[:length])
            return length, source

    def close(self) -> None:
        self.sock.close()
