"""The worker's channel: batched sends and receives on both I/O layers, impairments counted exactly."""

from __future__ import annotations

import select
import socket
import struct

import pytest

from host_agent.transport.channel import Channel, Impairment
from lhc_ina import constants as c
from lhc_ina.udp import MAX_BATCH, PythonIO, ReceiveBatch, batch_io, native_udp_available

LAYERS = [
    pytest.param(True, id="native",
                 marks=pytest.mark.skipif(not native_udp_available(), reason="_udp extension not built")),
    pytest.param(False, id="python"),
]
LOOPBACK = ("127.0.0.1", 0)
IP_RECVERR = 11  # linux/in.h; the socket module does not name it


def _sink() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind(LOOPBACK)
    sock.settimeout(30)
    return sock


def _numbered(count: int, size: int = 272) -> list[bytes]:
    return [struct.pack("!I", i) + bytes(size - 4) for i in range(count)]


def _drain(sock: socket.socket, count: int) -> list[bytes]:
    return [sock.recv(65536) for _ in range(count)]


def _receive_all(channel: Channel, batch: ReceiveBatch, expected: int) -> list[tuple[bytes, tuple]]:
    """Everything the channel delivers until ``expected`` datagrams were taken from its socket."""
    delivered, taken = [], 0
    while taken < expected:
        assert select.select([channel], [], [], 30)[0], f"only {taken} of {expected} datagrams arrived"
        taken += channel.receive_many(batch)
        delivered += [(bytes(batch.datagram(i)), batch.source(i)) for i in range(len(batch))]
    return delivered


@pytest.fixture
def pair():
    """A channel whose switch is a plain socket, and that socket."""
    made: list = []

    def make(native: bool, impairment: Impairment | None = None) -> tuple[Channel, socket.socket]:
        peer = _sink()
        channel = Channel(LOOPBACK, peer.getsockname(), impairment or Impairment(), native=native)
        made.extend([channel, peer])
        return channel, peer

    yield make
    for thing in made:
        thing.close()


@pytest.mark.parametrize("native", LAYERS)
def test_a_batch_leaves_in_order_and_is_counted(pair, native: bool) -> None:
    channel, peer = pair(native)
    datagrams = _numbered(1500)  # more than the kernel takes in one sendmmsg
    channel.send_many(datagrams[:3])
    channel.send_many([memoryview(d) for d in datagrams[3:]])
    assert _drain(peer, 1500) == datagrams
    assert channel.counters.as_dict() == {"sent": 1500, "received": 0, "dropped_out": 0, "dropped_in": 0,
                                          "duplicated_out": 0, "duplicated_in": 0}


@pytest.mark.parametrize("native", LAYERS)
def test_receive_many_fills_slots_in_arrival_order(pair, native: bool) -> None:
    channel, peer = pair(native)
    datagrams = _numbered(150, size=100)
    for datagram in datagrams:
        peer.sendto(datagram, channel.local)
    batch = ReceiveBatch(capacity=64, slot=128)
    delivered = _receive_all(channel, batch, 150)
    assert [d for d, _ in delivered] == datagrams
    assert {source for _, source in delivered} == {peer.getsockname()}
    assert channel.counters.received == 150
    assert channel.receive_many(batch) == 0 and len(batch) == 0  # nothing left: an empty batch, no wait


@pytest.mark.parametrize("native", LAYERS)
def test_a_long_or_foreign_datagram_does_not_hide_the_good_ones(pair, native: bool) -> None:
    channel, peer = pair(native)
    stranger = _sink()
    switch, other = peer.getsockname(), stranger.getsockname()
    try:
        good = _numbered(4, size=100)
        peer.sendto(good[0], channel.local)
        peer.sendto(b"x" * 5000, channel.local)  # longer than a slot: cut, never mistaken for a whole one
        peer.sendto(good[1], channel.local)
        stranger.sendto(good[2], channel.local)  # a foreign source, reported as such
        peer.sendto(b"", channel.local)  # an empty datagram
        peer.sendto(good[3], channel.local)
        batch = ReceiveBatch(capacity=8, slot=101)
        delivered = _receive_all(channel, batch, 6)
    finally:
        stranger.close()
    assert delivered == [(good[0], switch), (b"x" * 101, switch), (good[1], switch), (good[2], other),
                         (b"", switch), (good[3], switch)]


@pytest.mark.parametrize("native", LAYERS)
def test_loss_and_duplication_are_counted_per_datagram_under_batching(pair, native: bool) -> None:
    impairment = Impairment(loss=0.1, duplicate=0.1, seed=7)
    channel, peer = pair(native, impairment)
    attempted = 4000
    datagrams = _numbered(attempted)
    for start in range(0, attempted, 250):
        channel.send_many(datagrams[start : start + 250])
    counters = channel.counters
    assert counters.dropped_out + counters.sent - counters.duplicated_out == attempted
    assert 250 < counters.dropped_out < 550 and 250 < counters.duplicated_out < 550
    arrived = _drain(peer, counters.sent)
    # survivors keep their order; a duplicate follows its original
    numbers = [struct.unpack_from("!I", d)[0] for d in arrived]
    assert numbers == sorted(numbers)
    assert len(numbers) - len(set(numbers)) == counters.duplicated_out

    for datagram in datagrams:
        peer.sendto(datagram, channel.local)
    delivered = _receive_all(channel, ReceiveBatch(capacity=64, slot=300), attempted)
    assert counters.received == attempted
    assert len(delivered) == attempted - counters.dropped_in + counters.duplicated_in
    assert 250 < counters.dropped_in < 550 and 250 < counters.duplicated_in < 550
    numbers = [struct.unpack_from("!I", d)[0] for d, _ in delivered]
    assert numbers == sorted(numbers)


