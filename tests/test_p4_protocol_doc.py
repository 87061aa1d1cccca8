"""docs/protocol.md agrees with lhc_ina.constants: its tables are generated from the constants.

The document holds blocks between ``<!-- generated: NAME -->`` and ``<!-- end generated: NAME -->``; each
must equal what ``render_blocks()`` makes from the constants today. After changing constants.py, rewrite
them with::

    .venv/bin/python tests/test_p4_protocol_doc.py --write

The prose around the blocks names constants, never their values, so it cannot drift.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from lhc_ina import constants as c
from lhc_ina import wire

PROTOCOL_MD = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"

FIELD_MEANING = {
    "msg_type": "`MsgType`: DATA from workers (and leaves); RESULT, RESULT_RETX from the switch; CONTROL "
    "host to host",
    "op": "`Op`: how the slot combines lanes (ADD mod 2^32, or OR)",
    "ver": "which of the slot's two shadow copies",
    "flags": "reserved: 0 (a 1 makes the packet malformed)",
    "worker_id": "sender's rank at the switch it sends to, `< MAX_WORKERS`: its job rank on one switch, its "
    "rank within its leaf, a leaf's index at the spine; its bitmap bit is `1 << worker_id`",
    "job_id": "the job, as admitted by the controller",
    "slot": "job-relative aggregator slot, `< slot_count` of the job",
    "epoch": "the job's generation; unique per admission",
    "seq": "packet number `p` of the job's stream mod 2^32, continuous within an epoch; names the round; "
    "echoed in results",
    "bitmap": "DATA: 0 from a worker, a leaf's partial carries its workers' bits; ignored by the switch; "
    "results: the members whose contributions the result holds (a spine's: its leaves)",
}

MSG_TYPE_MEANING = {
    "DATA": "worker → switch: one contribution to one slot copy; leaf → spine: the leaf's partial",
    "RESULT": "switch → every worker of the job (multicast): the finished aggregate; spine → every leaf",
    "RESULT_RETX": "switch → one worker (unicast): the finished aggregate again, for a repeated DATA; "
    "spine → one leaf",
    "CONTROL": "host ↔ host signalling; never aggregated (dropped as `DROP_BAD_TYPE` on lhc ports)",
}

OP_MEANING = {
    "ADD": "lane-wise two's complement addition mod 2^32: wraps, never saturates",
    "OR": "lane-wise bitwise OR",
}

STAT_MEANING = {
    "ABSORBED": "a new contribution, not the last: combined into the slot copy and dropped",
    "RESULT": "the last contribution: the packet became the result and was multicast",
    "RETX": "a repeat of the copy's finished round (same `seq`): RESULT_RETX unicast to the sender",
    "DROP_DUPLICATE": "a repeat while the copy's round still aggregates: dropped",
    "DROP_MALFORMED": "truncated, wrong UDP or IPv4 length (fewer or more lanes), or `flags != 0`",
    "DROP_BAD_TYPE": "`msg_type` is not DATA, and not a result from the job's parent (a leaf's spine)",
    "DROP_BAD_OP": "`op` is not an `Op`",
    "DROP_UNKNOWN_JOB": "`job_id` not admitted (counted in job row 0)",
    "DROP_STALE_EPOCH": "`epoch` is not the job's current one",
    "DROP_SLOT_RANGE": "`slot >= slot_count`, or past the switch's `MAX_SLOTS`",
    "DROP_BAD_WORKER": "(job, `worker_id`, IPv4 source, UDP source port, ingress port) not admitted: unknown "
    "worker, or a spoofed address or port",
    "DROP_STALE_ROUND": "`seq` is neither the copy's round nor its next one (`round + 2 * slot_count`): "
    "a delayed packet",
    "UP": "a leaf's round completed locally: its partial went up to the spine as one DATA packet",
    "UP_RETX": "a repeat while a leaf's copy awaits the spine's result: the partial went up again",
    "DROP_STALE_RESULT": "a result from the spine for a round the leaf's copy does not await",
}


def _table(head: list[str], rows: list[list[object]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


def _header_block() -> list[str]:
    rows, bit = [], 0
    frame_base = c.ETHERNET_BYTES + c.IPV4_BYTES + c.UDP_BYTES
    for name, width in c.HEADER_FIELDS:
        first, last = bit // 8, (bit + width - 1) // 8
        span = f"{first}" if first == last else f"{first}..{last}"
        frame = f"{frame_base + first}" if first == last else f"{frame_base + first}..{frame_base + last}"
        if width < 8:
            hi, lo = 7 - bit % 8, 7 - (bit + width - 1) % 8
            bits = f"bit {hi}" if hi == lo else f"bits {hi}..{lo}"
            span, frame = f"{span} ({bits})", f"{frame} ({bits})"
        rows.append([f"`{name}`", width, span, frame, FIELD_MEANING[name]])
        bit += width
    return _table(["field", "bits", "datagram byte", "frame byte", "meaning"], rows)


def _frame_block() -> list[str]:
    eth, ip, udp, lhc = c.ETHERNET_BYTES, c.IPV4_BYTES, c.UDP_BYTES, c.HEADER_BYTES
    starts = [0, eth, eth + ip, eth + ip + udp, eth + ip + udp + lhc]
    sizes = [eth, ip, udp, lhc, c.PAYLOAD_BYTES]
    what = [
        f"destination MAC, source MAC, ethertype 0x{c.ETHERTYPE_IPV4:04X} (IPv4)",
        f"version 4, ihl 5 (no options), total length {c.IPV4_TOTAL_LENGTH}, protocol {c.IP_PROTO_UDP},"
        " not a fragment (DF set by hosts), header checksum valid",
        f"source port, destination port in [{c.UDP_PORT_BASE}, {c.UDP_PORT_BASE + c.UDP_PORT_COUNT}),"
        f" length {c.UDP_LENGTH}, checksum (0 allowed; the switch sends 0)",
        "the lhc header below",
        f"`LANES` = {c.LANES} big-endian 32-bit words, lane 0 first",
    ]
    names = ["Ethernet", "IPv4", "UDP", "lhc header", "payload"]
    rows = [[n, f"{s}..{s + z - 1}", z, w] for n, s, z, w in zip(names, starts, sizes, what, strict=True)]
    rows.append(["frame", f"0..{c.FRAME_BYTES - 1}", c.FRAME_BYTES, "without the Ethernet FCS"])
    return _table(["part", "bytes", "size", "content"], rows)


def _constants_block() -> list[str]:
    rows = [
        ["`UDP_PORT_BASE`", c.UDP_PORT_BASE, f"0x{c.UDP_PORT_BASE:04X}: first lhc UDP port"],
        ["`UDP_PORT_COUNT`", c.UDP_PORT_COUNT, f"lhc ports: port & 0x{c.UDP_PORT_MASK:04X} == base"],
        ["`LANES`", c.LANES, "32-bit words per packet"],
        ["`PAYLOAD_BYTES`", c.PAYLOAD_BYTES, "`LANES * 4`"],
        ["`HEADER_BYTES`", c.HEADER_BYTES, "the lhc header"],
        ["`UDP_LENGTH`", c.UDP_LENGTH, "UDP length of every lhc packet"],
        ["`IPV4_TOTAL_LENGTH`", c.IPV4_TOTAL_LENGTH, "IPv4 total length of every lhc packet"],
        ["`FRAME_BYTES`", c.FRAME_BYTES, "Ethernet frame without FCS"],
        ["`MAX_WORKERS`", c.MAX_WORKERS, "members of a job per switch (bits of `bitmap`)"],
        ["`MAX_LEAVES`", c.MAX_LEAVES, "leaves of a two-level job (bits of the spine's `bitmap`)"],
        ["`MAX_JOB_WORKERS`", c.MAX_JOB_WORKERS, "workers per job: `MAX_WORKERS * MAX_LEAVES`"],
        ["`MAX_SLOTS`", c.MAX_SLOTS, "aggregator slots in the switch, shared by all jobs"],
        ["`SLOT_COPIES`", c.SLOT_COPIES, "shadow copies per slot (`ver`)"],
        ["`MAX_JOBS`", c.MAX_JOBS, "counter rows (job indices)"],
        ["`NUM_STATS`", c.NUM_STATS, "counter columns per job"],
    ]
    return _table(["constant", "value", "meaning"], rows)


def _codes_block(enum: type, meaning: dict[str, str]) -> list[str]:
    assert set(meaning) == {m.name for m in enum}, f"{enum.__name__} meanings out of date"
    return _table(["name", "code", "meaning"], [[f"`{m.name}`", m.value, meaning[m.name]] for m in enum])


def render_blocks() -> dict[str, str]:
    blocks = {
        "frame": _frame_block(),
        "header": _header_block(),
        "constants": _constants_block(),
        "msg_type": _codes_block(c.MsgType, MSG_TYPE_MEANING),
        "op": _codes_block(c.Op, OP_MEANING),
        "stats": _codes_block(c.Stat, STAT_MEANING),
    }
    return {name: "\n".join(lines) for name, lines in blocks.items()}


_BLOCK_RE = re.compile(r"<!-- generated: (\w+) -->\n(.*?)\n<!-- end generated: \1 -->", re.S)


def write() -> None:
    text = PROTOCOL_MD.read_text()
    blocks = render_blocks()
    def fill(m: re.Match[str]) -> str:
        name = m.group(1)
        return f"<!-- generated: {name} -->\n{blocks[name]}\n<!-- end generated: {name} -->"

    text = _BLOCK_RE.sub(fill, text)
    PROTOCOL_MD.write_text(text)


def test_generated_blocks_are_current() -> None:
    found = dict(_BLOCK_RE.findall(PROTOCOL_MD.read_text()))
    expected = render_blocks()
    assert set(found) == set(expected), "docs/protocol.md lacks or has extra generated blocks"
    for name, text in expected.items():
        assert found[name] == text, f"block {name} stale: run `python tests/test_p4_protocol_doc.py --write`"


def test_header_offsets_match_the_wire_codec() -> None:
    """The byte offsets in the header table are the codec's: pack a header with one field set at a time."""
    bit = 0
    for name, width in c.HEADER_FIELDS:
        zero = {n: 0 for n, _ in c.HEADER_FIELDS}
        raw = wire.LhcHeader(**{**zero, name: (1 << width) - 1}).pack()
        set_bytes = [i for i, b in enumerate(raw) if b]
        assert set_bytes == list(range(bit // 8, (bit + width - 1) // 8 + 1)), name
        if width < 8:
            assert raw[bit // 8] == ((1 << width) - 1) << (8 - bit % 8 - width), name
        bit += width


def test_prose_names_only_existing_constants() -> None:
    text = _BLOCK_RE.sub("", PROTOCOL_MD.read_text())
    for name in set(re.findall(r"`([A-Z][A-Z0-9_]{3,})`", text)):
        known = (
            hasattr(c, name)
            or name in c.MsgType.__members__
            or name in c.Op.__members__
            or name in c.Stat.__members__
        )
        assert known, f"docs/protocol.md names `{name}`, which lhc_ina.constants does not define"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
        print(f"rewrote the generated blocks of {PROTOCOL_MD}")
    else:
        for block_name, block in render_blocks().items():
            print(f"<!-- generated: {block_name} -->\n{block}\n<!-- end generated: {block_name} -->\n")
