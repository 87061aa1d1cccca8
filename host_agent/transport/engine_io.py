"""The engine a stream runs, with its I/O: ``_engine.c`` (with ``engine_io.c``) where it is built, else the
Python reference (``engine_core.py``, no I/O of its own) over the channel.

Both have one face: ``add``, ``restart``, ``step`` (the pure state machine, for tests), ``pump`` (one turn
of the I/O loop: send what is due, wait for a result, a timer or a wake-up, take a batch of results,
send again; the segments completed), ``stats``, ``rtt``, ``window``, ``stalled``, ``io_counters``.

The native engine does the socket work itself (recvmmsg, sendmmsg, the GIL released while it waits) and
applies the channel's impairment per datagram, counted as the channel would, so a lossy test or benchmark
measures the same thing on both. Its sends go through ``lhc_ina/udp_batch.c`` as UDP GSO runs (one message
carries up to ``UDP_GSO_SEGMENTS`` equal datagrams to the switch, one traversal of the kernel's stack) where
the kernel takes them, with that layer's one fallback rule and one rule for socket errors: an unusable
socket (closed, not a socket) raises ``OSError`` from ``pump`` at once, as the Python engine's channel
does; only a datagram the kernel refused counts as a drop.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import time
from dataclasses import replace
from types import ModuleType

from host_agent.transport.channel import Channel
from host_agent.transport.engine_core import DUPLICATE_THRESHOLD, EngineStats, PacketEngine, Stalled
from host_agent.transport.packets import PACKET_BYTES, StreamIdentity
from host_agent.transport.window import (
    INITIAL_RTO_S,
    INITIAL_WINDOW,
    MAX_PROBES,
    MAX_RTO_S,
    MIN_PTO_S,
    MIN_RTO_S,
    PTO_RTTS,
    QUEUE_TARGET_S,
    RTO_FLOOR_RTTS,
)
from lhc_ina import constants as c
from lhc_ina.udp import ReceiveBatch
from lhc_ina.wire import HEADER_OFFSETS, HEADER_SHIFTS

log = logging.getLogger(__name__)

_native: ModuleType | None
try:
    from host_agent.transport import _engine as _native
except ImportError:  # built without a C compiler
    _native = None

#: Results taken per system call, and at most per pump before the loop looks at its timers again.
RECEIVE_BATCH = 64
RECEIVE_BURST = 256


def native_engine_available() -> bool:
    return _native is not None


class ChannelEngine(PacketEngine):
    """The Python reference engine with its I/O: the channel's batched sends and receives."""

    def __init__(self, who: StreamIdentity, result_mask: int, channel: Channel, timeout_s: float) -> None:
        super().__init__(who, result_mask, channel.switch, timeout_s)
        self.channel = channel
        self._batch = ReceiveBatch(RECEIVE_BATCH, PACKET_BYTES + 1)  # + 1: a longer one is never whole

    def pump(self, wake_fd: int, max_wait: float) -> list[tuple[int, float]]:
        """One turn of the I/O loop (as ``_engine.c``'s): take the results already waiting (a thread that
        was off the CPU must not fire timers for results unread in its socket), decide and send what is
        due, sleep until a result, a wake-up or the next timer, take results again."""
        self.switch = self.channel.switch
        completed = self._drain()
        out, done = self.step(time.monotonic(), [])
        completed += done
        self._send(out)
        wakeup = self.next_wakeup()
        wait = 0.0 if completed else max_wait
        if wakeup is not None:
            wait = min(wait, max(0.0, wakeup - time.monotonic()))
        readable, _, _ = select.select([self.channel, wake_fd], [], [], wait)
        if wake_fd in readable:
            _drain_wake(wake_fd)
        if self.channel in readable:
            completed += self._drain()
            out, done = self.step(time.monotonic(), [])
            completed += done
            self._send(out)
        return completed

    def _drain(self) -> list[tuple[int, float]]:
        """What waits in the socket, a batch at a time, each batch followed by its decisions."""
        completed: list[tuple[int, float]] = []
        batch = self._batch
        for _ in range(RECEIVE_BURST // RECEIVE_BATCH):
            taken = self.channel.receive_many(batch)
            datagrams = [(batch.datagram(i), batch.source(i)) for i in range(len(batch))]
            out, done = self.step(time.monotonic(), datagrams, recover=False)
            completed += done
            self._send(out)
            if taken < batch.capacity:
                break
        return completed

    def _send(self, out: list[bytes]) -> None:
        if out:
            self.channel.send_many(out)

    def io_counters(self) -> dict[str, int]:
        return self.channel.counters.as_dict()


def _drain_wake(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


class NativeEngine:
    """``_engine.PacketEngine`` (C) behind the reference engine's face."""

    def __init__(self, who: StreamIdentity, result_mask: int, channel: Channel | None, timeout_s: float,
                 gso: bool = True) -> None:
        self.who = who
        self.channel = channel
        impairment = channel.impairment if channel is not None else None
        self._engine = _native.PacketEngine(
            fd=channel.fileno() if channel is not None else -1,
            job_id=who.job_id, rank=who.rank, epoch=who.epoch, slot_count=who.slot_count,
            result_mask=result_mask, timeout_s=timeout_s,
            loss=impairment.loss if impairment else 0.0,
            duplicate=impairment.duplicate if impairment else 0.0,
            seed=(impairment.seed or 0) if impairment else 0, gso=gso,
            loss_burst=impairment.burst if impairment else 1,
        )
        self._switch: tuple[str, int] | None = None

    def _sync_switch(self) -> None:
        if self.channel is not None and self.channel.switch != self._switch:
            self._switch = self.channel.switch
            host, port = self.channel.destination()
            self._engine.set_switch(host, port)

    def set_switch(self, address: tuple[str, int]) -> None:
        """Where results must come from (tests without a channel)."""
        self._switch = address
        self._engine.set_switch(*address)

    def add(self, ident: int, first: int, raw: bytes, result) -> None:
        self._engine.add(ident, first, raw, result)

    def restart(self, epoch: int) -> None:
        self.who = replace(self.who, epoch=epoch)
        self._engine.restart(epoch)

    def step(self, now: float, datagrams: list, recover: bool = True
             ) -> tuple[list[bytes], list[tuple[int, float]]]:
        return self._engine.step(now, datagrams, recover)

    def pump(self, wake_fd: int, max_wait: float) -> list[tuple[int, float]]:
        """As ``ChannelEngine.pump``; a closed channel raises ``OSError(EBADF)`` before its descriptor number
        (which the process may since have given to another socket) is used."""
        if self.channel is not None and self.channel.fileno() < 0:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF), "the packet engine's socket (closed)")
        self._sync_switch()
        return self._engine.pump(wake_fd, max_wait)

    def next_wakeup(self) -> float | None:
        return self._engine.next_wakeup()

    @property
    def next_free(self) -> int:
        return self._engine.next_free

    @property
    def low(self) -> int:
        return self._engine.low

    @property
    def stats(self) -> EngineStats:
        return EngineStats(**self._engine.stats())

    @property
    def rtt(self) -> _RoundTripView:
        return _RoundTripView(*self._engine.rtt())

    @property
    def window(self) -> _WindowView:
        return _WindowView(*self._engine.window())

    @property
    def stalled(self) -> Stalled | None:
        stalled = self._engine.stalled()
        return None if stalled is None else Stalled(*stalled)

    def io_counters(self) -> dict[str, int]:
        return self._engine.io_counters()


