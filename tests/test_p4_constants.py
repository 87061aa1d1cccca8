"""P4 and Python read the same protocol constants: the generated include is current and says what
``lhc_ina.constants`` says."""

from __future__ import annotations

import re

from lhc_ina import constants as c
from lhc_ina import p4gen


def _committed() -> str:
    return p4gen.CONSTANTS_P4.read_text()


def test_committed_constants_p4_is_regenerated_output() -> None:
    assert _committed() == p4gen.render(), "p4src/shared/constants.p4 is stale: run `make p4-constants`"


def test_p4_constants_carry_the_python_values() -> None:
    text = _committed()
    consts = {name: int(value, 0) for name, value in re.findall(r"const bit<\d+> (\w+) = (\w+);", text)}
    defines = {name: int(value) for name, value in re.findall(r"#define (LHC_\w+) (\d+)\n", text)}
    code_lines = re.findall(r"#define (\w+) (\d+)w(\d+)\n", text)
    codes = {name: (int(width), int(value)) for name, width, value in code_lines}
    for name, (width, value) in codes.items():
        assert value < 1 << width, name
    consts.update((name, value) for name, (_, value) in codes.items())
    assert consts["LHC_UDP_PORT_BASE"] == c.UDP_PORT_BASE
    assert consts["LHC_UDP_PORT_MASK"] == c.UDP_PORT_MASK
    assert consts["LHC_UDP_LENGTH"] == c.UDP_LENGTH
    assert consts["LHC_IPV4_TOTAL_LENGTH"] == c.IPV4_TOTAL_LENGTH
    assert {t.name: t.value for t in c.MsgType} == {
        k.removeprefix("LHC_TYPE_"): v for k, v in consts.items() if k.startswith("LHC_TYPE_")
    }
    assert {o.name: o.value for o in c.Op} == {
        k.removeprefix("LHC_OP_"): v for k, v in consts.items() if k.startswith("LHC_OP_")
    }
    assert {s.name: s.value for s in c.Stat} == {
        k.removeprefix("LHC_STAT_"): v for k, v in consts.items() if k.startswith("LHC_STAT_")
    }
    assert defines["LHC_LANES"] == c.LANES
    assert defines["LHC_MAX_WORKERS"] == c.MAX_WORKERS
    assert defines["LHC_SLOT_CELLS"] == c.MAX_SLOTS * c.SLOT_COPIES
    assert defines["LHC_STATS_CELLS"] == c.MAX_JOBS * c.NUM_STATS


def test_p4_header_matches_header_fields() -> None:
    body = re.search(r"header lhc_t \{(.*?)\}", _committed(), re.S)
    assert body is not None
    fields = [(name, int(width)) for width, name in re.findall(r"bit<(\d+)> (\w+);", body.group(1))]
    assert fields == list(c.HEADER_FIELDS)


def test_lane_macros_enumerate_every_lane_once() -> None:
    text = _committed()
    lanes = re.search(r"#define LHC_FOR_EACH_LANE\(M\) (.*)", text).group(1)
    assert [int(i) for i in re.findall(r"M\((\d+)\)", lanes)] == list(range(c.LANES))
    pairs = re.search(r"#define LHC_FOR_EACH_LANE_PAIR\(M\) (.*)", text).group(1)
    flat = [int(i) for pair in re.findall(r"M\((\d+), (\d+)\)", pairs) for i in pair]
    assert flat == list(range(c.LANES))


def test_port_range_is_a_maskable_block() -> None:
    assert c.UDP_PORT_COUNT & (c.UDP_PORT_COUNT - 1) == 0
    assert c.UDP_PORT_BASE & ~c.UDP_PORT_MASK & 0xFFFF == 0
    assert c.HEADER_BITS % 8 == 0 and c.HEADER_BYTES == 16
