"""An unusable socket stops a worker's engine at once with the error named, on both engines; only a
datagram the kernel refused counts as a drop (lhc_ina/udp_batch.c's rule, and udp.py's twin of it)."""

from __future__ import annotations

import errno
import os
import socket
import threading
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


@pytest.mark.parametrize("native", ENGINES)
def test_a_switch_address_the_socket_may_not_send_to_is_a_drop(stream_parts, native: bool) -> None:
    """EINVAL (a loopback-bound channel sending to 10.9.9.9) concerns the destination, not the socket: the
    engine counts its datagrams as dropped and goes on (issue 39), where it used to raise at once."""
    _, wake = stream_parts
    channel = Channel(("127.0.0.1", 0), ("10.9.9.9", c.UDP_PORT_BASE))
    who = StreamIdentity(job_id=2, rank=0, epoch=1, slot_count=64)
    engine = make_engine(who, 2, channel, timeout_s=5.0, native=native)
    raw = build_packets(np.arange(100 * c.LANES, dtype=np.int32), c.Op.ADD, 0, who).tobytes()
    engine.add(0, 0, raw, np.zeros(100 * c.LANES, np.uint32))
    for _ in range(3):
        engine.pump(wake.fileno(), 0.0)
    counters = engine.io_counters()
    assert counters["sent"] == 0 and counters["dropped_out"] == engine.stats.packets_sent > 0
    channel.close()


def test_the_native_engine_refuses_calls_while_another_thread_pumps(stream_parts) -> None:
    """pump works on the engine's buffers without the GIL: __init__, restart, add, set_switch, step and a
    second pump from another thread are refused with RuntimeError (as _udp.Sender refuses), and all work
    again once the pump returned."""
    if not native_engine_available():
        pytest.skip("_engine extension not built")
    sink, _ = stream_parts
    channel = Channel(("127.0.0.1", 0), sink.getsockname())
    who = StreamIdentity(job_id=2, rank=0, epoch=1, slot_count=64)
    engine = make_engine(who, 2, channel, 5.0, native=True)
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)  # the pump empties it (as the stream's wake-up pipe)
    pumping = threading.Thread(target=engine.pump, args=(wake_r.fileno(), 30.0), daemon=True)  # it sleeps
    pumping.start()
    time.sleep(0.2)
    packet_engine = engine._engine
    calls = {
        "__init__": lambda: packet_engine.__init__(channel.fileno(), 2, 0, 1, 64, 2, 5.0, 0.0, 0.0, 0),
        "restart": lambda: packet_engine.restart(2),
        "add": lambda: packet_engine.add(1, 0, b"", np.zeros(0, np.uint32)),
        "set_switch": lambda: packet_engine.set_switch("127.0.0.1", 9),
        "step": lambda: packet_engine.step(0.0, []),
        "pump": lambda: packet_engine.pump(wake_r.fileno(), 0.0),
    }
    try:
        for call in calls.values():
            with pytest.raises(RuntimeError, match="in use by another thread"):
                call()
        assert pumping.is_alive(), "the pump returned before every call was tried"
    finally:
        wake_w.send(b"x")
        pumping.join(timeout=5)
    packet_engine.restart(2)
    assert engine.pump(wake_r.fileno(), 0.0) == []
    for sock in (wake_r, wake_w):
        sock.close()
    channel.close()


@pytest.mark.parametrize("slot_count", [(1 << 23), (1 << 31), (1 << 32) - 1])
def test_a_window_too_large_for_one_send_is_refused_by_name(slot_count: int) -> None:
    """2 * (slot_count + 1) datagrams must fit one udp_batch.c flush: a larger slot_count is a ValueError
    that names it, not an overflow into a misleading MemoryError."""
    if not native_engine_available():
        pytest.skip("_engine extension not built")
    from host_agent.transport import _engine

    with pytest.raises(ValueError, match=f"slot_count {slot_count} "):
        _engine.PacketEngine(-1, 2, 0, 1, slot_count, 2, 5.0, 0.0, 0.0, 0)
