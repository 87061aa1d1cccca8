"""How many packets a worker keeps in flight, and how long it waits before it sends one again.

The switch gives no congestion signal: BMv2 drops what it cannot forward without a word, softswitch does
the same under load. A timeout is therefore the signal, as in TCP: the window grows by one packet per
round trip while results come back, and halves (at most once per round trip) when a timer fires. The
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


class Window:
    """AIMD over packets in flight, between 1 and ``limit`` (the job's slot count)."""

    def __init__(self, limit: int, initial: float = 8.0) -> None:
        if limit < 1:
            raise ValueError(f"a window needs at least one slot, not {limit}")
        self.limit = limit
        self.size = float(min(limit, initial))
        self._last_decrease = float("-inf")
        self.decreases = 0

    @property
    def packets(self) -> int:
        return max(1, int(self.size))

    def on_result(self) -> None:
        """A result of a packet sent once: one more packet per window's worth of results."""
        self.size = min(float(self.limit), self.size + 1.0 / self.size)

    def on_timeout(self, now: float, rtt: float) -> None:
        """A timer fired: halve, once per round trip (losses of one window are one congestion event)."""
        if now - self._last_decrease >= rtt:
            self.size = max(1.0, self.size / 2)
            self._last_decrease = now
            self.decreases += 1
