"""The per-packet half of a worker's stream: window, timers, loss recovery, the host's checks, reassembly.

``PacketStream`` (``stream.py``) owns messages: it lays each one out at its stream positions (its packets
built at once by ``packets.build_packets``) and hands the engine a *segment*: the first position, the
packets' bytes and the buffer their results go to. The engine does everything per packet and reports
whole segments done. This file is the reference model, in Python, without I/O (``engine_io.py`` puts a
channel around it); ``engine_core.c`` is the same state machine in C, and ``_engine.c`` with
``engine_io.c`` the socket work around it (one recvmmsg and one sendmmsg per batch, the GIL released);
``tests/test_engine_differential.py`` holds the two to the same bytes out and the same results.

One ``step(now, datagrams)`` takes the results that arrived, then decides what leaves now, in this order:

1. **Results.** A datagram counts only if it passes the host's checks (docs/protocol.md §5): from the
   switch, a RESULT or RESULT_RETX of this job and epoch, for a position still waited for, whose bitmap is
   the job's result mask (every worker's bit on one switch, every leaf's over a fabric: a leaf sends up
   only complete partials). Its payload goes to the segment's buffer at the packet's offset.
2. **Fast retransmit.** Results come back in stream order (every worker sends in order, and the switch
   completes a round when its last packet arrives, so round p completes before round p + 1). Once a
   result for a later position is in (``DUPLICATE_THRESHOLD`` of them) while p's is not, p was lost on
   the way up (from some worker) or down; p is sent again at once, at most once per smoothed round trip
   (which also absorbs reordering on a real network, as RACK's time window does). Every worker sees the
   same gap, so a lost round costs about one round trip, not a timer.
   **The tail** (RACK's rule, by send time): a position still unanswered though a result came back for a
   packet *sent after it* (a retransmission, which the gap cannot order) was lost as well, once a
   smoothed round trip has passed since that result without its own. This is what recovers a burst
   lost whole at the tail of the window (a UDP GSO send dropped at an interface, up to 64 datagrams):
   the timer's probe (below) is answered, and everything sent before the probe follows in one round
   trip instead of one timer each. A peer that was only off the CPU sends its backlog as soon as it
   runs, so its results arrive right behind the probe's and nothing is resent.
3. **Timers**, for what neither can show (the last packets of a burst): RFC 6298 with Karn's rule and
   backoff, floored by the path's own round trip (``window.RoundTrip``). A timeout resends only the
   oldest packet. A packet older than ``timeout_s`` stalls the stream (``stalled``): the caller fails it,
   naming the silent workers.
4. **The tail probe** (RACK-TLP's TLP): after ``PTO_RTTS`` smoothed round trips without progress (no new
   result, no new packet) while packets are in flight, the *newest* unanswered packet goes again, and
   again after twice the wait, up to ``MAX_PROBES`` times. Its result shows every earlier loss by the gap
   at once, so a burst lost at the tail costs about two round trips instead of a timer. When a peer is
   only late, the switch drops the probes as duplicates: a few packets per quiet spell, no storm. Probes
   are counted apart (``tail_probes``); they leave the window alone (no loss was seen).
5. **New packets**, as far as the window and the shadow-copy rule allow (never p + S before p's result).

Each loss also tells the window, which halves only when the delay says the path is congested.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from host_agent.transport.packets import PACKET_BYTES, StreamIdentity, parse_result, result_words
from host_agent.transport.window import MAX_PROBES, RoundTrip, Window
from lhc_ina import constants as c

#: Results for this many later positions, and still none for p: p is lost.
DUPLICATE_THRESHOLD = 1
_LANES = c.LANES


@dataclass
class EngineStats:
    """What the engine counted: sends, both kinds of retransmission, and results by fate."""

    packets_sent: int = 0
    retransmissions: int = 0  # fast + timer + tail probes
    fast_retransmissions: int = 0
    timer_retransmissions: int = 0
    tail_probes: int = 0
    results: int = 0
    duplicate_results: int = 0
    stale_results: int = 0
    partial_results: int = 0
    foreign_packets: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class Segment:
    """A message's packets at stream positions ``first`` .. ``first + count - 1``."""

    ident: int
    first: int
    count: int
    raw: bytes
    result: np.ndarray  # uint32, count * LANES
    missing: int = 0
    started: float = -1.0  # when its first packet left

    def __post_init__(self) -> None:
        self.missing = self.count


@dataclass
class _Flight:
    """One position in flight (the ring holds ``slot_count`` of them, position mod slot_count)."""

    first_sent: float = 0.0
    last_sent: float = 0.0
    deadline: float = 0.0
    retries: int = 0


@dataclass
class Stalled:
    position: int
    sends: int
    age_s: float


