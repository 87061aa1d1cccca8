"""The slot registers of ``p4src/v1model/lhc.p4`` and its ``@atomic`` block, in Python.

Kept apart from ``softswitch.pipeline`` (parser, checks, forwarding, replication, egress) because the slot
logic is the part that grew with two levels (docs/switch.md, "Two levels: leaf and spine"): a leaf's
partial going up, and its parent's result coming down. ``SlotRegisters`` owns the registers and the
receive buffer's payload view; ``Pipeline`` inherits it and calls these methods from its ingress.

Registers are indexed as in the P4 program: ``cell = (slot_base + slot) * SLOT_COPIES + ver`` and a lane
``i`` of ``slot_values`` at ``cell * LANES + i`` (here ``slot_values[cell, i]``).
"""

from __future__ import annotations

import struct

import numpy as np

from lhc_ina import constants as c
from lhc_ina.wire import (
    ETH_DST,
    ETH_SRC,
    FRAME_LHC,
    FRAME_PAYLOAD,
    HEADER_OFFSETS,
    HEADER_SHIFTS,
    IP_DST,
    IP_SRC,
    UDP_CHECKSUM,
    UDP_DPORT,
    UDP_SPORT,
)

#: The receive buffer: the largest UDP datagram behind a synthesized Ethernet/IPv4/UDP header, which also
#: covers any Ethernet frame an AF_PACKET socket delivers.
RX_BYTES = 65536 + 64

# lhc byte 0 packs msg_type, op, ver and flags; positions from constants.HEADER_FIELDS.
BYTE0 = FRAME_LHC + HEADER_OFFSETS["msg_type"]
_WIDTHS = dict(c.HEADER_FIELDS)
TYPE_SHIFT, OP_SHIFT, VER_SHIFT, FLAGS_SHIFT = (HEADER_SHIFTS[f] for f in ("msg_type", "op", "ver", "flags"))
OP_MASK, FLAGS_MASK = (1 << _WIDTHS["op"]) - 1, (1 << _WIDTHS["flags"]) - 1
_BYTE0_KEEP = (1 << TYPE_SHIFT) - 1  # op, ver, flags travel into results; msg_type is rewritten
JOB_ID = FRAME_LHC + HEADER_OFFSETS["job_id"]
_WORKER_ID = FRAME_LHC + HEADER_OFFSETS["worker_id"]
_BITMAP = FRAME_LHC + HEADER_OFFSETS["bitmap"]
assert all(HEADER_OFFSETS[f] == HEADER_OFFSETS["msg_type"] for f in ("op", "ver", "flags"))
U16 = struct.Struct("!H")
U32 = struct.Struct("!I")

_S = c.Stat
_ABSORBED, _RESULT, _RETX = int(_S.ABSORBED), int(_S.RESULT), int(_S.RETX)
_UP, _UP_RETX = int(_S.UP), int(_S.UP_RETX)
_DROP_DUPLICATE, _DROP_STALE_ROUND = int(_S.DROP_DUPLICATE), int(_S.DROP_STALE_ROUND)
_DROP_STALE_RESULT = int(_S.DROP_STALE_RESULT)
_RESULT_TYPE, _RESULT_RETX_TYPE = int(c.MsgType.RESULT), int(c.MsgType.RESULT_RETX)
_OP_ADD = int(c.Op.ADD)


