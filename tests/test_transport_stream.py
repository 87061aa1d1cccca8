"""The packet stream over a batched channel, against a one-worker fake switch that answers every packet."""

from __future__ import annotations

import numpy as np
import pytest

from host_agent.transport.channel import Channel
from host_agent.transport.packets import StreamIdentity
from host_agent.transport.stream import PacketStream
from lhc_ina import constants as c
from lhc_ina.udp import native_udp_available
from lhc_ina.wire import unpack_packet
from tests.harness.fake_switch import FakeSwitch


class _RecordingChannel(Channel):
    """A channel that remembers how many datagrams each send_many carried."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.batches: list[int] = []

    def send_many(self, datagrams) -> None:
        self.batches.append(len(datagrams))
        super().send_many(datagrams)


class _EchoSwitch(FakeSwitch):
    """Turns each DATA packet of a one-worker job into its RESULT, after a malformed datagram and a result
    of another job, so the stream's receive batches always hold packets it must drop."""

    def __init__(self) -> None:
        super().__init__()
        self.seqs: list[int] = []
        self.start()

    def answer(self, data: bytes, worker: tuple[str, int]) -> None:
        header, _ = unpack_packet(data)
        self.seqs.append(header.seq)
        result = header.replace(msg_type=c.MsgType.RESULT, bitmap=1)
        self.sock.sendto(b"malformed", worker)
        self.sock.sendto(result.replace(job_id=header.job_id + 1).pack() + data[c.HEADER_BYTES:], worker)
        self.sock.sendto(result.pack() + data[c.HEADER_BYTES:], worker)


@pytest.mark.parametrize("native", [
    pytest.param(True, id="native",
                 marks=pytest.mark.skipif(not native_udp_available(), reason="_udp extension not built")),
    pytest.param(False, id="python"),
])
def test_the_stream_sends_windows_in_order_and_keeps_good_results_among_bad_ones(native: bool) -> None:
    switch = _EchoSwitch()
    channel = _RecordingChannel(("127.0.0.1", 0), switch.sock.getsockname(), native=native)
    stream = PacketStream(channel, StreamIdentity(job_id=5, rank=0, epoch=1, slot_count=64), world_size=1)
    try:
        words = np.arange(-3000, 3000, dtype=np.int32)  # 94 packets
        first = stream.submit(c.Op.ADD, words)
        second = stream.submit(c.Op.OR, words[::-1].copy())
        assert np.array_equal(first.result(timeout=60), words)
        assert np.array_equal(second.result(timeout=60), words[::-1])
    finally:
        stream.close()
        channel.close()
        switch.close()
    firsts = list(dict.fromkeys(switch.seqs))  # first sends, retransmissions left out
    assert firsts == list(range(len(firsts)))
    if native:  # the native engine sends with its own sendmmsg, past the channel
        assert not channel.batches and stream.engine.io_counters()["sent"] >= len(firsts)
    else:
        assert max(channel.batches) > 1, "a window's packets leave in one batch"
    assert stream.engine.stats.results == len(firsts)
    # two bad datagrams came before every result and were dropped without hiding it
    assert stream.engine.stats.foreign_packets >= 2 * stream.engine.stats.results


def test_without_the_native_engine_the_stream_runs_the_python_one(monkeypatch) -> None:
    """A machine without a C compiler: the default falls back to the reference engine, and asking for
    the native one by name is a clear error."""
    import host_agent.transport.engine_io as engine_io

    monkeypatch.setattr(engine_io, "_native", None)
    channel = Channel(("127.0.0.1", 0), ("127.0.0.1", 9))
    who = StreamIdentity(job_id=1, rank=0, epoch=1, slot_count=8)
    try:
        assert isinstance(engine_io.make_engine(who, 2, channel, 1.0), engine_io.ChannelEngine)
        with pytest.raises(RuntimeError, match=r"native packet engine .* is not built"):
            engine_io.make_engine(who, 2, channel, 1.0, native=True)
    finally:
        channel.close()