@dataclass
class PacketEngine:
    """The reference engine; see the module docstring. Not thread-safe: the stream's I/O thread owns it."""

    who: StreamIdentity
    #: The bitmap of every finished round's result (the join's ``JobInfo.result_mask``).
    result_mask: int
    switch: tuple[str, int]
    timeout_s: float = 30.0
    stats: EngineStats = field(default_factory=EngineStats)

    def __post_init__(self) -> None:
        if not 0 < self.result_mask < 1 << 32:
            raise ValueError(f"result_mask {self.result_mask:#x} must be a nonzero 32-bit mask")
        self.full_mask = self.result_mask
        self.rtt = RoundTrip()
        self.window = Window(self.who.slot_count)
        self.stalled: Stalled | None = None
        self._reset_positions()

    def _reset_positions(self) -> None:
        slots = self.who.slot_count
        self.stalled = None
        self._segments: list[Segment] = []
        self._ring = [_Flight() for _ in range(slots)]
        self._received = [False] * slots  # for positions in [low, send_next): the result is in
        self._next_free = self._send_next = self._low = 0
        self._highest = -1  # highest position with its result in
        self._inflight = 0
        self._rack_sent = float("-inf")  # the latest send among the packets whose result is in ...
        self._rack_answered = float("-inf")  # ... and when that result arrived
        self._progress_at = float("-inf")  # the last new result or new packet
        self._probes = 0  # tail probes since then

    # --- what the stream tells it ----------------------------------------------------------------------
    def add(self, ident: int, first: int, raw: bytes, result: np.ndarray) -> None:
        """A segment at ``first`` (which must be where the previous one ended)."""
        count = len(raw) // PACKET_BYTES
        if first != self._next_free or count * PACKET_BYTES != len(raw) or result.size != count * _LANES:
            raise ValueError(f"segment {ident} at {first} does not continue the stream at {self._next_free}")
        self._segments.append(Segment(ident, first, count, raw, result))
        self._next_free = first + count

    def restart(self, epoch: int) -> None:
        """Everything starts over at position 0 under ``epoch`` (the window and timer stay learned)."""
        self.who = replace(self.who, epoch=epoch)
        self._reset_positions()

    @property
    def next_free(self) -> int:
        """Where the next segment starts."""
        return self._next_free

    @property
    def low(self) -> int:
        """The first position whose result is not in."""
        return self._low

    # --- one step ------------------------------------------------------------------------------------
    def step(self, now: float, datagrams: list[tuple[bytes | memoryview, tuple[str, int]]],
             recover: bool = True) -> tuple[list[bytes], list[tuple[int, float]]]:
        """Take ``datagrams`` (payload, source) and decide what leaves at ``now``: (datagrams to send, in
        order; segments completed, as (ident, started)). ``recover`` False leaves losses (steps 2 and 3)
        for later: the I/O loop sends new packets after each batch it drains, but looks for losses only
        once the socket is empty, so a result still unread is never taken for a loss."""
        completed: list[tuple[int, float]] = []
        for datagram, source in datagrams:
            self._check_result(now, datagram, source, completed)
        out: list[bytes] = []
        if recover:
            self._fast_retransmit(now, out)
            sent = len(out)
            if not self._timers(now, out):
                return out, completed
            if len(out) == sent:
                self._tail_probe(now, out)
        self._send_new(now, out)
        return out, completed

    def next_wakeup(self) -> float | None:
        """When a timer or a fast retransmit next falls due (None: nothing in flight)."""
        wakeup = None
        pause = self.rtt.srtt or self.rtt.rto
        for position in range(self._low, self._send_next):
            slot = position % self.who.slot_count
            if self._received[slot]:
                continue
            flight = self._ring[slot]
            due = flight.deadline
            if position <= self._highest - DUPLICATE_THRESHOLD:
                due = min(due, flight.last_sent + pause)
            elif flight.last_sent < self._rack_sent:
                due = min(due, max(flight.last_sent, self._rack_answered) + pause)
            wakeup = due if wakeup is None else min(wakeup, due)
        if wakeup is not None and self._probes < MAX_PROBES:
            wakeup = min(wakeup, self._progress_at + self.rtt.probe_timeout(self._probes))
        return wakeup

    # --- results -------------------------------------------------------------------------------------
    def _check_result(self, now: float, datagram: bytes | memoryview, source: tuple[str, int],
                      completed: list[tuple[int, float]]) -> None:
        stats = self.stats
        header = parse_result(datagram) if source == self.switch else None
        if header is None or header.job_id != self.who.job_id:
            stats.foreign_packets += 1
            return
        if header.epoch != self.who.epoch:
            stats.stale_results += 1
            return
        position = self._low + ((header.seq - self._low) & 0xFFFFFFFF)
        slot = position % self.who.slot_count
        if position >= self._send_next:
            stats.stale_results += 1
            return
        if self._received[slot]:
            stats.duplicate_results += 1
            return
        if header.bitmap != self.full_mask:
            stats.partial_results += 1  # never a partial sum: wait for the full one
            return
        flight = self._ring[slot]
        stats.results += 1
        if flight.retries == 0:  # Karn: only packets sent once measure the round trip
            rtt = now - flight.first_sent
            self.rtt.sample(rtt)
            self.window.on_result(rtt)

        self._received[slot] = True
        self._inflight -= 1
        self._highest = max(self._highest, position)
        self._progress_at, self._probes = now, 0
        if flight.last_sent > self._rack_sent:
            self._rack_sent, self._rack_answered = flight.last_sent, now
        segment = self._segment_at(position)
        at = (position - segment.first) * _LANES
        segment.result[at : at + _LANES] = result_words(datagram)
        segment.missing -= 1
        if segment.missing == 0:
            completed.append((segment.ident, segment.started))
            self._segments.remove(segment)
        while self._low < self._send_next and self._received[self._low % self.who.slot_count]:
            self._received[self._low % self.who.slot_count] = False
            self._low += 1

    def _segment_at(self, position: int) -> Segment:
        for segment in self._segments:
            if segment.first <= position < segment.first + segment.count:
                return segment
        raise AssertionError(f"no segment holds position {position}")

    # --- sends ---------------------------------------------------------------------------------------
    def _packet(self, position: int) -> bytes:
        segment = self._segment_at(position)
        at = (position - segment.first) * PACKET_BYTES
        return segment.raw[at : at + PACKET_BYTES]

    def _resend(self, now: float, position: int, flight: _Flight, out: list[bytes]) -> None:
        out.append(self._packet(position))
        flight.retries += 1
        flight.last_sent = now
        flight.deadline = now + self.rtt.backoff(flight.retries)
        self.stats.retransmissions += 1
        self.stats.packets_sent += 1
        self.window.on_loss(now, self.rtt.srtt or self.rtt.rto)

    def _fast_retransmit(self, now: float, out: list[bytes]) -> None:
        """Resend every position with ``DUPLICATE_THRESHOLD`` later results in and its own missing, and
        (once a smoothed round trip has passed since the latest-sent packet's result came back) every
        position sent before that packet and still missing; each at most once per smoothed round trip."""
        pause = self.rtt.srtt or self.rtt.rto
        gap_end = self._highest - DUPLICATE_THRESHOLD + 1
        end = self._send_next if now - self._rack_answered >= pause else min(self._send_next, gap_end)
        for position in range(self._low, end):
            slot = position % self.who.slot_count
            flight = self._ring[slot]
            if self._received[slot] or now - flight.last_sent < pause:
                continue
            if position < gap_end or flight.last_sent < self._rack_sent:
                self._resend(now, position, flight, out)
                self.stats.fast_retransmissions += 1

    def _timers(self, now: float, out: list[bytes]) -> bool:
        """Resend the oldest packet that timed out and re-arm the others' timers; False (and ``stalled``
        set) if a packet is past ``timeout_s``. One at a time, as TCP's timeout resends only the first
        segment: when every timer in flight fires at once, the cause is far more often a peer that was off
        the CPU (the switch holds the round for it) than a whole window lost, and the gap in the results
        finds the losses among the rest once answers flow again."""
        resent = False
        for position in range(self._low, self._send_next):
            slot = position % self.who.slot_count
            flight = self._ring[slot]
            if self._received[slot] or flight.deadline > now:
                continue
            if now - flight.first_sent > self.timeout_s:
                self.stalled = Stalled(position, flight.retries + 1, now - flight.first_sent)
                return False
            if resent:
                flight.deadline = now + self.rtt.rto
                continue
            self._resend(now, position, flight, out)
            self.stats.timer_retransmissions += 1
            resent = True
        return True

    def _tail_probe(self, now: float, out: list[bytes]) -> None:
        """After a quiet spell, the newest unanswered packet once more (see the module docstring)."""
        if self._probes >= MAX_PROBES or now < self._progress_at + self.rtt.probe_timeout(self._probes):
            return
        for position in range(self._send_next - 1, self._low - 1, -1):
            slot = position % self.who.slot_count
            if not self._received[slot]:
                flight = self._ring[slot]
                out.append(self._packet(position))
                flight.retries += 1  # Karn: its result no longer measures the round trip
                flight.last_sent = now
                self._probes += 1
                self.stats.tail_probes += 1
                self.stats.retransmissions += 1
                self.stats.packets_sent += 1
                return

    def _send_new(self, now: float, out: list[bytes]) -> None:
        limit = min(self._next_free, self._low + self.who.slot_count)
        while self._send_next < limit and self._inflight < self.window.packets:
            position = self._send_next
            segment = self._segment_at(position)
            if position == segment.first:
                segment.started = now
            out.append(self._packet(position))
            flight = self._ring[position % self.who.slot_count]
            flight.retries = 0
            flight.first_sent = flight.last_sent = now
            flight.deadline = now + self.rtt.rto
            self._inflight += 1
            self._send_next += 1
            self.stats.packets_sent += 1
            self._progress_at, self._probes = now, 0
