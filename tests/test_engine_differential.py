"""The native packet engine (``_engine.c``) against the Python reference (``engine_core.py``), bit for bit.

Both run the same seeded scenario in simulated time: a fake switch answers the packets they send after a
random delay, loses some on the way up or down (one at a time, and whole runs of up to a GSO send's
datagrams, which only the tail rule and the timers recover), doubles some, answers some with
RESULT_RETX, a partial bitmap, another epoch or job, from a foreign address, or cut short; segments
arrive over time and the epoch changes now and then. After every step the two must have sent the same
bytes, completed the same segments, and agree on every counter, the round-trip estimate, the window and
the next timer.
"""

from __future__ import annotations

import heapq
import random
import socket

import numpy as np
import pytest

from host_agent.transport.channel import Channel
from host_agent.transport.engine_core import PacketEngine
from host_agent.transport.engine_io import NativeEngine, native_engine_available
from host_agent.transport.packets import StreamIdentity, build_packets
from lhc_ina import constants as c
from lhc_ina.wire import LhcHeader

pytestmark = pytest.mark.skipif(not native_engine_available(), reason="_engine extension not built")

SWITCH = ("127.0.0.9", 19520)
STEPS = 6000


class _FakeSwitch:
    """Turns the engines' packets into (due time, datagram, source) answers, seeded."""

    def __init__(self, rng: random.Random, world: int) -> None:
        self.rng = rng
        self.full = (1 << world) - 1
        self.pending: list[tuple[float, int, bytes, tuple[str, int]]] = []
        self.order = 0
        self.burst_up = self.burst_down = 0  # datagrams still to lose in the current burst

    def _burst(self, left: int) -> tuple[int, bool]:
        """(what is left of the burst, whether this datagram is in one); 0.2% start a run of 2..64."""
        if left == 0 and self.rng.random() < 0.002:
            left = self.rng.randint(2, c.UDP_GSO_SEGMENTS)
        return max(0, left - 1), left > 0

    def offer(self, now: float, packets: list[bytes]) -> None:
        rng = self.rng
        for packet in packets:
            self.burst_up, lost = self._burst(self.burst_up)
            if lost or rng.random() < 0.08:  # lost on the way up
                continue
            header = LhcHeader.unpack(packet)
            kind = rng.random()
            msg_type = c.MsgType.RESULT_RETX if kind < 0.1 else c.MsgType.RESULT
            bitmap = self.full if rng.random() > 0.03 else self.full >> 1
            epoch = header.epoch if rng.random() > 0.02 else (header.epoch + 1) & 0xFFFF
            job = header.job_id if rng.random() > 0.02 else header.job_id + 1
            payload = (np.frombuffer(packet[c.HEADER_BYTES:], ">u4").astype(np.uint32) * 3).astype(">u4")
            reply = header.replace(msg_type=msg_type, bitmap=bitmap, epoch=epoch, job_id=job).pack()
            reply += payload.tobytes()
            source = SWITCH if rng.random() > 0.02 else ("127.0.0.8", SWITCH[1])
            if rng.random() < 0.02:
                reply = reply[:-4]
            copies = 2 if rng.random() < 0.05 else 1
            for _ in range(copies):
                self.burst_down, lost = self._burst(self.burst_down)
                if lost or rng.random() < 0.05:  # lost on the way down
                    continue
                self.order += 1
                heapq.heappush(self.pending, (now + rng.uniform(5e-5, 3e-3), self.order, reply, source))

    def due(self, now: float) -> list[tuple[bytes, tuple[str, int]]]:
        out = []
        while self.pending and self.pending[0][0] <= now:
            _, _, reply, source = heapq.heappop(self.pending)
            out.append((reply, source))
        return out


def _state(engine) -> tuple:
    rtt = engine.rtt
    stalled = engine.stalled
    return (engine.stats.as_dict(), (rtt.srtt, rtt.rttvar, rtt.rto), engine.window.size,
            engine.window.decreases, engine.next_wakeup(), None if stalled is None else stalled.__dict__,
            engine.low, engine.next_free)


