"""Malformed lhc packets are dropped before anything else and counted as DROP_MALFORMED in row 0 (job
index 0: the job is not looked up): truncated (the parser hits the end), too long (more lanes than
LANES), wrong UDP or IPv4 length, reserved flag set. Non-DATA types and unknown ops are dropped as
DROP_BAD_TYPE and DROP_BAD_OP. None of them touches the job's slot: the round that follows is exact."""

from __future__ import annotations

from scapy.layers.inet import IP, UDP

from lhc_ina import constants as c
from ptf_tests import frames
from ptf_tests.base import LhcTest, reduce_round

J = 19


class _Malformed(LhcTest):
    def setUp(self) -> None:
        super().setUp()
        self.job = self.add_job(0x800, 2, job_index=J)
        self.w0 = self.job.workers[0]

    def frame(self, words: list[int] | None = None, *, extra: bytes = b"", **fields: int):
        """A DATA frame of worker 0 for slot 0, admitted in every respect unless ``fields`` say otherwise."""
        header = self.job.header(self.w0, seq=1, **fields)
        return frames.data_frame(self.w0, header, [1000] * c.LANES if words is None else words, extra=extra)

    def check_dropped(self, packets: list, stat: c.Stat) -> None:
        for packet in packets:
            self.send(self.w0.port, packet)
        self.wait_stats({(0, stat): len(packets)})
        self.expect_silence()
        reduce_round(self, self.job, [[1] * c.LANES, [2] * c.LANES], seq=1)
        self.assert_stats({(0, stat): len(packets), (J, c.Stat.ABSORBED): 1, (J, c.Stat.RESULT): 1})


class Truncated(_Malformed):
    """Shorter than header + LANES words: lengths consistent with the short content, or cut mid-packet."""

    def runTest(self) -> None:
        full = bytes(self.frame())
        headers_end = c.ETHERNET_BYTES + c.IPV4_BYTES + c.UDP_BYTES
        self.check_dropped(
            [
                self.frame([1000] * (c.LANES - 1)),  # one lane short, lengths say so
                self.frame([]),  # header only
                full[: headers_end + c.HEADER_BYTES // 2],  # cut inside the lhc header
                full[:-4],  # cut inside the last lane, lengths claim the full packet
            ],
            c.Stat.DROP_MALFORMED,
        )


class TooLong(_Malformed):
    """More lanes than LANES: the UDP and IPv4 lengths are not the fixed ones."""

    def runTest(self) -> None:
        self.check_dropped(
            [self.frame([1000] * (c.LANES + 1)), self.frame([1000] * (2 * c.LANES))], c.Stat.DROP_MALFORMED
        )


class WrongLengths(_Malformed):
    """The full packet, but udp.length or ipv4.total_len is not the fixed value."""

    def runTest(self) -> None:
        packets = []
        for udp_len in (c.UDP_LENGTH - 4, c.UDP_LENGTH + 4):
            packet = self.frame()
            packet[UDP].len = udp_len
            packets.append(packet)
        for ip_len in (c.IPV4_TOTAL_LENGTH - 4, c.IPV4_TOTAL_LENGTH + 4):
            packet = self.frame()
            packet[IP].len = ip_len
            packets.append(packet)
        self.check_dropped(packets, c.Stat.DROP_MALFORMED)


class FlagsSet(_Malformed):
    def runTest(self) -> None:
        self.check_dropped([self.frame(flags=1)], c.Stat.DROP_MALFORMED)


class BadType(_Malformed):
    """Only DATA aggregates: RESULT, RESULT_RETX, CONTROL and unassigned codes are dropped."""

    def runTest(self) -> None:
        types = [c.MsgType.RESULT, c.MsgType.RESULT_RETX, c.MsgType.CONTROL, 0, 15]
        self.check_dropped([self.frame(msg_type=t) for t in types], c.Stat.DROP_BAD_TYPE)


class BadOp(_Malformed):
    def runTest(self) -> None:
        self.check_dropped([self.frame(op=2), self.frame(op=3)], c.Stat.DROP_BAD_OP)
