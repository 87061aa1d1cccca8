"""How many packets a worker keeps in flight, and how long it waits before it sends one again.

The switch gives no congestion signal: BMv2 drops what it cannot forward without a word, softswitch does
the same under load. The signals are the host's own: a round trip well above the smallest seen means a
queue is building (the window stops growing and shrinks by one packet per window), and a timeout means a
loss, as in TCP (the window halves, at most once per round trip). Otherwise it grows by one packet per
round trip. The
timer follows TCP's estimator (RFC 6298): smoothed RTT plus four deviations, from packets sent once only
(Karn), doubled per retransmission of the same packet.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Bounds of the retransmission timer. The floor keeps a loaded 2-core host from retransmitting what is
#: only queued; the ceiling keeps a lost packet from stalling a bucket for long.
MIN_RTO_S = 0.02
MAX_RTO_S = 1.0
INITIAL_RTO_S = 0.2


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
        self.rto = min(MAX_RTO_S, max(MIN_RTO_S, self.srtt + 4 * self.rttvar))

    def backoff(self, retries: int) -> float:
        """The timer of a packet already sent ``retries`` + 1 times."""
        return min(MAX_RTO_S, self.rto * (2 ** retries))


#: Queueing a worker tolerates at the switch before it stops growing its window: the switch's buffer is
#: shared by every worker of every job, and a long queue only turns into spurious retransmissions.
QUEUE_TARGET_S = 0.005


class Window:
    """AIMD over packets in flight, between 1 and ``limit`` (the job's slot count), with a delay brake:
    the window grows only while round trips stay near the smallest seen (little queue at the switch) and
    shrinks slowly when they do not, so timeouts (losses) stay rare instead of being the only signal."""

    def __init__(self, limit: int, initial: float = 8.0) -> None:
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

    def on_result(self, rtt: float) -> None:
        """A result of a packet sent once, ``rtt`` after it left: one more packet per window's worth of
        results while the queue is short, one fewer while it is long."""
        self.min_rtt = min(self.min_rtt, rtt)
        if rtt <= max(2 * self.min_rtt, self.min_rtt + QUEUE_TARGET_S):
            self.size = min(float(self.limit), self.size + 1.0 / self.size)
        else:
            self.size = max(1.0, self.size - 1.0 / self.size)

    def on_timeout(self, now: float, rtt: float) -> None:
        """A timer fired: halve, once per round trip (losses of one window are one congestion event)."""
        if now - self._last_decrease >= rtt:
            self.size = max(1.0, self.size / 2)
            self._last_decrease = now
            self.decreases += 1
