"""One worker's reliable packet stream through the switch, run by one background I/O thread.

Messages (a codec step's words and op) are numbered in submission order, which is the same on every
worker, and laid end to end on the job's stream: packet p goes to slot ``p mod S``, copy ``(p div S) mod
2``, ``seq = p`` (docs/protocol.md). This class owns the messages: their layout, their futures, and the
epoch changes. Everything per packet (the window, timers and loss recovery, the host's checks on
results, reassembly) is the *engine*'s (``engine_core.py``, the Python reference, or ``_engine.c``, the same
state machine in C that also does the socket work: a recvmmsg and a sendmmsg per batch, with the GIL
released). The I/O thread hands the engine a message as a segment and gets whole segments back; the
caller decodes on its own thread, so timers never wait for the codec.

An epoch change (the controller re-admitted the job, e.g. after the switch restarted empty) restarts the
stream at p = 0 under the new epoch with a one-packet *resync*: each worker adds 1 + the number of its
oldest unfinished message into its own lane, so every worker learns the oldest message some worker still
lacks, and all replay from there in the same order. A worker can be at most S packets ahead of another,
so the messages it must replay are still in its log.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from host_agent.errors import AggregationError
from host_agent.transport.channel import Channel
from host_agent.transport.engine_io import make_engine
from host_agent.transport.packets import PACKET_BYTES, StreamIdentity, build_packets, packet_count
from host_agent.transport.window import RoundTrip
from lhc_ina import constants as c

log = logging.getLogger(__name__)

#: Messages shorter than this say little about the rate (their time is mostly one round trip).
_RATE_MIN_PACKETS = 32
#: The longest the I/O thread sleeps when nothing is due (a wake-up or a packet ends it sooner).
_IDLE_WAIT_S = 0.5
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
    result: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint32))
    delivered: bool = False

    def lay_out(self, first: int, who: StreamIdentity) -> bytes:
        """Place the message at stream position ``first`` under ``who``'s epoch: its packets' bytes."""
        self.first = first
        self.count = packet_count(self.words.size)
        self.result = np.zeros(self.count * c.LANES, np.uint32)
        return build_packets(self.words, self.op, first, who).tobytes()

    @property
    def end(self) -> int:
        return self.first + self.count


class PacketStream:
    """The I/O thread of one worker. ``submit`` and ``change_epoch`` may be called from any thread."""

    def __init__(self, channel: Channel, who: StreamIdentity, world_size: int, *, timeout_s: float = 30.0,
                 diagnose: Diagnose | None = None, native: bool | None = None,
                 deliver: Callable[[np.ndarray], object] = np.copy, result_mask: int | None = None) -> None:
        """``result_mask``: the bitmap a result must carry (the join's ``JobInfo.result_mask``); None on one
        switch, where it is every worker's bit."""
        self.channel = channel
        #: What a message's future holds, made from its aggregated words on the I/O thread: a copy by
        #: default; the switch backend's torch tensor, so that the future ``submit`` returns is the one its
        #: caller waits on (no second future to hand the result over: docs/host_agent.md, "One bucket").
        self.deliver = deliver
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.diagnose = diagnose or (lambda what: (what, ()))
        #: The per-packet engine: native where ``_engine`` is built (``native`` None or True), else Python.
        if result_mask is None:
            if world_size > c.MAX_WORKERS:
                raise ValueError(f"{world_size} workers span several switches: give the job's result_mask")
            result_mask = (1 << world_size) - 1
        self.engine = make_engine(who, result_mask, channel, timeout_s, native)
        self.bytes_per_s = 0.0  # goodput of recent messages, for mode auto
        self.epoch_changes = 0
        self._lock = threading.Lock()
        self._inbox: deque[_Message] = deque()
        self._epoch_request: int | None = None
        self._failure: AggregationError | None = None
        self._submitted = 0
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._closed = threading.Event()
        # I/O thread state
        self._active: dict[int, _Message] = {}  # laid out and unfinished, by index
        self._log: deque[_Message] = deque()  # finished, kept for replays after an epoch change
        self._parked: list[_Message] = []  # waiting for the resync's answer
        self._syncing: _Message | None = None
        self._thread = threading.Thread(target=self._run, name=f"lhc-stream-{who.rank}", daemon=True)
        self._thread.start()

    @property
    def who(self) -> StreamIdentity:
        return self.engine.who

    @property
    def rtt(self) -> RoundTrip:  # the engine's (srtt, rto)
        return self.engine.rtt

    def counters(self) -> dict[str, int]:
        """The engine's counts (sends, fast and timer retransmissions, results by fate) and the socket's
        (sent, received, and what the impairment dropped or doubled)."""
        return {**self.engine.stats.as_dict(), "epoch_changes": self.epoch_changes,
                **self.engine.io_counters()}

    # --- any thread ------------------------------------------------------------------------------
    def submit(self, op: c.Op, words: np.ndarray) -> Future:
        """Aggregate ``words`` (int32) with ``op``; the future holds the aggregated int32 words as
        ``deliver`` makes them."""
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
                for ident, started in self.engine.pump(self._wake_r.fileno(), _IDLE_WAIT_S):
                    self._finish(ident, started)
                if self.engine.stalled is not None:
                    self._stalled()
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
        first = self.engine.next_free
        raw = message.lay_out(first, self.who)
        self.engine.add(message.index, first, raw, message.result)
        self._active[message.index] = message

    def _finish(self, index: int, started: float) -> None:
        message = self._active.pop(index)
        words = message.result[: message.words.size].view(np.int32)
        if message is self._syncing:
            self._replay(words)
            return
        elapsed = time.monotonic() - started
        if message.count >= _RATE_MIN_PACKETS and elapsed > 0:
            rate = message.count * PACKET_BYTES / elapsed
            self.bytes_per_s = rate if not self.bytes_per_s else 0.75 * self.bytes_per_s + 0.25 * rate
        if not message.delivered and message.future is not None:
            message.delivered = True
            message.future.set_result(self.deliver(words))  # hand-off 1: the I/O thread -> the agent's
        self._log.append(message)
        horizon = self.engine.low - 2 * self.who.slot_count
        while self._log and self._log[0].end <= horizon:
            self._log.popleft()

    def _stalled(self) -> None:
        stalled = self.engine.stalled
        what = (f"no result for packet {stalled.position} (seq {stalled.position & 0xFFFFFFFF}, epoch "
                f"{self.who.epoch}) after {stalled.sends} sends in {stalled.age_s:.1f} s")
        message, ranks = self.diagnose(what)
        self._fail_all(AggregationError(message, ranks))

    # --- epoch changes -------------------------------------------------------------------------------
    def _restart(self, epoch: int) -> None:
        """Start over at position 0 under ``epoch`` with the resync packet; park every unfinished message."""
        log.info("rank %d: epoch %d -> %d, resynchronising", self.who.rank, self.who.epoch, epoch)
        self.epoch_changes += 1
        if self._syncing is not None:  # a second change before the first resync finished: start it over
            self._active.pop(self._syncing.index, None)
        oldest = min(self._active, default=None)
        self._parked = sorted([*self._active.values(), *self._parked], key=lambda m: m.index)
        if oldest is None:
            oldest = self._parked[0].index if self._parked else self._submitted_so_far()
        self._active = {}
        self.engine.restart(epoch)
        lanes = np.zeros(self.world_size, np.int32)  # one word per job rank (several packets past LANES)
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
        for message in [*self._active.values(), *self._parked, *pending]:
            if message.future is not None and not message.future.done():
                message.future.set_exception(error)
        self._active, self._parked = {}, []
        self.engine.restart(self.who.epoch)
