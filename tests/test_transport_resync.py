"""The stream's replay after an epoch change, against a fake switch that plays a lagging second worker.

The fake answers each DATA packet of rank 0 with the full result of a two-worker job: rank 0's words plus
the peer's (zero, except in a resync packet, where the peer claims the oldest message it lacks). It can
withhold results (so messages finish out of order) and ignore an epoch (a resync that never completes).
"""

from __future__ import annotations

import time

import numpy as np

from host_agent.transport.channel import Channel
from host_agent.transport.packets import StreamIdentity
from host_agent.transport.stream import PacketStream
from lhc_ina import constants as c
from lhc_ina.wire import unpack_packet
from tests.harness.fake_switch import FakeSwitch


class _LaggingPeerSwitch(FakeSwitch):
    def __init__(self, peer_oldest: int) -> None:
        super().__init__()
        self.peer_oldest = peer_oldest
        self.seen: list[tuple[int, int, np.ndarray]] = []  # (epoch, seq, payload words) of first sends
        self.ignored_epochs: set[int] = set()
        self.hold_until: tuple[set[int], int] | None = None  # withhold these seqs until this one answered
        self._held: list[tuple[bytes, tuple]] = []
        self.start()

    def answer(self, data: bytes, worker: tuple[str, int]) -> None:
        header, words = unpack_packet(data)
        if not any(e == header.epoch and s == header.seq for e, s, _ in self.seen):
            self.seen.append((header.epoch, header.seq, words.copy()))
        if header.epoch in self.ignored_epochs:
            return
        if header.epoch > 1 and header.seq == 0:  # the resync: the peer says what it lacks
            words[1] += self.peer_oldest + 1
        result = header.replace(msg_type=c.MsgType.RESULT, bitmap=0b11).pack()
        result += words.astype(">u4").tobytes()
        if self.hold_until is not None and header.seq in self.hold_until[0]:
            self._held.append((result, worker))
            return
        self.sock.sendto(result, worker)
        if self.hold_until is not None and header.seq == self.hold_until[1]:
            for held, to in self._held:
                self.sock.sendto(held, to)
            self._held, self.hold_until = [], None

    def sent(self, epoch: int) -> dict[int, np.ndarray]:
        return {seq: words for e, seq, words in self.seen if e == epoch}


def _stream(switch: _LaggingPeerSwitch) -> tuple[PacketStream, Channel]:
    channel = Channel(("127.0.0.1", 0), switch.sock.getsockname())
    who = StreamIdentity(job_id=3, rank=0, epoch=1, slot_count=16)
    return PacketStream(channel, who, world_size=2, timeout_s=10.0), channel


def _wait_for(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_replay_sends_the_words_submitted_not_what_the_caller_wrote_since() -> None:
    switch = _LaggingPeerSwitch(peer_oldest=0)
    stream, channel = _stream(switch)
    try:
        words = np.arange(100, dtype=np.int32)
        assert np.array_equal(stream.submit(c.Op.ADD, words).result(timeout=10), words)
        words[:] = 7  # the caller reuses its buffer once the call returned
        stream.change_epoch(2)  # the peer still lacks message 0: it is replayed from the log
        _wait_for(lambda: len(switch.sent(2)) == 3, "the resync and the two packets of the replay")
        replayed = np.concatenate([switch.sent(2)[1], switch.sent(2)[2]])[:100].view(np.int32)
        assert np.array_equal(replayed, np.arange(100, dtype=np.int32))
    finally:
        stream.close()
        channel.close()
        switch.close()


def test_a_second_epoch_change_during_a_resync_still_claims_this_workers_lane() -> None:
    switch = _LaggingPeerSwitch(peer_oldest=1)
    switch.ignored_epochs.add(2)  # the first resync never completes
    stream, channel = _stream(switch)
    try:
        assert stream.submit(c.Op.ADD, np.ones(10, np.int32)).result(timeout=10)[0] == 1
        stream.change_epoch(2)
        _wait_for(lambda: 0 in switch.sent(2), "the first resync packet")
        stream.change_epoch(3)
        later = stream.submit(c.Op.ADD, np.full(10, 5, np.int32))
        assert later.result(timeout=10)[0] == 5
        assert switch.sent(3)[0][0] == 2  # 1 + the oldest message this worker lacks (message 1)
    finally:
        stream.close()
        channel.close()
        switch.close()


def test_a_replay_is_in_message_order_when_messages_finished_out_of_order() -> None:
    switch = _LaggingPeerSwitch(peer_oldest=0)
    switch.hold_until = ({0, 1}, 2)  # message 0 (packets 0, 1) finishes after message 1 (packet 2)
    stream, channel = _stream(switch)
    try:
        first = stream.submit(c.Op.ADD, np.arange(100, dtype=np.int32))
        second = stream.submit(c.Op.ADD, np.full(10, 3, np.int32))
        first.result(timeout=10), second.result(timeout=10)
        stream.change_epoch(2)  # the peer lacks both: replay 0 then 1 from a log that holds [1, 0]
        later = stream.submit(c.Op.ADD, np.full(10, 9, np.int32))
        assert later.result(timeout=10)[0] == 9
        assert sorted(switch.sent(2)) == [0, 1, 2, 3, 4]
    finally:
        stream.close()
        channel.close()
        switch.close()
