"""tshark with the generated dissector, and what its JSON must say about one lhc datagram: every field as
``lhc_ina.wire`` parses the bytes, the lanes, the contributor ranks and the expert info, in one function the
dissector tests share."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from lhc_ina import constants as c
from lhc_ina import wire
from lhc_ina.wiresharkgen import DISSECTOR_LUA, HEX, group_bytes

TSHARK = shutil.which("tshark")  # tests that run it are marked ``tshark`` (conftest skips them without it)


def _merge_duplicates(pairs: list[tuple[str, object]]) -> dict[str, list[object]]:
    """tshark's JSON repeats a key for a repeated field: every key maps to the list of its values."""
    out: dict[str, list[object]] = {}
    for key, value in pairs:
        out.setdefault(key, []).append(value)
    return out


def run_tshark(capture: Path, *options: str) -> list[dict]:
    """``tshark -X lua_script:wireshark/lhc.lua -r capture -T json``: each packet's layers."""
    assert TSHARK is not None
    done = subprocess.run([TSHARK, "-X", f"lua_script:{DISSECTOR_LUA}", "-r", str(capture), "-T", "json",
                           *options], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Lua Error" not in done.stdout and "_ws.lua.error" not in done.stdout, done.stdout[:5000]
    assert "Lua" not in done.stderr.replace('Running as user "root"', ""), done.stderr
    packets = json.loads(done.stdout, object_pairs_hook=_merge_duplicates)
    return [packet["_source"][0]["layers"][0] for packet in packets]


def _walk(node: object) -> Iterator[tuple[str, object]]:
    if isinstance(node, dict):
        for key, values in node.items():
            for value in values:
                yield key, value
                yield from _walk(value)


def fields(layer: dict) -> dict[str, list[str]]:
    """Every field of a dissected layer, at any depth, to its values in tree order."""
    out: dict[str, list[str]] = {}
    for key, value in _walk(layer):
        if isinstance(value, str):
            out.setdefault(key, []).append(value)
    return out


def experts(layer: dict) -> list[tuple[str, str]]:
    """The layer's expert infos as (name, message), e.g. ("lhc.expert.retx", "RESULT_RETX: ...")."""
    found = []
    for key, value in _walk(layer):
        if key == "_ws.expert":
            names = [name for name in value if name.startswith("lhc.expert.")]
            assert len(names) == 1, value
            found.append((names[0], value["_ws.expert.message"][0]))
    return found


def _shown(name: str, value: int) -> str:
    return f"0x{value:0{group_bytes(name) * 2}x}" if name in HEX else str(value)


def _malformed(header: wire.LhcHeader, length: int) -> list[str]:
    """Why the dissector must call a datagram with a whole header malformed, in its order."""
    why = [f"reserved flags = {header.flags}, must be 0"] if header.flags else []
    if length != c.HEADER_BYTES + c.PAYLOAD_BYTES:
        why.append(f"payload of {length - c.HEADER_BYTES} bytes: an lhc packet carries {c.LANES} lanes "
                   f"({c.PAYLOAD_BYTES} bytes)")
    return why


def _expected_experts(header: wire.LhcHeader, length: int, workers: int) -> list[tuple[str, str]]:
    """What the dissector must flag, by the rules docs/testing.md states: (expert name, message)."""
    out = []
    if header.msg_type not in set(c.MsgType):
        out.append(("lhc.expert.unknown_type", f"Unknown lhc message type {header.msg_type}"))
    if header.op not in set(c.Op):
        out.append(("lhc.expert.unknown_op", f"Unknown lhc op {header.op}"))
    if header.msg_type == c.MsgType.RESULT_RETX:
        out.append(("lhc.expert.retx", f"RESULT_RETX: the result of seq {header.seq} again, for rank "
                                       f"{header.worker_id}, which sent its DATA twice"))
    if header.msg_type in (c.MsgType.RESULT, c.MsgType.RESULT_RETX):
        ranks = [r for r in range(c.MAX_WORKERS) if header.bitmap >> r & 1]
        if not ranks and not workers:
            out.append(("lhc.expert.missing_ranks", "Result without any rank's bit"))
        else:  # every rank below W, or below the highest bit set when W is not known
            missing = [r for r in range(workers if workers else ranks[-1] + 1) if r not in ranks]
            if missing:
                out.append(("lhc.expert.missing_ranks", "Result without the bit of rank(s) "
                            + ", ".join(map(str, missing)) + (f" (W = {workers})" if workers else "")))
        foreign = [r for r in ranks if workers and r >= workers]
        if foreign:
            out.append(("lhc.expert.foreign_ranks",
                        f"Result with the bit of rank(s) {', '.join(map(str, foreign))}, W = {workers}"))
    out += [("lhc.expert.malformed", f"Malformed lhc packet: {why}") for why in _malformed(header, length)]
    return out


def check_lhc(datagram: bytes, layer: dict, *, workers: int = 0) -> str:
    """Hold tshark's lhc layer to ``lhc_ina.wire``'s parse of ``datagram`` (a UDP payload), field by field;
    ``workers`` is the dissector's W preference. Returns a word for what the datagram is (for coverage)."""
    shown, flagged = fields(layer), experts(layer)
    if len(datagram) < c.HEADER_BYTES:
        with pytest.raises(wire.MalformedPacket):
            wire.LhcHeader.unpack(datagram)
        padded = wire.LhcHeader.unpack(datagram.ljust(c.HEADER_BYTES, b"\0"))
        for name, _ in c.HEADER_FIELDS:  # the fields whose bytes arrived, and no other
            arrived = wire.HEADER_OFFSETS[name] + group_bytes(name) <= len(datagram)
            expected = [_shown(name, getattr(padded, name))] if arrived else None
            assert shown.get(f"lhc.{name}") == expected, name
        why = f"truncated header: {len(datagram)} of {c.HEADER_BYTES} bytes"
        assert shown["lhc.malformed"] == [why]
        assert flagged == [("lhc.expert.malformed", f"Malformed lhc packet: {why}")]
        return "truncated header"
    if len(datagram) == c.HEADER_BYTES + c.PAYLOAD_BYTES:
        header, words = wire.unpack_packet(datagram)
    else:
        with pytest.raises(wire.MalformedPacket):
            wire.unpack_packet(datagram)
        header = wire.LhcHeader.unpack(datagram)
        whole = min((len(datagram) - c.HEADER_BYTES) // c.LANE_BYTES, c.LANES)
        words = np.frombuffer(datagram, ">u4", whole, c.HEADER_BYTES).astype(np.uint32)
    for name, _ in c.HEADER_FIELDS:
        assert shown[f"lhc.{name}"] == [_shown(name, getattr(header, name))], name
    ranks = [r for r in range(c.MAX_WORKERS) if header.bitmap >> r & 1]
    assert shown.get("lhc.bitmap.rank", []) == [str(r) for r in ranks]
    assert shown["lhc.bitmap.ranks"] == [", ".join(map(str, ranks))]
    assert shown["lhc.bitmap.count"] == [str(len(ranks))]
    assert shown["lhc.lanes"] == [str(len(words))]
    if header.op == c.Op.ADD:
        lane_field, lanes = "lhc.lane.add", [str(w) for w in words.astype(np.int32)]
    else:
        lane_field = "lhc.lane.or" if header.op == c.Op.OR else "lhc.lane.word"
        lanes = [f"0x{w:08x}" for w in words]
    assert shown.get(lane_field, []) == lanes
    assert not ({"lhc.lane.add", "lhc.lane.or", "lhc.lane.word"} - {lane_field}) & set(shown)
    assert shown.get("lhc.malformed", []) == _malformed(header, len(datagram))
    assert sorted(flagged) == sorted(_expected_experts(header, len(datagram), workers))
    if header.flags:
        return "reserved flags"
    if len(datagram) != c.HEADER_BYTES + c.PAYLOAD_BYTES:
        return "short payload" if len(datagram) < c.HEADER_BYTES + c.PAYLOAD_BYTES else "long payload"
    if header.msg_type not in set(c.MsgType):
        return "unknown type"
    kind = c.MsgType(header.msg_type).name
    return f"{kind}/{c.Op(header.op).name}" if header.op in set(c.Op) else f"{kind}/unknown op"
