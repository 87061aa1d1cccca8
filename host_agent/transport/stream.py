"""One worker's reliable packet stream through the switch, run by one background I/O thread.

Messages (a codec step's words and op) are numbered in submission order, which is the same on every
worker, and laid end to end on the job's stream: packet p goes to slot ``p mod S``, copy ``(p div S) mod
2``, ``seq = p`` (docs/protocol.md). The thread keeps at most ``min(window, S)`` packets in flight and
never sends p + S before it holds the result of p (the switch's shadow-copy rule), retransmits a packet
identically when its timer fires, and accepts a result only when it passes the host's checks: the job,
the current epoch, an outstanding seq and the full bitmap. A message's future completes when all its
packets' results are in; the caller decodes on its own thread, so timers never wait for the codec.
What the window allows leaves as one batch, and results are drained a batch per system call
(``Channel.send_many`` / ``receive_many``: sendmmsg and recvmmsg where ``_udp.c`` is built).

An epoch change (the controller re-admitted the job, e.g. after the switch restarted empty) restarts the
stream at p = 0 under the new epoch with a one-packet *resync*: each worker adds 1 + the number of its
oldest unfinished message into its own lane, so every worker learns the oldest message some worker still
lacks, and all replay from there in the same order. A worker can be at most S packets ahead of another,
so the messages it must replay are still in its log.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

import numpy as np

from host_agent.errors import AggregationError
from host_agent.transport.channel import Channel
from host_agent.transport.packets import (
    PACKET_BYTES,
    StreamIdentity,
    build_packets,
    packet_count,
    parse_result,
    result_words,
)
from host_agent.transport.window import RoundTrip, Window
from lhc_ina import constants as c
from lhc_ina.udp import ReceiveBatch

log = logging.getLogger(__name__)

#: Results drained per wake-up before the thread looks at its timers and send queue again, taken from the
#: socket ``_RECEIVE_BATCH`` per system call.
_RECEIVE_BURST = 256
_RECEIVE_BATCH = 64
#: Messages shorter than this say little about the rate (their time is mostly one round trip).
_RATE_MIN_PACKETS = 32
#: ``diagnose(what)`` names the workers a stalled packet waits for: (message, ranks).
Diagnose = Callable[[str], tuple[str, tuple[int, ...]]]


@dataclass(eq=False)
class _Message:
    index: int
    op: c.Op
    words: np.ndarray
    future: Future | None
    first: int = 0
    count: int = 0
    raw: bytes = b""
    result: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint32))
    missing: int = 0
    delivered: bool = False
    started: float = 0.0

    def lay_out(self, first: int, who: StreamIdentity) -> None:
        """Place the message at stream position ``first`` under ``who``'s epoch."""
        self.first = first
        self.count = packet_count(self.words.size)
        self.raw = build_packets(self.words, self.op, first, who).tobytes()
        self.result = np.zeros(self.count * c.LANES, np.uint32)
        self.missing = self.count

    @property
    def end(self) -> int:
        return self.first + self.count

    def packet(self, position: int) -> memoryview:
        at = (position - self.first) * PACKET_BYTES
        return memoryview(self.raw)[at : at + PACKET_BYTES]


@dataclass
class StreamStats:
    packets_sent: int = 0
    retransmissions: int = 0
    results: int = 0
    duplicate_results: int = 0
    stale_results: int = 0
    partial_results: int = 0
    foreign_packets: int = 0
    epoch_changes: int = 0