class SlotRegisters:
    """The per-copy registers, the receive buffer, and LhcIngress's ``@atomic`` block over them."""

    def __init__(self, cells: int) -> None:
        self.slot_epoch = np.zeros(cells, np.uint16)
        self.slot_round = np.zeros(cells, np.uint32)
        self.slot_bitmap = np.zeros(cells, np.uint32)
        self.slot_remaining = np.zeros(cells, np.uint8)
        self.slot_values = np.zeros((cells, c.LANES), np.uint32)
        self.max_slots = cells // c.SLOT_COPIES
        # Scalar views: indexing a memoryview returns a Python int, three times faster than numpy.
        self._epoch = memoryview(self.slot_epoch)
        self._round = memoryview(self.slot_round)
        self._bitmap = memoryview(self.slot_bitmap)
        self._remaining = memoryview(self.slot_remaining)
        self._rows = list(self.slot_values)  # one view per cell, made once
        self.rx = bytearray(RX_BYTES)
        self.rxv = memoryview(self.rx)
        self._payload = np.frombuffer(self.rx, ">u4", c.LANES, FRAME_PAYLOAD)

    def reset_registers(self) -> None:
        for array in (self.slot_epoch, self.slot_round, self.slot_bitmap, self.slot_remaining,
                      self.slot_values):
            array.fill(0)

    def _aggregate(self, cell: int, epoch: int, seq: int, step: int, worker_bit: int, fan_in: int,
                   byte0: int, uplink: tuple | None) -> int:
        """LhcIngress's ``@atomic`` block for DATA: lazy reset, round check, duplicate check, first/ADD/OR,
        completion. ``step`` is 2 * slot_count: the distance in seq from a copy's round to its next one.
        ``uplink`` is the job's `set_uplink` call on a leaf (None elsewhere): a leaf's copy with one
        contribution left awaits its parent. Rewrites the packet into a RESULT, RESULT_RETX or the leaf's
        partial when that is the outcome; returns the outcome."""
        bitmaps, remainings, rounds = self._bitmap, self._remaining, self._round
        if self._epoch[cell] != epoch:  # lazy reset of this copy only: the packet starts its first round
            self._epoch[cell] = epoch
            starts = True
        else:
            remaining = remainings[cell]
            round_ = rounds[cell]
            if seq == round_:
                bitmap = bitmaps[cell]
                if not remaining:  # a repeat of the finished round: answer it
                    return self._retransmit(cell, bitmap, byte0)
                if remaining == 1 and uplink is not None:  # awaiting the parent: the partial goes up again
                    self._payload[:] = self._rows[cell]
                    return self._send_up(uplink, bitmap, _UP_RETX)
                if bitmap & worker_bit:
                    return _DROP_DUPLICATE
                starts = False
            elif not remaining and seq == (round_ + step) & 0xFFFFFFFF:
                starts = True
            else:
                return _DROP_STALE_ROUND
        row = self._rows[cell]
        if starts:  # first of a round: the packet's words become the value (and stay the payload)
            np.copyto(row, self._payload)
            bitmap = worker_bit
            remaining = (fan_in - 1) & 0xFF
            rounds[cell] = seq
        else:
            if (byte0 >> OP_SHIFT) & OP_MASK == _OP_ADD:
                np.add(row, self._payload, out=row)  # uint32: wraps mod 2^32
            else:
                np.bitwise_or(row, self._payload, out=row)
            bitmap |= worker_bit
            remaining = (remaining - 1) & 0xFF
            if not remaining or (remaining == 1 and uplink is not None):
                self._payload[:] = row
        bitmaps[cell] = bitmap
        remainings[cell] = remaining
        if not remaining:  # the last contribution: the packet becomes the result
            return self._multicast_result(bitmap, byte0)
        if remaining == 1 and uplink is not None:  # a leaf's last worker: the partial goes up, once
            return self._send_up(uplink, bitmap, _UP)
        return _ABSORBED

    def _store_result(self, cell: int, epoch: int, seq: int, byte0: int) -> int:
        """The ``@atomic`` block for a result from a leaf's parent: stored, and multicast to the leaf's
        workers, only by a copy that awaits exactly this round; nothing is written otherwise."""
        if self._epoch[cell] != epoch or self._round[cell] != seq:
            return _DROP_STALE_RESULT
        remaining = self._remaining[cell]
        if not remaining:
            return _DROP_DUPLICATE
        if remaining != 1:
            return _DROP_STALE_RESULT
        np.copyto(self._rows[cell], self._payload)
        bitmap = U32.unpack_from(self.rx, _BITMAP)[0]
        self._bitmap[cell] = bitmap
        self._remaining[cell] = 0
        return self._multicast_result(bitmap, byte0)

    def _multicast_result(self, bitmap: int, byte0: int) -> int:
        """The packet becomes the RESULT, sourced from the address it was sent to (v1model's
        multicast_result); the caller replicates it to the job's group."""
        rx = self.rx
        rx[BYTE0] = (_RESULT_TYPE << TYPE_SHIFT) | (byte0 & _BYTE0_KEEP)
        U32.pack_into(rx, _BITMAP, bitmap)
        rx[ETH_SRC] = rx[ETH_DST]
        rx[IP_SRC] = rx[IP_DST]
        rx[UDP_SPORT] = rx[UDP_DPORT]
        U16.pack_into(rx, UDP_CHECKSUM, 0)
        return _RESULT

    def _send_up(self, uplink: tuple, bitmap: int, outcome: int) -> int:
        """The packet (its payload already the copy's values) becomes the leaf's partial, DATA to the
        parent (v1model's send_up); the caller sends it out of the uplink's port."""
        _, _, worker_id, src_mac, dst_mac, src_addr, dst_addr, src_port, dst_port = uplink
        rx = self.rx
        rx[_WORKER_ID] = worker_id
        U32.pack_into(rx, _BITMAP, bitmap)
        rx[ETH_SRC] = src_mac.to_bytes(6, "big")
        rx[ETH_DST] = dst_mac.to_bytes(6, "big")
        U32.pack_into(rx, IP_SRC.start, src_addr)
        U32.pack_into(rx, IP_DST.start, dst_addr)
        U16.pack_into(rx, UDP_SPORT.start, src_port)
        U16.pack_into(rx, UDP_DPORT.start, dst_port)
        U16.pack_into(rx, UDP_CHECKSUM, 0)
        return outcome

    def _retransmit(self, cell: int, bitmap: int, byte0: int) -> int:
        """A repeat of a finished round: the stored result goes back to the sender (RESULT_RETX)."""
        rx = self.rx
        self._payload[:] = self._rows[cell]
        rx[BYTE0] = (_RESULT_RETX_TYPE << TYPE_SHIFT) | (byte0 & _BYTE0_KEEP)
        U32.pack_into(rx, _BITMAP, bitmap)
        rx[ETH_DST], rx[ETH_SRC] = rx[ETH_SRC], rx[ETH_DST]
        rx[IP_SRC], rx[IP_DST] = rx[IP_DST], rx[IP_SRC]
        rx[UDP_SPORT], rx[UDP_DPORT] = rx[UDP_DPORT], rx[UDP_SPORT]
        U16.pack_into(rx, UDP_CHECKSUM, 0)
        return _RETX
