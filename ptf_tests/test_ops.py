"""ADD and OR: one op per packet for all lanes; ADD is modular int32 (wraps mod 2^32, never saturates),
exactly as BMv2's bit<32> addition does."""

from __future__ import annotations

import random

from lhc_ina import constants as c
from ptf_tests.base import LhcTest, reduce_round

INT32_MAX = 2**31 - 1


class AddAndOr(LhcTest):
    """An ADD round and an OR round on two slots of one job; the result carries the op it was made with."""

    def runTest(self) -> None:
        job = self.add_job(0x200, 3, job_index=4)
        rng = random.Random(1)
        adds = [[rng.randrange(-1000, 1000) for _ in range(c.LANES)] for _ in range(3)]
        ors = [[1 << rng.randrange(32) for _ in range(c.LANES)] for _ in range(3)]
        added = reduce_round(self, job, adds, slot=0, seq=1, op=c.Op.ADD)
        self.assertEqual(added, [sum(lane) & 0xFFFFFFFF for lane in zip(*adds, strict=True)])
        ored = reduce_round(self, job, ors, slot=1, seq=1, op=c.Op.OR, absorbed_before=2)
        self.assertEqual(ored[0], ors[0][0] | ors[1][0] | ors[2][0])
        self.assert_stats({(4, c.Stat.ABSORBED): 4, (4, c.Stat.RESULT): 2})


class AddWraps(LhcTest):
    """Sums that overflow int32 wrap mod 2^32: MAX+1 → MIN, -1+1 → 0, MIN+MIN+MIN → MIN, full-range words."""

    def runTest(self) -> None:
        job = self.add_job(0x201, 3, job_index=5)
        rng = random.Random(2)
        edge = [
            (INT32_MAX, 1, 0),
            (-1, 1, 0),
            (-1, -1, -1),
            (-(2**31), -(2**31), -(2**31)),
            (0xFFFFFFFF, 0xFFFFFFFF, 2),
            (INT32_MAX, INT32_MAX, INT32_MAX),
        ]
        lanes = edge + [tuple(rng.randrange(2**32) for _ in range(3)) for _ in range(c.LANES - len(edge))]
        payloads = [list(column) for column in zip(*lanes, strict=True)]
        result = reduce_round(self, job, payloads, slot=3, seq=9)
        self.assertEqual(result[:4], [0x80000000, 0, 0xFFFFFFFD, 0x80000000])
        self.assertEqual(result[4:6], [0, 0x7FFFFFFD])
        self.assert_stats({(5, c.Stat.ABSORBED): 2, (5, c.Stat.RESULT): 1})


class OrAllBits(LhcTest):
    """OR over disjoint and overlapping bit patterns, up to all ones (no carry between bits or lanes)."""

    def runTest(self) -> None:
        job = self.add_job(0x202, 2, job_index=6)
        a = [0xAAAAAAAA] * (c.LANES // 2) + [0xFFFFFFFF] * (c.LANES // 2)
        b = [0x55555555] * (c.LANES // 2) + [0x80000001] * (c.LANES // 2)
        result = reduce_round(self, job, [a, b], slot=0, seq=3, op=c.Op.OR)
        self.assertEqual(set(result), {0xFFFFFFFF})
        self.assert_stats({(6, c.Stat.ABSORBED): 1, (6, c.Stat.RESULT): 1})


class OpIsPerPacket(LhcTest):
    """Each packet brings its own op: the first writer's payload is stored as is, each later one is
    ADDed or ORed by its own op, and the result carries the finishing packet's op."""

    def runTest(self) -> None:
        job = self.add_job(0x203, 3, job_index=6)
        w0, w1, w2 = job.workers
        self.contribute(job, w0, [1] * c.LANES, slot=2, seq=1, op=c.Op.OR)
        self.wait_stats({(6, c.Stat.ABSORBED): 1})
        self.contribute(job, w1, [2] * c.LANES, slot=2, seq=1, op=c.Op.ADD)  # 1 + 2 = 3
        self.wait_stats({(6, c.Stat.ABSORBED): 2})
        last = self.contribute(job, w2, [4] * c.LANES, slot=2, seq=1, op=c.Op.OR)  # 3 | 4 = 7
        self.expect_result(job, last, [7] * c.LANES)
        self.assert_stats({(6, c.Stat.ABSORBED): 2, (6, c.Stat.RESULT): 1})
