"""A message's words as a run of lhc DATA packets, built all at once, and the host's checks on a result.

The layout is ``lhc_ina.wire``'s (``PACKET_DTYPE``), the numbering ``lhc_ina.wire.stream_position``'s:
packet p of the job's stream goes to slot ``p mod S``, copy ``(p div S) mod 2``, with ``seq = p``. Building
every header of a message in one numpy pass keeps Python off the per-packet path of the sender.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from lhc_ina import constants as c
from lhc_ina.wire import HEADER_OFFSETS, HEADER_SHIFTS, PACKET_DTYPE, empty_packets, set_header_fields

PACKET_BYTES = PACKET_DTYPE.itemsize
_TYPE_SHIFT = HEADER_SHIFTS["msg_type"]
#: What the receive path reads of a result, in one unpack: byte 0 (type, op, ver, flags), job, epoch, seq,
#: bitmap.
_RESULT_FIELDS = struct.Struct("!B1xH2xHII")
assert [HEADER_OFFSETS[f] for f in ("job_id", "epoch", "seq", "bitmap")] == [2, 6, 8, 12]
_RESULT_TYPES = (int(c.MsgType.RESULT), int(c.MsgType.RESULT_RETX))


def packet_count(words: int) -> int:
    """Packets that carry ``words`` words (the last one zero-padded: 0 is neutral for ADD and OR)."""
    return max(1, -(-words // c.LANES))


@dataclass(frozen=True)
class StreamIdentity:
    """Who sends the stream: the fields every DATA packet of this worker carries. ``rank`` is the job rank;
    ``worker_id``, the wire's, is the rank within the worker's switch (its leaf; None: the job rank, as
    on one switch: docs/switch.md, "Ranks per level")."""

    job_id: int
    rank: int
    epoch: int
    slot_count: int
    worker_id: int | None = None

    @property
    def wire_id(self) -> int:
        return self.rank if self.worker_id is None else self.worker_id


def build_packets(words: np.ndarray, op: c.Op, first: int, who: StreamIdentity) -> np.ndarray:
    """The DATA packets of one message: ``words`` (int32 or uint32) from stream position ``first`` on."""
    count = packet_count(words.size)
    packets = empty_packets(count)
    positions = np.arange(first, first + count, dtype=np.int64)
    set_header_fields(
        packets,
        msg_type=int(c.MsgType.DATA),
        op=int(op),
        ver=(positions // who.slot_count) % c.SLOT_COPIES,
        flags=0,
        worker_id=who.wire_id,
        job_id=who.job_id,
        slot=positions % who.slot_count,
        epoch=who.epoch,
        seq=positions & 0xFFFFFFFF,
        bitmap=0,
    )
    payload = np.zeros(count * c.LANES, dtype=np.uint32)
    payload[: words.size] = words.view(np.uint32)
    packets["payload"] = payload.reshape(count, c.LANES)
    return packets


@dataclass(frozen=True)
class ResultHeader:
    """The fields of a result the host checks before it accepts the payload."""

    msg_type: int
    job_id: int
    epoch: int
    seq: int
    bitmap: int


def parse_result(datagram: memoryview) -> ResultHeader | None:
    """The header of a RESULT or RESULT_RETX datagram; None for anything else (wrong size or type)."""
    if len(datagram) != PACKET_BYTES:
        return None
    byte0, job_id, epoch, seq, bitmap = _RESULT_FIELDS.unpack_from(datagram)
    msg_type = byte0 >> _TYPE_SHIFT
    if msg_type not in _RESULT_TYPES:
        return None
    return ResultHeader(msg_type, job_id, epoch, seq, bitmap)


def result_words(datagram: memoryview) -> np.ndarray:
    """The ``LANES`` payload words of a result datagram, as uint32."""
    return np.frombuffer(datagram, dtype=">u4", count=c.LANES, offset=c.HEADER_BYTES)
