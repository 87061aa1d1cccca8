"""The v1model program ``p4src/v1model/lhc.p4``, packet by packet, in Python.

One ``Pipeline`` is one ``V1Switch(LhcParser, LhcVerifyChecksum, LhcIngress, LhcEgress, LhcComputeChecksum,
LhcDeparser)``. Each method below names the P4 control (or parser state) it mirrors; ``docs/switch.md`` is
the contract both implement. The frame is processed in place in one preallocated receive buffer (``rx``):
ingress and egress rewrite header bytes where the deparser would emit them, so the deparser is the
identity on the buffer and the unparsed rest of the frame follows the headers as in BMv2.

Why this shape: the hot path is one struct unpack of every header field the lhc path reads, dict lookups
for the tables, memoryviews over numpy registers for the per-cell scalars (a memoryview index is a third of
a numpy scalar index), and one numpy ufunc over the ``LANES`` words, whose view into ``rx`` is made once.

The slot registers and the ``@atomic`` block live in ``softswitch.slots``, which ``Pipeline`` inherits.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np

from lhc_ina import constants as c
from lhc_ina.p4info import P4InfoIndex
from lhc_ina.wire import (
    ETH_DST,
    ETH_SRC,
    ETH_TYPE,
    FRAME_END,
    FRAME_IPV4,
    FRAME_LHC,
    FRAME_PAYLOAD,
    FRAME_UDP,
    HEADER_OFFSETS,
    IP_CHECKSUM,
    IP_DST,
    IP_FRAG,
    IP_FRAG_OFFSET_MASK,
    IP_PROTO,
    IP_SRC,
    IP_TOTAL_LEN,
    IP_TTL,
    IPV4_VERSION_IHL,
    UDP_DPORT,
    UDP_LEN,
    UDP_SPORT,
)
from softswitch.pre import MulticastGroups
from softswitch.program import (
    ADMIT_WORKER,
    ROUTE,
    SET_JOB,
    SET_PORT,
    SET_REPLICA_DST,
    SET_UPLINK,
    STATS_COUNTER,
    TABLES,
    check_p4info,
    initial_default,
)
from softswitch.slots import (
    BYTE0,
    FLAGS_MASK,
    FLAGS_SHIFT,
    JOB_ID,
    OP_MASK,
    OP_SHIFT,
    RX_BYTES,
    TYPE_SHIFT,
    U16,
    U32,
    VER_SHIFT,
    SlotRegisters,
)
from softswitch.tables import ExactTable, LpmTable, Table

#: ``emit(port, frame)``: send one frame out of a port. ``frame`` is a view of the receive buffer and is
#: valid only during the call (the next copy or packet overwrites it).
Emit = Callable[[int, memoryview], None]

#: v1model's drop port: ``mark_to_drop`` sets egress_spec to it (BMv2 default for 9-bit ports).
DROP_PORT = 511
__all__ = ["DROP_PORT", "RX_BYTES", "Emit", "Pipeline"]


def _reader(fields: list[tuple[int, str]]) -> struct.Struct:
    """One big-endian struct that reads ``(frame offset, struct code)`` fields, in offset order."""
    fmt, at = "!", 0
    for offset, code in fields:
        if offset < at:
            raise ValueError(f"field at {offset} overlaps the previous one")
        fmt += f"{offset - at}x{code}" if offset > at else code
        at = offset + struct.calcsize("!" + code)
    return struct.Struct(fmt)


#: Every field the lhc path reads, in one unpack: ether_type, IPv4 version+ihl, total_len,
#: flags+frag_offset, protocol, src, dst, UDP src/dst port, length, lhc byte 0, worker_id, job_id, slot,
#: epoch, seq.
_HEADERS = _reader([
    (ETH_TYPE, "H"), (FRAME_IPV4, "B"), (IP_TOTAL_LEN, "H"), (IP_FRAG, "H"), (IP_PROTO, "B"),
    (IP_SRC.start, "I"), (IP_DST.start, "I"), (UDP_SPORT.start, "H"), (UDP_DPORT.start, "H"),
    (UDP_LEN, "H"), (BYTE0, "B"), (FRAME_LHC + HEADER_OFFSETS["worker_id"], "B"), (JOB_ID, "H"),
    (FRAME_LHC + HEADER_OFFSETS["slot"], "H"), (FRAME_LHC + HEADER_OFFSETS["epoch"], "H"),
    (FRAME_LHC + HEADER_OFFSETS["seq"], "I"),
])
_IPV4_WORDS = struct.Struct(f"!{c.IPV4_BYTES // 2}H")
_IP_CHECKSUM_WORD = (IP_CHECKSUM - FRAME_IPV4) // 2
_U16, _U32 = U16, U32

# Plain ints for the hot path: an IntEnum member or a module attribute costs a lookup per use.
_S = c.Stat
_RESULT, _RETX, _UP, _UP_RETX = int(_S.RESULT), int(_S.RETX), int(_S.UP), int(_S.UP_RETX)
_DROP_MALFORMED = int(_S.DROP_MALFORMED)
_DROP_BAD_TYPE, _DROP_BAD_OP = int(_S.DROP_BAD_TYPE), int(_S.DROP_BAD_OP)
_DROP_UNKNOWN_JOB, _DROP_STALE_EPOCH = int(_S.DROP_UNKNOWN_JOB), int(_S.DROP_STALE_EPOCH)
_DROP_SLOT_RANGE, _DROP_BAD_WORKER = int(_S.DROP_SLOT_RANGE), int(_S.DROP_BAD_WORKER)
_DATA, _RESULT_TYPE = int(c.MsgType.DATA), int(c.MsgType.RESULT)
_RESULT_RETX_TYPE = int(c.MsgType.RESULT_RETX)
_OP_OR = int(c.Op.OR)
_PORT_MASK, _PORT_BASE = c.UDP_PORT_MASK, c.UDP_PORT_BASE
_UDP_LENGTH, _IPV4_TOTAL_LENGTH = c.UDP_LENGTH, c.IPV4_TOTAL_LENGTH
_NUM_STATS, _SLOT_COPIES = c.NUM_STATS, c.SLOT_COPIES

# Parser outcome: the deepest header extracted (each level implies the ones before it are valid).
_NONE, _ETHERNET, _IPV4_VALID, _UDP_VALID, _LHC_VALID, _PAYLOAD_VALID = range(6)

class Pipeline(SlotRegisters):
    """Tables, PRE, registers and counters of one switch, and ``process`` to run a frame through them."""

    def __init__(self, p4info: P4InfoIndex) -> None:
        check_p4info(p4info)
        tables: dict[str, Table] = {}
        for name, (fields, kind) in TABLES.items():
            default, const = initial_default(p4info, name)
            size = p4info.table(name).size
            widths = [bits for _, bits in fields]
            tables[name] = (
                LpmTable(name, size, widths[0], default, const)
                if kind == "lpm"
                else ExactTable(name, size, widths, default, const)
            )
        self.tables = tables
        self.jobs: ExactTable = tables["LhcIngress.jobs"]  # type: ignore[assignment]
        self.workers: ExactTable = tables["LhcIngress.workers"]  # type: ignore[assignment]
        self.uplinks: ExactTable = tables["LhcIngress.uplinks"]  # type: ignore[assignment]
        # A worker's key (job, worker id, IPv4 source, UDP source, ingress port) packed as pack_key does.
        self._worker_shifts = tuple(sum(self.workers.widths[i + 1:]) for i in range(len(self.workers.widths)))
        self.ipv4_routes: LpmTable = tables["LhcIngress.ipv4_routes"]  # type: ignore[assignment]
        self.l2_forward: ExactTable = tables["LhcIngress.l2_forward"]  # type: ignore[assignment]
        self.replicas: ExactTable = tables["LhcEgress.replicas"]  # type: ignore[assignment]
        self.pre = MulticastGroups()

        super().__init__(p4info.register("LhcIngress.slot_epoch").size)
        stats = p4info.counter(STATS_COUNTER).size
        self.stats_packets = np.zeros(stats, np.uint64)
        self.stats_bytes = np.zeros(stats, np.uint64)
        self._stat_packets = memoryview(self.stats_packets)
        self._stat_bytes = memoryview(self.stats_bytes)
        self._stat_cells = stats
        #: False until a pipeline config is committed: BMv2 without a program forwards nothing.
        self.configured = False

    def reset(self) -> None:
        """A fresh program: every table, group, register and counter back to its initial state."""
        for table in self.tables.values():
            table.reset()
        self.pre.reset()
        self.reset_registers()
        for array in (self.stats_packets, self.stats_bytes):
            array.fill(0)

    # --- V1Switch ----------------------------------------------------------------------------------
    def process(self, length: int, ingress_port: int, emit: Emit) -> None:
        """One frame, ``rx[:length]``, received on ``ingress_port``: every copy it produces is emitted."""
        if not self.configured:
            return
        level, error = self._parse(length)
        rx = self.rx
        if level >= _UDP_VALID and _U16.unpack_from(rx, UDP_DPORT.start)[0] & _PORT_MASK == _PORT_BASE:
            self._lhc_ingress(length, ingress_port, level, error, emit)
        elif not error:
            self._forward_ingress(length, level, emit)

    # --- LhcParser ---------------------------------------------------------------------------------
    def _parse(self, length: int) -> tuple[int, bool]:
        """LhcParser (p4src/shared/parser.p4): the deepest header extracted and whether the parser hit the
        end of the packet (error.PacketTooShort). Nothing is dropped here; ingress decides."""
        rx = self.rx
        if length < c.ETHERNET_BYTES:
            return _NONE, True
        if _U16.unpack_from(rx, ETH_TYPE)[0] != c.ETHERTYPE_IPV4:  # parse_ethernet: not IPv4 -> accept
            return _ETHERNET, False
        if length < FRAME_IPV4 + 1:  # parse_ipv4_check: lookahead<bit<8>> past the end
            return _ETHERNET, True
        if rx[FRAME_IPV4] != IPV4_VERSION_IHL:  # not version 4 with ihl 5 -> accept
            return _ETHERNET, False
        if length < FRAME_UDP:
            return _ETHERNET, True
        # parse_ipv4: select (frag_offset, protocol); frag_offset is the low 13 bits of the flags word
        if _U16.unpack_from(rx, IP_FRAG)[0] & IP_FRAG_OFFSET_MASK or rx[IP_PROTO] != c.IP_PROTO_UDP:
            return _IPV4_VALID, False
        if length < FRAME_LHC:
            return _IPV4_VALID, True
        if _U16.unpack_from(rx, UDP_DPORT.start)[0] & _PORT_MASK != _PORT_BASE:  # parse_udp: not lhc
            return _UDP_VALID, False
        if length < FRAME_PAYLOAD:  # parse_lhc: extract(hdr.lhc)
            return _UDP_VALID, True
        if length < FRAME_END:  # extract(hdr.payload)
            return _LHC_VALID, True
        return _PAYLOAD_VALID, False

    # --- LhcIngress: lhc packets -------------------------------------------------------------------
    def _lhc_ingress(self, length: int, ingress_port: int, level: int, error: bool, emit: Emit) -> None:
        """LhcIngress.apply, the ``is_lhc`` branch: steps 1-8 of docs/switch.md, then the counter and the
        packet's fate (multicast RESULT, unicast RESULT_RETX, a leaf's partial up, or drop)."""
        rx = self.rx
        job_index = 0
        if error or level != _PAYLOAD_VALID:
            stat = _DROP_MALFORMED
        else:
            (_, _, total_len, _, _, src, _, sport, _, udp_len, byte0, worker_id, job_id, slot, epoch, seq) = (
                _HEADERS.unpack_from(rx)
            )
            flags = (byte0 >> FLAGS_SHIFT) & FLAGS_MASK
            msg_type = byte0 >> TYPE_SHIFT
            uplink = None
            from_parent = False
            well_formed = udp_len == _UDP_LENGTH and total_len == _IPV4_TOTAL_LENGTH and not flags
            if well_formed:
                uplink = self.uplinks.entries.get(job_id) or self.uplinks.default
                if uplink[0] != SET_UPLINK:  # no_uplink: not a leaf of this job
                    uplink = None
                # A result is taken only by a leaf, only from its parent: address, UDP port, switch port.
                from_parent = (
                    uplink is not None and msg_type in (_RESULT_TYPE, _RESULT_RETX_TYPE)
                    and src == uplink[6] and sport == uplink[8] and ingress_port == uplink[1]
                )  # set_uplink(port, worker_id, src_mac, dst_mac, src_addr, dst_addr, src_port, dst_port)
            if not well_formed:
                stat = _DROP_MALFORMED
            elif msg_type != _DATA and not from_parent:
                stat = _DROP_BAD_TYPE
            elif (byte0 >> OP_SHIFT) & OP_MASK > _OP_OR:
                stat = _DROP_BAD_OP
            else:
                job = self.jobs.entries.get(job_id)
                if job is None:  # miss: the default action (unknown_job) runs
                    default = self.jobs.default
                    job_index = default[1] if default[0] == SET_JOB else 0
                    stat = _DROP_UNKNOWN_JOB
                else:
                    _, job_index, slot_base, slot_count, fan_in, mcast_grp, job_epoch = job
                    if epoch != job_epoch:
                        stat = _DROP_STALE_EPOCH
                    elif slot >= slot_count or slot_base + slot >= self.max_slots:
                        stat = _DROP_SLOT_RANGE
                    elif from_parent:
                        cell = (slot_base + slot) * _SLOT_COPIES + ((byte0 >> VER_SHIFT) & 1)
                        stat = self._store_result(cell, epoch, seq, byte0)
                    else:
                        s_job, s_worker, s_src, s_sport, _ = self._worker_shifts
                        worker = self.workers.entries.get(
                            (job_id << s_job) | (worker_id << s_worker) | (src << s_src) | (sport << s_sport)
                            | ingress_port
                        )
                        if worker is None:
                            stat = _DROP_BAD_WORKER
                        else:
                            stat = self._aggregate(
                                (slot_base + slot) * _SLOT_COPIES + ((byte0 >> VER_SHIFT) & 1),
                                epoch,
                                seq,
                                slot_count << 1,
                                worker[1] if worker[0] == ADMIT_WORKER else 0,
                                fan_in,
                                byte0,
                                uplink,
                            )
        index = job_index * _NUM_STATS + stat
        if index < self._stat_cells:  # an index past the counter counts nothing
            self._stat_packets[index] += 1
            self._stat_bytes[index] += length
        if stat == _RESULT:
            self._replicate(mcast_grp, job_id, length, emit)
        elif stat == _RETX:
            self._egress(ingress_port, 0, True, length, emit)
        elif stat in (_UP, _UP_RETX):
            self._egress(uplink[1], 0, True, length, emit)  # type: ignore[index]

    # --- LhcIngress: everything else ---------------------------------------------------------------
    def _forward_ingress(self, length: int, level: int, emit: Emit) -> None:
        """LhcIngress.apply, the non-lhc branches: IPv4 -> ipv4_routes (TTL <= 1 dropped), else
        l2_forward. Defaults drop. No counters."""
        rx = self.rx
        if level >= _IPV4_VALID:
            ttl = rx[IP_TTL]
            if ttl <= 1:
                return
            dst = _U32.unpack_from(rx, IP_DST.start)[0]
            action = self.ipv4_routes.lookup(dst) or self.ipv4_routes.default
            if action[0] != ROUTE:
                return
            _, port, src_mac, dst_mac = action
            rx[ETH_DST] = dst_mac.to_bytes(6, "big")
            rx[ETH_SRC] = src_mac.to_bytes(6, "big")
            rx[IP_TTL] = ttl - 1
        else:
            dst_mac = int.from_bytes(rx[ETH_DST], "big")
            action = self.l2_forward.entries.get(dst_mac) or self.l2_forward.default
            if action[0] != SET_PORT:
                return
            port = action[1]
        self._egress(port, 0, False, length, emit)

    # --- PRE ---------------------------------------------------------------------------------------
    def _replicate(self, mcast_grp: int, job_id: int, length: int, emit: Emit) -> None:
        """simple_switch's replication: one egress pass per replica of ``mcast_grp``. Group 0 means no
        multicast: BMv2 then sends the packet to egress_spec, which nothing set (0), with egress_rid 0."""
        if mcast_grp == 0:
            self._egress(0, 0, True, length, emit)
            return
        # Every copy's egress writes the same fields (or drops), so rewriting the buffer per copy equals
        # giving each copy its own packet.
        for port, rid in self.pre.groups.get(mcast_grp, ()):
            self._egress(port, rid, True, length, emit)

    # --- LhcEgress, LhcComputeChecksum, LhcDeparser ------------------------------------------------
    def _egress(self, port: int, egress_rid: int, is_lhc: bool, length: int, emit: Emit) -> None:
        """LhcEgress (replicas rewrite a RESULT's destination per copy), LhcComputeChecksum (IPv4 header
        checksum), LhcDeparser (the buffer already holds the headers in wire order)."""
        if port == DROP_PORT:
            return
        rx = self.rx
        if is_lhc and rx[BYTE0] >> TYPE_SHIFT == _RESULT_TYPE:
            action = self.replicas.entries.get(_U16.unpack_from(rx, JOB_ID)[0] << 16 | egress_rid)
            if action is None:
                action = self.replicas.default
            if action[0] != SET_REPLICA_DST:
                return
            _, dst_mac, dst_addr, dst_port = action
            rx[ETH_DST] = dst_mac.to_bytes(6, "big")
            _U32.pack_into(rx, IP_DST.start, dst_addr)
            _U16.pack_into(rx, UDP_DPORT.start, dst_port)
        ipv4 = _U16.unpack_from(rx, ETH_TYPE)[0] == c.ETHERTYPE_IPV4 and rx[FRAME_IPV4] == IPV4_VERSION_IHL
        if ipv4 and length >= FRAME_UDP:
            words = _IPV4_WORDS.unpack_from(rx, FRAME_IPV4)
            total = sum(words) - words[_IP_CHECKSUM_WORD]
            total = (total & 0xFFFF) + (total >> 16)
            total = (total & 0xFFFF) + (total >> 16)
            _U16.pack_into(rx, IP_CHECKSUM, ~total & 0xFFFF)
        emit(port, self.rxv[:length])

    # --- helpers for tests and tools ---------------------------------------------------------------
    def inject(self, frame: bytes, ingress_port: int) -> list[tuple[int, bytes]]:
        """Run one frame through the pipeline; the frames it sends, as (port, bytes), in order."""
        if len(frame) > RX_BYTES:
            raise ValueError(f"frame of {len(frame)} bytes exceeds the receive buffer ({RX_BYTES})")
        self.rx[: len(frame)] = frame
        out: list[tuple[int, bytes]] = []
        self.process(len(frame), ingress_port, lambda port, view: out.append((port, bytes(view))))
        return out

    def stats(self, job_index: int) -> dict[str, int]:
        """One job's row of lhc_stats as {Stat name: packets}, zero cells left out."""
        row = self.stats_packets[job_index * _NUM_STATS : (job_index + 1) * _NUM_STATS]
        return {c.Stat(i).name: int(v) for i, v in enumerate(row[: len(c.Stat)]) if v}