class _RoundTripView:
    def __init__(self, srtt: float | None, rttvar: float, rto: float) -> None:
        self.srtt, self.rttvar, self.rto = srtt, rttvar, rto


class _WindowView:
    def __init__(self, size: float, decreases: int, min_rtt: float) -> None:
        self.size, self.decreases, self.min_rtt = size, decreases, min_rtt
        self.packets = max(1, int(size))


def make_engine(who: StreamIdentity, result_mask: int, channel: Channel, timeout_s: float,
                native: bool | None = None) -> ChannelEngine | NativeEngine:
    """``native`` True: the native engine (an error if it is not built); False: the Python reference over
    the channel; None: native where built, unless the channel was told to use Python I/O."""
    if native and _native is None:
        raise RuntimeError("the native packet engine (host_agent/transport/_engine.c) is not built")
    if native is None:
        native = _native is not None and channel.io.name == "native"
        if _native is None:
            log.info("packet engine: the Python reference (host_agent/transport/_engine.c is not built)")
    if native:
        return NativeEngine(who, result_mask, channel, timeout_s)
    return ChannelEngine(who, result_mask, channel, timeout_s)


#: The constants the C engine must share with the reference (checked when the module loads).
SHARED_CONSTANTS = {
    "LANES": c.LANES, "HEADER_BYTES": c.HEADER_BYTES, "PACKET_BYTES": PACKET_BYTES,
    "UDP_GSO_SEGMENTS": c.UDP_GSO_SEGMENTS,
    "UDP_GSO_REFUSALS": c.UDP_GSO_REFUSALS, "UDP_GSO_BYTES": c.UDP_GSO_BYTES,
    "DUPLICATE_THRESHOLD": DUPLICATE_THRESHOLD, "MIN_RTO_S": MIN_RTO_S, "MAX_RTO_S": MAX_RTO_S,
    "INITIAL_RTO_S": INITIAL_RTO_S, "INITIAL_WINDOW": INITIAL_WINDOW, "RTO_FLOOR_RTTS": RTO_FLOOR_RTTS,
    "QUEUE_TARGET_S": QUEUE_TARGET_S, "RECEIVE_BATCH": RECEIVE_BATCH, "RECEIVE_BURST": RECEIVE_BURST,
    "PTO_RTTS": PTO_RTTS, "MIN_PTO_S": MIN_PTO_S, "MAX_PROBES": MAX_PROBES,
    "RESULT": int(c.MsgType.RESULT), "RESULT_RETX": int(c.MsgType.RESULT_RETX),
    "TYPE_SHIFT": HEADER_SHIFTS["msg_type"], "OFF_JOB_ID": HEADER_OFFSETS["job_id"],
    "OFF_EPOCH": HEADER_OFFSETS["epoch"], "OFF_SEQ": HEADER_OFFSETS["seq"],
    "OFF_BITMAP": HEADER_OFFSETS["bitmap"],
}
if _native is not None:
    _native.configure(SHARED_CONSTANTS)
