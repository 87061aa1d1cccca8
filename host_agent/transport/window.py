"""How many packets a worker keeps in flight, and how long it waits before it sends one again.

The switch gives no congestion signal: BMv2 drops what it cannot forward without a word, softswitch does
the same under load. The signals are the host's own round trips. A round trip well above the smallest
seen means a queue is building: the window stops growing and shrinks by one packet per window. A loss
(found by the gap in the results, or by a timer) halves the window, at most once per round trip, only
when the smoothed delay says a queue is building: a loss on a clean path is random loss, and halving for
it would only slow a lossy link down to stop-and-wait. Otherwise the window
grows by one packet per round trip.

The timer follows TCP's estimator (RFC 6298): smoothed RTT plus four deviations, from packets sent once
only (Karn), doubled per retransmission of the same packet. Its floor follows the path (twice the smoothed
round trip, and never below ``MIN_RTO_S``), so a loopback or datacenter path does not wait milliseconds
for a packet it could have resent in microseconds.

``host_agent/transport/_engine.c`` implements the same arithmetic, in the same order, on doubles; the
differential test holds the two to the same decisions.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Bounds of the retransmission timer. Losses do not wait for it (the tail probe goes after 2 round trips),
#: so its floor is set for the peer that is only late: a DDP bucket's ranks reach the hook milliseconds
#: apart, and a result waits at the switch for the last. At 2 ms, `make demo` resent 0.09-0.27% of its lhc
#: packets by timer; at 20 ms, 0.00-0.04%. (A floor from the longest recent round trip instead fed on
#: itself under 10% loss in runs: samples that waited on a recovery raised the timer that slowed the next.)
MIN_RTO_S = 0.02
MAX_RTO_S = 1.0
INITIAL_RTO_S = 0.2
#: The floor in round trips: a packet is not given up on before 8 of its path's smoothed round trips. The
#: tail probe finds losses after 2; the timer is the backstop when the probes go unanswered, and sits far
#: enough out that a peer off the CPU for a while (8 workers on 2 cores) does not fire it (at 4, 0.16% of
#: the packets of a lossless 4M-element, 8-worker `lhc-bench aggregate` auto run went again by timer; at
#: 8, 0.05%).
RTO_FLOOR_RTTS = 8.0


@dataclass
class RoundTrip:
    """Smoothed round trip and its deviation; ``rto`` is the retransmission timeout."""

    srtt: float | None = None
    rttvar: float = 0.0
    rto: float = INITIAL_RTO_S

    def sample(self, rtt: float) -> None:
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        floor = max(MIN_RTO_S, RTO_FLOOR_RTTS * self.srtt)
        self.rto = min(MAX_RTO_S, max(floor, self.srtt + 4 * self.rttvar))

    def backoff(self, retries: int) -> float:
        """The timer of a packet already sent ``retries`` + 1 times."""
        return min(MAX_RTO_S, self.rto * (2**retries))

    def probe_timeout(self, probes: int) -> float:
        """How long after the last progress the next tail probe goes, ``probes`` having gone already."""
        base = max(MIN_PTO_S, PTO_RTTS * self.srtt) if self.srtt is not None else self.rto
        return base * (2**probes)


#: The tail probe (engine_core.py): sent after this many smoothed round trips without progress, never sooner
#: than ``MIN_PTO_S`` (the I/O loop's poll sleeps in whole milliseconds), doubled for a second probe.
PTO_RTTS = 2.0
MIN_PTO_S = 0.001
#: Probes per quiet spell (each after twice the wait of the one before) before only the retransmission
#: timer is left: at 10% loss in runs a probe or its answer is lost one time in five, and with 2 probes
#: the 20 ms timer still ran 2-3 times per call and worker (lhc-bench aggregate 1M, 4 workers, --loss 0.1
#: --loss-burst 64: sketch 5.0x its lossless time); with 6, sketch 2.6x.
MAX_PROBES = 6

#: Packets a new stream may keep in flight before it has measured anything.
INITIAL_WINDOW = 8.0
#: Queueing a worker tolerates at the switch before it stops growing its window: the switch's buffer is
#: shared by every worker of every job, and a long queue only turns into spurious retransmissions.
QUEUE_TARGET_S = 0.005


class Window:
    """AIMD over packets in flight, between 1 and ``limit`` (the job's slot count), with a delay brake:
    the window grows only while round trips stay near the smallest seen (little queue at the switch) and
    shrinks slowly when they do not; a loss halves it only where the delay says the path is congested."""

    def __init__(self, limit: int, initial: float = INITIAL_WINDOW) -> None:
        if limit < 1:
            raise ValueError(f"a window needs at least one slot, not {limit}")
        self.limit = limit
        self.size = float(min(limit, initial))
        self._last_decrease = float("-inf")
        self.decreases = 0
        self.min_rtt = float("inf")

    @property
    def packets(self) -> int:
        return max(1, int(self.size))

    def congested(self, rtt: float) -> bool:
        """Whether ``rtt`` says a queue is building: well above the smallest round trip seen."""
        return rtt > max(2 * self.min_rtt, self.min_rtt + QUEUE_TARGET_S)

    def on_result(self, rtt: float) -> None:
        """A result of a packet sent once, ``rtt`` after it left: one more packet per window's worth of
        results while the queue is short, one fewer while it is long."""
        self.min_rtt = min(self.min_rtt, rtt)
        if self.congested(rtt):
            self.size = max(1.0, self.size - 1.0 / self.size)
        else:
            self.size = min(float(self.limit), self.size + 1.0 / self.size)

    def on_loss(self, now: float, srtt: float) -> None:
        """A packet was lost. Halve, once per round trip, if the smoothed round trip says the path is
        congested; keep the window otherwise. The smoothed value, not the latest sample: under random
        loss single samples include a peer's recovery of its own loss, which is no queue. A packet lost
        again is no sign either: at 10% random loss one resend in five is."""
        if self.congested(srtt) and now - self._last_decrease >= srtt:
            self.size = max(1.0, self.size / 2)
            self._last_decrease = now
            self.decreases += 1
