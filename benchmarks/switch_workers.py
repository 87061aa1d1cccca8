"""The simulated workers of ``lhc-bench switch``'s ``udp`` case: each rank's DATA packets built in one
vectorized pass and sent by UDP GSO from its own socket, and every result copy received (UDP_GRO where
the kernel has it) and checked bit for bit, so that the generator is not what bounds the figure."""

from __future__ import annotations

import contextlib
import errno
import socket
import struct
import sys

import numpy as np

from lhc_ina import constants as c
from lhc_ina.jobs import JobLayout
from lhc_ina.udp import BatchIO
from lhc_ina.wire import HEADER_OFFSETS, HEADER_SHIFTS, PACKET_DTYPE, empty_packets, set_header_fields

#: linux/udp.h: the UDP_SEGMENT and UDP_GRO socket options (not in Python's socket module), and
#: UDP_MAX_SEGMENTS, the most datagrams one GSO send carries.
_UDP_SEGMENT, _UDP_GRO, _GSO_SEGMENTS = 103, 104, 64
_MAX_DATAGRAM = 65536
BYTE0_AT, SEQ_AT = HEADER_OFFSETS["msg_type"], HEADER_OFFSETS["seq"]


class Results:
    """What the W rank sockets received: every copy checked (length, type, payload), seqs kept per rank.

    The sockets ask for UDP_GRO where the kernel has it: a run of results the switch sent to one rank in
    one GSO message then arrives as one buffer of equal-size datagrams with their size (the kernel's
    cmsg), instead of being split into one socket entry each. Each datagram is still checked alone."""

    def __init__(self, workers: int, expected: bytes, capacity: int = 256) -> None:
        self.size = PACKET_DTYPE.itemsize
        self.capacity = capacity  # messages per drain
        self.buffer = bytearray((capacity + 1) * _MAX_DATAGRAM)
        self.view = memoryview(self.buffer)
        self.bytes = np.frombuffer(self.buffer, np.uint8)
        self.expected = np.frombuffer(expected, np.uint8)
        self.counts = [0] * workers
        self.seqs: list[list[np.ndarray]] = [[] for _ in range(workers)]
        self.mismatched = 0

    @staticmethod
    def open(workers: int) -> list[socket.socket]:
        socks = []
        for _ in range(workers):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)  # a window's packets at once
            with contextlib.suppress(OSError):  # a kernel without UDP_GRO: one datagram per message
                sock.setsockopt(socket.SOL_UDP, _UDP_GRO, 1)
            sock.bind(("127.0.0.1", 0))
            sock.setblocking(False)
            socks.append(sock)
        return socks

    def drain(self, rank: int, sock: socket.socket) -> int:
        """Receive what waits on rank ``rank``'s socket; the number of result copies."""
        at = 0
        for _ in range(self.capacity):
            try:
                length, ancillary, flags, _ = sock.recvmsg_into(
                    [self.view[at : at + _MAX_DATAGRAM]], socket.CMSG_SPACE(4))
            except BlockingIOError:
                break
            segment = next((int.from_bytes(data[:4], sys.byteorder) for level, kind, data in ancillary
                            if level == socket.SOL_UDP and kind == _UDP_GRO), length)
            if segment != self.size or length % self.size or flags & socket.MSG_TRUNC:
                self.mismatched += 1  # a datagram of another size: not a result of this job
                continue
            at += length
        n = at // self.size
        if n:
            rows = self.bytes[:at].reshape(n, self.size)
            bad = rows[:, BYTE0_AT] >> HEADER_SHIFTS["msg_type"] != c.MsgType.RESULT
            bad |= (rows[:, c.HEADER_BYTES :] != self.expected).any(axis=1)
            self.mismatched += int(np.count_nonzero(bad))
            self.seqs[rank].append(rows[:, SEQ_AT : SEQ_AT + 4].copy().view(">u4").ravel())
            self.counts[rank] += n
        return n

    def every_round_once_to_every_rank(self, rounds: int) -> bool:
        """Each rank got the result of each round 0..rounds-1 exactly once."""
        return all(np.array_equal(np.sort(np.concatenate(seqs or [np.zeros(0, ">u4")])), np.arange(rounds))
                   for seqs in self.seqs)


def data_packets(job: JobLayout, values: np.ndarray, first: int, rounds: int) -> list[memoryview]:
    """Packets ``first .. first + rounds - 1`` of every rank's stream (docs/protocol.md, section 3), built
    in one vectorized pass: one run of packets per rank, in round order."""
    workers = len(job.workers)
    p = np.tile(np.arange(first, first + rounds, dtype=np.int64), workers)
    ranks = np.repeat(np.arange(workers), rounds)
    packets = empty_packets(rounds * workers)
    set_header_fields(packets, msg_type=c.MsgType.DATA, op=c.Op.ADD,
                      ver=(p // job.slot_count) % c.SLOT_COPIES, worker_id=ranks, job_id=job.job_id,
                      slot=p % job.slot_count, epoch=job.epoch, seq=p & 0xFFFFFFFF)
    packets["payload"] = values[ranks]
    raw = memoryview(packets.tobytes())
    run = rounds * PACKET_DTYPE.itemsize
    return [raw[rank * run : (rank + 1) * run] for rank in range(workers)]


class Sender:
    """A rank's DATA packets out of its socket, as UDP GSO sends (UDP_SEGMENT: one system call and one
    trip down the stack for up to 64 datagrams of one size; the receiver still gets separate datagrams),
    or with sendmmsg where the kernel refuses GSO."""

    def __init__(self, io: BatchIO) -> None:
        self.io = io
        self.gso = True

    def send(self, sock: socket.socket, raw: memoryview, address: tuple[str, int]) -> None:
        size = PACKET_DTYPE.itemsize
        if self.gso:
            option = [(socket.SOL_UDP, _UDP_SEGMENT, struct.pack("=H", size))]
            step = size * _GSO_SEGMENTS
            try:
                for at in range(0, len(raw), step):
                    sock.sendmsg([raw[at : at + step]], option, 0, address)
                return
            except OSError as error:
                if at or error.errno not in (errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP, errno.EIO):
                    raise
                self.gso = False  # a kernel without UDP GSO: one datagram per message
        self.io.send(sock, [raw[i : i + size] for i in range(0, len(raw), size)], address)