@pytest.mark.parametrize("seed", range(5))
def test_native_and_python_engines_take_the_same_decisions(seed: int) -> None:
    rng = random.Random(seed)
    # world: the bits of the result mask (workers on one switch, or leaves of a fabric job)
    world, slots = rng.choice((2, 3, 8, 32)), rng.choice((4, 16, 64))
    who = StreamIdentity(job_id=7, rank=40, epoch=3, slot_count=slots, worker_id=1)
    switch = _FakeSwitch(rng, world)
    python = PacketEngine(who, switch.full, SWITCH, timeout_s=0.5)
    native = NativeEngine(who, switch.full, None, timeout_s=0.5)
    native.set_switch(SWITCH)
    results: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    idents, epoch, now, completed_total = 0, who.epoch, 1000.0, 0
    for _ in range(STEPS):
        now += rng.choice((0.0, rng.uniform(0, 1e-3), rng.uniform(0, 2e-2)))
        if rng.random() < 0.002 or python.stalled is not None:  # an epoch change: both start over
            epoch = (epoch + 1) & 0xFFFF
            python.restart(epoch), native.restart(epoch)
            who = StreamIdentity(who.job_id, who.rank, epoch, slots)
        if python.next_free - python.low < 4 * slots and rng.random() < 0.1:
            words = rng.randrange(1, 6 * c.LANES)
            raw = build_packets(np.arange(idents, idents + words, dtype=np.int32), c.Op.ADD, python.next_free,
                                who).tobytes()
            count = len(raw) // (c.HEADER_BYTES + 4 * c.LANES)
            pair = (np.zeros(count * c.LANES, np.uint32), np.zeros(count * c.LANES, np.uint32))
            results[idents] = pair
            python.add(idents, python.next_free, raw, pair[0])
            native.add(idents, native.next_free, raw, pair[1])
            idents += 1
        arrived = switch.due(now)
        if rng.random() < 0.01:
            arrived.append((b"\x00" * 7, SWITCH))
        recover = rng.random() < 0.8
        sent_py, done_py = python.step(now, arrived, recover)
        sent_c, done_c = native.step(now, arrived, recover)
        assert [bytes(p) for p in sent_py] == sent_c
        assert done_py == done_c
        assert _state(python) == _state(native)
        completed_total += len(done_py)
        for ident, _ in done_py:
            assert np.array_equal(*results[ident])
        switch.offer(now, sent_c)
    assert completed_total > 50, "the scenario must complete segments, not only lose them"
    assert python.stats.fast_retransmissions > 0 and python.stats.timer_retransmissions > 0


@pytest.mark.parametrize("gso", [True, False], ids=["gso", "per-datagram"])
def test_the_native_engines_sends_arrive_as_the_packets_in_order(gso: bool) -> None:
    """Whether a run of packets leaves as one UDP GSO message or one message each, the switch receives
    the same datagrams in the same order."""
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sink.settimeout(2)
    channel = Channel(("127.0.0.1", 0), sink.getsockname())
    who = StreamIdentity(job_id=2, rank=0, epoch=1, slot_count=256)
    engine = NativeEngine(who, 0b11, channel, timeout_s=5.0, gso=gso)
    raw = build_packets(np.arange(200 * c.LANES, dtype=np.int32), c.Op.ADD, 0, who).tobytes()
    engine.add(0, 0, raw, np.zeros(200 * c.LANES, np.uint32))
    wake_r, wake_w = socket.socketpair()
    try:
        engine.pump(wake_r.fileno(), 0.0)  # the initial window leaves
        sent = engine.stats.packets_sent
        received = [sink.recv(2048) for _ in range(sent)]
    finally:
        for closing in (sink, wake_r, wake_w):
            closing.close()
        channel.close()
    size = len(raw) // 200
    assert sent >= 8 and received == [raw[i * size : (i + 1) * size] for i in range(sent)]
    assert engine.io_counters()["sent"] == sent