def test_both_layers_draw_the_same_impairments_from_one_seed(pair) -> None:
    if not native_udp_available():
        pytest.skip("_udp extension not built")
    impairment = Impairment(loss=0.2, duplicate=0.2, seed=11)
    counters = []
    for native in (True, False):
        channel, peer = pair(native, impairment)
        channel.send_many(_numbered(500))
        for datagram in _numbered(500):
            peer.sendto(datagram, channel.local)
        _receive_all(channel, ReceiveBatch(), 500)
        counters.append(channel.counters.as_dict())
    assert counters[0] == counters[1]


@pytest.mark.parametrize("native", LAYERS)
def test_a_refused_datagram_is_counted_as_lost_and_the_batch_goes_on(pair, native: bool) -> None:
    """With IP_RECVERR, the "port unreachable" of an earlier datagram refuses the next send: that one is
    lost and counted, the rest of the batch still leaves, in order."""
    channel, peer = pair(native)
    channel.sock.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
    closed = _sink()
    channel.switch = closed.getsockname()
    closed.close()
    channel.send_many([b"to nobody"])
    channel.switch = peer.getsockname()
    datagrams = _numbered(5)
    channel.send_many(datagrams)
    assert (channel.counters.sent, channel.counters.dropped_out) == (1 + 4, 1)
    assert _drain(peer, 4) == datagrams[1:]


def test_the_python_layer_is_the_fallback_contract() -> None:
    """The layer used without the extension: one sendto per datagram, a refused one counted as failed."""
    io = PythonIO()
    sender, peer = _sink(), _sink()
    try:
        sender.setblocking(False)
        assert io.send(sender, _numbered(5), peer.getsockname()) == (5, 0)
        assert _drain(peer, 5) == _numbered(5)
        buffer = bytearray(4 * 300)
        assert io.receive(sender, buffer, 300, 4) == []
    finally:
        sender.close()
        peer.close()


def test_bad_batches_are_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match=r"1\.\.1024 datagrams"):
        ReceiveBatch(capacity=MAX_BATCH + 1)
    with pytest.raises(ValueError, match="bytes"):
        ReceiveBatch(slot=0)
    if native_udp_available():
        from lhc_ina import _udp

        sender = _udp.Sender(c.UDP_GSO_SEGMENTS, c.UDP_GSO_REFUSALS, c.UDP_GSO_BYTES)
        with pytest.raises(ValueError, match="IPv4"):
            sender.send_batch(0, [b"x"], "not-an-address", 1)
        with pytest.raises(ValueError, match="fewer than"):
            _udp.recv_batch(0, bytearray(10), 8, 2)
        with pytest.raises(TypeError):
            sender.send_batch(0, [object()], "127.0.0.1", 1)
        with pytest.raises(ValueError, match="positive"):
            _udp.Sender(0, c.UDP_GSO_REFUSALS, c.UDP_GSO_BYTES)


def test_without_the_extension_the_channel_falls_back_and_says_so_when_asked(monkeypatch) -> None:
    from lhc_ina import udp

    monkeypatch.setattr(udp, "_native", None)
    channel = Channel(LOOPBACK)
    try:
        assert isinstance(channel.io, PythonIO)
    finally:
        channel.close()
    with pytest.raises(RuntimeError, match=r"_udp\.c"):
        Channel(LOOPBACK, native=True)


@pytest.mark.parametrize("native", LAYERS)
def test_send_each_sends_every_datagram_to_its_own_destination_in_order(native: bool) -> None:
    """What softswitch's UDP ports use: a result's copies, one per worker, in one batch."""
    io = batch_io(native)
    sinks = [_sink() for _ in range(3)]
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        datagrams = _numbered(300)
        destinations = [socket.inet_aton("127.0.0.1") + sinks[i % 3].getsockname()[1].to_bytes(2, "big")
                        for i in range(300)]
        assert io.send_each(sender, datagrams, destinations) == (300, 0)
        for index, sink in enumerate(sinks):
            assert _drain(sink, 100) == datagrams[index::3]
        with pytest.raises(ValueError, match="2 datagrams but 1 destinations"):
            io.send_each(sender, datagrams[:2], destinations[:1])
        with pytest.raises(ValueError, match="not 6"):
            io.send_each(sender, datagrams[:1], [b"\x7f\x00\x00\x01"])
    finally:
        sender.close()
        for sink in sinks:
            sink.close()


@pytest.mark.parametrize("native", LAYERS)
def test_a_destination_the_kernel_refuses_loses_only_its_own_datagram(native: bool) -> None:
    """A bad worker address (broadcast, without SO_BROADCAST) must not cost the copies for the others."""
    io = batch_io(native)
    sink = _sink()
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        good = socket.inet_aton("127.0.0.1") + sink.getsockname()[1].to_bytes(2, "big")
        bad = socket.inet_aton("255.255.255.255") + sink.getsockname()[1].to_bytes(2, "big")
        datagrams = _numbered(3)
        assert io.send_each(sender, datagrams, [good, bad, good]) == (2, 1)
        assert _drain(sink, 2) == [datagrams[0], datagrams[2]]
    finally:
        sender.close()
        sink.close()
