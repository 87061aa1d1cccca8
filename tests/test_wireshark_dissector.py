"""The Wireshark dissector: generated from the protocol's constants and current (a header field changed in
constants.py without regenerating fails), and, under tshark, right about hand-made packets of every kind,
on the lhc ports and (heuristic) off them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lhc_ina import constants as c
from lhc_ina import wiresharkgen
from lhc_ina.wire import HEADER_OFFSETS, LhcHeader, build_frame, pack_packet
from softswitch.capture import INBOUND, OUTBOUND, PcapngWriter
from tests.harness.tshark import check_lhc, experts, fields, run_tshark

REPO = Path(__file__).resolve().parent.parent
RNG = np.random.default_rng(34)


def test_committed_dissector_is_regenerated_output() -> None:
    assert wiresharkgen.DISSECTOR_LUA.read_text() == wiresharkgen.render(), (
        "wireshark/lhc.lua is stale: run `make wireshark-dissector`")


def test_the_lua_carries_the_header_layout_and_codes_of_constants() -> None:
    text = wiresharkgen.DISSECTOR_LUA.read_text()
    rows = re.findall(r'\{ name = "(\w+)", .*?shift = (\d+), width = (\d+)', text)
    assert [(name, int(width)) for name, _, width in rows] == list(c.HEADER_FIELDS)
    for t in c.MsgType:
        assert f'[{t.value}] = "{t.name}"' in text
    for o in c.Op:
        assert f'[{o.value}] = "{o.name}"' in text
    for name in ("HEADER_BYTES", "LANES", "PAYLOAD_BYTES", "UDP_PORT_BASE", "UDP_PORT_COUNT", "MAX_WORKERS"):
        assert f"    {name} = {getattr(c, name)}," in text


def test_a_header_field_changed_without_regenerating_fails_naming_the_command(tmp_path: Path) -> None:
    """A copy of lhc_ina whose epoch is 32 bits wide: `make wireshark-check` (this --check) must fail."""
    skip = shutil.ignore_patterns("*.so", "__pycache__")
    shutil.copytree(REPO / "lhc_ina", tmp_path / "lhc_ina", ignore=skip)
    constants = tmp_path / "lhc_ina" / "constants.py"
    text = constants.read_text()
    assert '("epoch", 16)' in text
    constants.write_text(text.replace('("epoch", 16)', '("epoch", 32)'))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    check = [sys.executable, "-m", "lhc_ina.wiresharkgen", "--check", "--output",
             str(wiresharkgen.DISSECTOR_LUA)]
    done = subprocess.run(check, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 1
    assert "wireshark/lhc.lua is out of date" in done.stderr
    assert "run `make wireshark-dissector`" in done.stderr
    # The unchanged constants pass the same check.
    done = subprocess.run(check, capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr


def test_make_test_runs_the_check() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^test:.*\bwireshark-check\b", makefile, re.M)
    assert "$(PY) -m lhc_ina.wiresharkgen --check" in makefile


def test_a_field_the_logic_reads_cannot_disappear_silently(monkeypatch: pytest.MonkeyPatch) -> None:
    renamed = tuple(("sequence" if name == "seq" else name, width) for name, width in c.HEADER_FIELDS)
    monkeypatch.setattr(c, "HEADER_FIELDS", renamed)
    with pytest.raises(ValueError, match=r"reads header fields \['seq'\] that constants.HEADER_FIELDS no"):
        wiresharkgen.render()


def _frame(datagram: bytes, *, src_port: int = 40001, dst_port: int = c.UDP_PORT_BASE) -> bytes:
    return build_frame(datagram, src_mac="02:00:00:00:00:01", dst_mac="02:00:00:00:00:fe", src_ip="10.0.0.1",
                       dst_ip="10.0.0.254", src_port=src_port, dst_port=dst_port)


def _packet(words: np.ndarray | None = None, **header: int) -> bytes:
    fields = {"job_id": 7, "worker_id": 2, "slot": 5, "epoch": 9, "seq": 70001, **header}
    if words is None:
        words = RNG.integers(-(2**31), 2**31, c.LANES)
    return pack_packet(LhcHeader(**fields), words)


#: One datagram of every kind the dissector tells apart, and the word check_lhc gives it.
CASES = [
    ("DATA/ADD", _packet(msg_type=c.MsgType.DATA)),
    ("DATA/OR", _packet(msg_type=c.MsgType.DATA, op=c.Op.OR)),
    ("RESULT/ADD", _packet(msg_type=c.MsgType.RESULT, bitmap=0b1111)),
    ("RESULT/OR", _packet(msg_type=c.MsgType.RESULT, op=c.Op.OR, bitmap=0b1011)),  # rank 2 missing
    ("RESULT/ADD", _packet(msg_type=c.MsgType.RESULT, bitmap=0)),  # nobody's bit
    ("RESULT_RETX/ADD", _packet(msg_type=c.MsgType.RESULT_RETX, bitmap=0b111, worker_id=1)),
    ("CONTROL/ADD", _packet(msg_type=c.MsgType.CONTROL)),
    ("DATA/unknown op", _packet(msg_type=c.MsgType.DATA, op=3)),
    ("unknown type", _packet(msg_type=0)),
    ("unknown type", _packet(msg_type=15, bitmap=0xFFFFFFFF)),
    ("reserved flags", _packet(flags=1)),
    ("truncated header", _packet()[:1]),
    ("truncated header", _packet()[:9]),
    ("truncated header", _packet()[: c.HEADER_BYTES - 1]),
    ("short payload", _packet()[: c.HEADER_BYTES]),
    ("short payload", _packet()[: c.HEADER_BYTES + 4 * 10 + 3]),
    ("long payload", _packet() + bytes(5)),
]


@pytest.mark.tshark
@pytest.mark.parametrize("workers", [0, 3])
def test_every_kind_of_datagram_is_dissected_as_wire_parses_it(tmp_path: Path, workers: int) -> None:
    """On the lhc ports, both directions; ``workers`` is the W preference (0: not known)."""
    capture = tmp_path / "cases.pcapng"
    writer = PcapngWriter(capture, [(1, "port 1")])
    for index, (_, datagram) in enumerate(CASES):
        direction = OUTBOUND if index % 2 else INBOUND
        ports = {"src_port": c.UDP_PORT_BASE + 3, "dst_port": 40000} if direction == OUTBOUND else {}
        writer.record(direction, 1, _frame(datagram, **ports))
    writer.close()
    options = ("-o", f"lhc.workers:{workers}") if workers else ()
    layers = run_tshark(capture, *options)
    assert len(layers) == len(CASES)
    for (kind, datagram), layer in zip(CASES, layers, strict=True):
        assert "lhc" in layer, kind
        assert check_lhc(datagram, layer["lhc"][0], workers=workers) == kind
        assert ("_ws.malformed" in layer["lhc"][0]) == (kind in {
            "reserved flags", "truncated header", "short payload", "long payload"}), kind


@pytest.mark.tshark
def test_the_heuristic_takes_lhc_off_its_ports_and_nothing_else(tmp_path: Path) -> None:
    capture = tmp_path / "heuristic.pcapng"
    writer = PcapngWriter(capture, [(1, "port 1")])
    lhc = _packet(msg_type=c.MsgType.RESULT, bitmap=0b11)
    other = bytearray(lhc)
    other[0] = 0x90  # an unassigned type: not lhc to the heuristic
    for datagram in (lhc, bytes(other), lhc[:-4]):
        writer.record(INBOUND, 1, _frame(datagram, src_port=33000, dst_port=33001))
    writer.close()
    first, second, third = run_tshark(capture)
    assert check_lhc(lhc, first["lhc"][0]) == "RESULT/ADD"
    assert "lhc" not in second and "lhc" not in third


@pytest.mark.tshark
def test_the_w_preference_names_the_missing_and_the_foreign_ranks(tmp_path: Path) -> None:
    capture = tmp_path / "ranks.pcapng"
    writer = PcapngWriter(capture, [(1, "port 1")])
    writer.record(INBOUND, 1, _frame(_packet(msg_type=c.MsgType.RESULT, bitmap=0b10010)))
    writer.close()
    (unknown,) = run_tshark(capture)
    assert experts(unknown["lhc"][0]) == [
        ("lhc.expert.missing_ranks", "Result without the bit of rank(s) 0, 2, 3")]
    (known,) = run_tshark(capture, "-o", "lhc.workers:4")
    assert sorted(experts(known["lhc"][0])) == [
        ("lhc.expert.foreign_ranks", "Result with the bit of rank(s) 4, W = 4"),
        ("lhc.expert.missing_ranks", "Result without the bit of rank(s) 0, 2, 3 (W = 4)")]
    assert fields(known["lhc"][0])["lhc.bitmap.ranks"] == ["1, 4"]


@pytest.mark.tshark
@pytest.mark.parametrize("snap", [c.HEADER_BYTES - 8, c.HEADER_BYTES + 2 * c.LANE_BYTES + 1])
def test_a_capture_cut_short_is_not_called_malformed(tmp_path: Path, snap: int) -> None:
    """A small snap length (editcap -s, tcpdump -s) cuts datagrams: the fields and whole lanes captured are
    shown, with a note, and the packet is judged by its length on the wire."""
    whole, cut = tmp_path / "whole.pcapng", tmp_path / "cut.pcapng"
    datagram = _packet(msg_type=c.MsgType.RESULT, bitmap=0b11)
    writer = PcapngWriter(whole, [(1, "port 1")])
    writer.record(OUTBOUND, 1, _frame(datagram, src_port=c.UDP_PORT_BASE, dst_port=40000))
    writer.close()
    editcap = shutil.which("editcap")
    if editcap is None:
        pytest.skip("needs editcap (Debian package wireshark-common, which tshark depends on)")
    subprocess.run([editcap, "-s", str(42 + snap), str(whole), str(cut)], check=True, capture_output=True)
    (layer,) = run_tshark(cut)
    shown = fields(layer["lhc"][0])
    assert "lhc.malformed" not in shown and "_ws.malformed" not in layer["lhc"][0]
    assert experts(layer["lhc"][0]) == [
        ("lhc.expert.cut", f"Capture cut short: {snap} of the datagram's {len(datagram)} bytes")]
    header = LhcHeader.unpack(datagram)
    for name, _ in c.HEADER_FIELDS:
        arrived = HEADER_OFFSETS[name] + wiresharkgen.group_bytes(name) <= snap
        assert (f"lhc.{name}" in shown) == arrived, name
        if arrived and name not in wiresharkgen.HEX:
            assert shown[f"lhc.{name}"] == [str(getattr(header, name))]
    lanes = max(0, (snap - c.HEADER_BYTES) // c.LANE_BYTES)
    if snap >= c.HEADER_BYTES:
        assert shown["lhc.lanes"] == [str(lanes)]
        words = np.frombuffer(datagram, ">i4", lanes, c.HEADER_BYTES)
        assert shown.get("lhc.lane.add", []) == [str(w) for w in words]
