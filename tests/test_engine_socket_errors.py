"""An unusable socket stops a worker's engine at once with the error named, on both engines; only a
datagram the kernel refused counts as a drop (lhc_ina/udp_batch.c's rule, and udp.py's twin of it)."""

from __future__ import annotations

import errno
import os
import socket
import time

import numpy as np
import pytest

from host_agent.transport.channel import Channel
from host_agent.transport.engine_io import make_engine, native_engine_available
from host_agent.transport.packets import StreamIdentity, build_packets
from lhc_ina import constants as c

ENGINES = [pytest.param(False, id="python"),
           pytest.param(True, id="native", marks=pytest.mark.skipif(not native_engine_available(),
                                                                     reason="_engine extension not built"))]


@pytest.fixture
def stream_parts():
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    wake_r, wake_w = socket.socketpair()
    yield sink, wake_r
    for sock in (sink, wake_r, wake_w):
        sock.close()


def _engine(native: bool, sink: socket.socket):
    channel = Channel(("127.0.0.1", 0), sink.getsockname())
    who = StreamIdentity(job_id=2, rank=0, epoch=1, slot_count=64)
    engine = make_engine(who, 2, channel, timeout_s=5.0, native=native)
    raw = build_packets(np.arange(100 * c.LANES, dtype=np.int32), c.Op.ADD, 0, who).tobytes()
    engine.add(0, 0, raw, np.zeros(100 * c.LANES, np.uint32))
    return engine, channel


@pytest.mark.parametrize("native", ENGINES)
def test_a_channel_closed_mid_stream_raises_ebadf_at_the_next_pump(stream_parts, native: bool) -> None:
    sink, wake = stream_parts
    engine, channel = _engine(native, sink)
    engine.pump(wake.fileno(), 0.0)
    assert engine.stats.packets_sent > 0
    channel.close()
    started = time.monotonic()
    with pytest.raises(OSError) as raised:
        engine.pump(wake.fileno(), 1.0)
    assert raised.value.errno == errno.EBADF
    assert time.monotonic() - started < 0.5, "it must raise at once, not after a stall"


def test_a_descriptor_closed_behind_the_native_engine_raises_instead_of_spinning(stream_parts) -> None:
    """The descriptor itself closed (not through the channel): poll's POLLNVAL or sendmmsg's EBADF stops the
    native engine, where before it counted every send as a drop and spun until the stall timer."""
    if not native_engine_available():
        pytest.skip("_engine extension not built")
    sink, wake = stream_parts
    engine, channel = _engine(True, sink)
    engine.pump(wake.fileno(), 0.0)
    os.close(channel.sock.detach())
    for _ in range(3):  # and it stays failed: every later pump raises the same
        with pytest.raises(OSError) as raised:
            engine.pump(wake.fileno(), 0.05)
        assert raised.value.errno == errno.EBADF


@pytest.mark.parametrize("native", ENGINES)
def test_a_refused_datagram_is_a_drop_not_an_error(stream_parts, native: bool) -> None:
    """ICMP port unreachable (IP_RECVERR) comes back as an error on a later send, receive or poll: it is a
    lost datagram at most, and the engine goes on resending by its timers."""
    _, wake = stream_parts
    closed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    closed.bind(("127.0.0.1", 0))
    engine, channel = _engine(native, closed)
    closed.close()
    channel.sock.setsockopt(socket.IPPROTO_IP, 11, 1)  # IP_RECVERR
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        engine.pump(wake.fileno(), 0.05)
    assert engine.stats.timer_retransmissions >= 2
    counters = engine.io_counters()
    assert counters["sent"] + counters["dropped_out"] == engine.stats.packets_sent
    channel.close()