class PacketStream:
    """The I/O thread of one worker. ``submit`` and ``change_epoch`` may be called from any thread."""

    def __init__(self, channel: Channel, who: StreamIdentity, world_size: int, *, timeout_s: float = 30.0,
                 diagnose: Diagnose | None = None) -> None:
        self.channel = channel
        self.who = who
        self.world_size = world_size
        self.full_mask = (1 << world_size) - 1
        self.timeout_s = timeout_s
        self.diagnose = diagnose or (lambda what: (what, ()))
        self.stats = StreamStats()
        self.rtt = RoundTrip()
        self.bytes_per_s = 0.0  # goodput of recent messages, for mode auto
        self.window = Window(who.slot_count)
        self._lock = threading.Lock()
        self._inbox: deque[_Message] = deque()
        self._epoch_request: int | None = None
        self._failure: AggregationError | None = None
        self._submitted = 0
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._closed = threading.Event()
        # I/O thread state
        self._active: list[_Message] = []  # laid out, by first position
        self._log: deque[_Message] = deque()  # finished, kept for replays after an epoch change
        self._parked: list[_Message] = []  # waiting for the resync's answer
        self._syncing: _Message | None = None
        self._next_free = 0  # first position not given to a message
        self._send_next = 0  # first position never sent
        self._low = 0  # first position without its result
        self._inflight: dict[int, list[float]] = {}  # position -> [deadline, retries, first sent]
        self._received = ReceiveBatch(_RECEIVE_BATCH, PACKET_BYTES + 1)  # + 1: a longer one is never whole
        self._thread = threading.Thread(target=self._run, name=f"lhc-stream-{who.rank}", daemon=True)
        self._thread.start()

    # --- any thread ------------------------------------------------------------------------------
    def submit(self, op: c.Op, words: np.ndarray) -> Future:
        """Aggregate ``words`` (int32) with ``op``; the future holds the aggregated int32 words."""
        future: Future = Future()
        with self._lock:
            if self._failure is not None:
                future.set_exception(self._failure)
                return future
            if self._closed.is_set():
                future.set_exception(AggregationError("the stream is closed"))
                return future
            # A copy: a replay after an epoch change rebuilds packets from these words long after the
            # caller's call returned, when the caller's buffer may hold its next data.
            self._inbox.append(_Message(self._submitted, op, np.array(words, np.int32, copy=True), future))
            self._submitted += 1
        self._wake()
        return future

    def change_epoch(self, epoch: int) -> None:
        """The job's epoch changed: restart the stream under it (idempotent)."""
        with self._lock:
            self._epoch_request = epoch
        self._wake()

    def fail(self, error: AggregationError) -> None:
        """Fail every pending and future message with ``error`` (a job the controller failed)."""
        with self._lock:
            if self._failure is None:
                self._failure = error
        self._wake()

    def close(self) -> None:
        self._closed.set()
        self._wake()
        self._thread.join(timeout=10)
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # already awake, or closing
            self._wake_w.send(b"\0")

    # --- the I/O thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._closed.is_set():
                self._take_requests()
                if self._failure is not None:
                    self._fail_all(self._failure)
                self._send()
                self._wait_for_io()
                self._receive()
                self._check_timers(time.monotonic())
        except Exception as exc:  # a bug must fail the callers, never leave them waiting
            log.exception("packet stream failed")
            self._fail_all(AggregationError(f"the packet stream failed: {exc!r}"))
        finally:
            self._fail_all(AggregationError("the stream was closed with this message pending"))

    def _take_requests(self) -> None:
        with self._lock:
            epoch, self._epoch_request = self._epoch_request, None
        if epoch is not None and epoch != self.who.epoch:
            self._restart(epoch)
        if self._syncing is not None:
            return  # new messages wait until the resync says where the replay starts
        with self._lock:
            admitted = list(self._inbox)
            self._inbox.clear()
        for message in admitted:
            self._lay_out(message)

    def _lay_out(self, message: _Message) -> None:
        message.lay_out(self._next_free, self.who)
        self._next_free = message.end
        self._active.append(message)

    def _wait_for_io(self) -> None:
        deadlines = [entry[0] for entry in self._inflight.values()]
        timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else 0.5
        readable, _, _ = select.select([self.channel, self._wake_r], [], [], timeout)
        if self._wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                while self._wake_r.recv(4096):
                    pass

    def _send(self) -> None:
        """Every packet the window and the shadow-copy rule allow, in order, as one batch."""
        limit = min(self._next_free, self._low + self.who.slot_count)
        now = time.monotonic()
        batch: list[memoryview] = []
        while self._send_next < limit and len(self._inflight) < self.window.packets:
            position = self._send_next
            message = self._message_at(position)
            if position == message.first:
                message.started = now
            batch.append(message.packet(position))
            self._inflight[position] = [now + self.rtt.rto, 0, now]
            self._send_next += 1
        if batch:
            self.channel.send_many(batch)
            self.stats.packets_sent += len(batch)

    def _message_at(self, position: int) -> _Message:
        at = bisect.bisect_right(self._active, position, key=lambda m: m.first) - 1
        return self._active[at]

    def _receive(self) -> None:
        batch = self._received
        for _ in range(_RECEIVE_BURST // batch.capacity):
            taken = self.channel.receive_many(batch)
            for index in range(len(batch)):
                self._check_result(batch.datagram(index), batch.source(index))
            if taken < batch.capacity:
                return

    def _check_result(self, datagram: memoryview, source: tuple[str, int]) -> None:
        """Accept a result that passes the host's checks; count anything else by why it was dropped."""
        header = parse_result(datagram) if source == self.channel.switch else None
        if header is None or header.job_id != self.who.job_id:
            self.stats.foreign_packets += 1
            return
        if header.epoch != self.who.epoch:
            self.stats.stale_results += 1
            return
        position = self._low + ((header.seq - self._low) & 0xFFFFFFFF)
        entry = self._inflight.get(position)
        if entry is None:
            if position < self._send_next:
                self.stats.duplicate_results += 1
            else:
                self.stats.stale_results += 1
            return
        if header.bitmap != self.full_mask:
            self.stats.partial_results += 1  # never a partial sum: wait for the full one
            return
        self._accept(position, entry, datagram)

    def _accept(self, position: int, entry: list[float], datagram: memoryview) -> None:
        del self._inflight[position]
        self.stats.results += 1
        if entry[1] == 0:  # Karn: only packets sent once measure the round trip
            rtt = time.monotonic() - entry[2]
            self.rtt.sample(rtt)
            self.window.on_result(rtt)
        message = self._message_at(position)
        at = (position - message.first) * c.LANES
        message.result[at : at + c.LANES] = result_words(datagram)
        message.missing -= 1
        while self._low < self._send_next and self._low not in self._inflight:
            self._low += 1
        if message.missing == 0:
            self._finish(message)

    def _finish(self, message: _Message) -> None:
        self._active.remove(message)
        words = message.result[: message.words.size].view(np.int32)
        if message is self._syncing:
            self._replay(words)
            return
        elapsed = time.monotonic() - message.started
        if message.count >= _RATE_MIN_PACKETS and elapsed > 0:
            rate = message.count * PACKET_BYTES / elapsed
            self.bytes_per_s = rate if not self.bytes_per_s else 0.75 * self.bytes_per_s + 0.25 * rate
        if not message.delivered and message.future is not None:
            message.delivered = True
            message.future.set_result(words.copy())
        self._log.append(message)
        horizon = self._low - 2 * self.who.slot_count
        while self._log and self._log[0].end <= horizon:
            self._log.popleft()

    def _check_timers(self, now: float) -> None:
        resend: list[memoryview] = []
        for position, entry in self._inflight.items():
            if entry[0] > now:
                continue
            if now - entry[2] > self.timeout_s:
                what = (f"no result for packet {position} (seq {position & 0xFFFFFFFF}, epoch "
                        f"{self.who.epoch}) after {entry[1] + 1} sends in {now - entry[2]:.1f} s")
                message, ranks = self.diagnose(what)
                self._fail_all(AggregationError(message, ranks))
                return
            resend.append(self._message_at(position).packet(position))
            entry[1] += 1
            entry[0] = now + self.rtt.backoff(int(entry[1]))
            self.stats.retransmissions += 1
            self.window.on_timeout(now, self.rtt.srtt or self.rtt.rto)
        if resend:
            self.channel.send_many(resend)

    # --- epoch changes -------------------------------------------------------------------------------
    def _restart(self, epoch: int) -> None:
        """Start over at position 0 under ``epoch`` with the resync packet; park every unfinished message."""
        log.info("rank %d: epoch %d -> %d, resynchronising", self.who.rank, self.who.epoch, epoch)
        self.stats.epoch_changes += 1
        self.who = replace(self.who, epoch=epoch)
        if self._syncing is not None:  # a second change before the first resync finished: start it over
            self._active = [m for m in self._active if m is not self._syncing]
        oldest = min((m.index for m in self._active), default=None)
        self._parked = sorted(self._active + self._parked, key=lambda m: m.index)
        if oldest is None:
            oldest = self._parked[0].index if self._parked else self._submitted_so_far()
        self._active, self._inflight = [], {}
        self._next_free = self._send_next = self._low = 0
        lanes = np.zeros(c.LANES, np.int32)
        lanes[self.who.rank] = oldest + 1
        self._syncing = _Message(-1, c.Op.ADD, lanes, None)
        self._lay_out(self._syncing)

    def _submitted_so_far(self) -> int:
        with self._lock:
            return self._submitted - len(self._inbox)

    def _replay(self, lanes: np.ndarray) -> None:
        """The resync's answer: replay from the oldest message any worker lacks, then carry on."""
        self._syncing = None
        marks = lanes[: self.world_size]
        if (marks <= 0).any():
            raise AggregationError(f"the resynchronisation after an epoch change is incomplete: {marks}")
        oldest = int(marks.min()) - 1
        # The log is in completion order, which may differ from index order; the replay is in index order.
        replay = sorted([m for m in self._log if m.index >= oldest] + self._parked, key=lambda m: m.index)
        expected = range(oldest, oldest + len(replay))
        if [m.index for m in replay] != list(expected):
            raise AggregationError(
                f"cannot replay from message {oldest} after an epoch change: this worker holds "
                f"{[m.index for m in replay]}"
            )
        self._log.clear()
        self._parked = []
        for message in replay:
            self._lay_out(message)

    def _fail_all(self, error: AggregationError) -> None:
        with self._lock:
            if self._failure is None:
                self._failure = error
            pending = list(self._inbox)
            self._inbox.clear()
        for message in self._active + self._parked + pending:
            if message.future is not None and not message.future.done():
                message.future.set_exception(error)
        self._active, self._parked, self._inflight = [], [], {}
