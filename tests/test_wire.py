"""The three faces of the lhc packet (struct, numpy batch, scapy) agree byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lhc_ina import constants as c
from lhc_ina import wire

headers = st.builds(
    wire.LhcHeader,
    **{name: st.integers(0, (1 << width) - 1) for name, width in c.HEADER_FIELDS},
)
payloads = st.lists(st.integers(0, 2**32 - 1), min_size=c.LANES, max_size=c.LANES)


@settings(max_examples=200, deadline=None)
@given(headers, payloads)
def test_struct_round_trip(header: wire.LhcHeader, words: list[int]) -> None:
    buf = wire.pack_packet(header, np.array(words, dtype=np.uint32))
    assert len(buf) == c.HEADER_BYTES + c.PAYLOAD_BYTES
    back, lanes = wire.unpack_packet(buf)
    assert back == header
    assert lanes.tolist() == words


@settings(max_examples=100, deadline=None)
@given(headers)
def test_field_offsets_and_shifts_locate_every_field(header: wire.LhcHeader) -> None:
    buf = wire.pack_packet(header, np.zeros(c.LANES, dtype=np.uint32))
    for name, width in c.HEADER_FIELDS:
        size = max(1, width // 8)
        at = wire.HEADER_OFFSETS[name]
        group = int.from_bytes(buf[at : at + size], "big")
        assert (group >> wire.HEADER_SHIFTS[name]) & ((1 << width) - 1) == getattr(header, name), name


@settings(max_examples=100, deadline=None)
@given(headers, payloads)
def test_numpy_batch_and_scapy_agree_with_struct(header: wire.LhcHeader, words: list[int]) -> None:
    expected = wire.pack_packet(header, np.array(words, dtype=np.uint32))

    packets = wire.empty_packets(1)
    wire.set_header_fields(packets, **{name: getattr(header, name) for name, _ in c.HEADER_FIELDS})
    packets["payload"][0] = words
    assert wire.pack_packets(packets) == [expected]
    parsed = wire.parse_packet(expected)
    for name, _ in c.HEADER_FIELDS:
        assert int(wire.header_field(parsed.reshape(1), name)[0]) == getattr(header, name)

    lhc, payload = wire.scapy_layers()
    fields = {name: getattr(header, name) for name, _ in c.HEADER_FIELDS}
    assert bytes(lhc(**fields) / payload(words=words)) == expected


def test_negative_int32_words_wrap_to_twos_complement() -> None:
    words = np.full(c.LANES, -1, dtype=np.int32)
    _, lanes = wire.unpack_packet(wire.pack_packet(wire.LhcHeader(), words))
    assert lanes.astype(np.int32).tolist() == [-1] * c.LANES


def test_scapy_dissects_a_full_frame_by_udp_port() -> None:
    from scapy.layers.l2 import Ether

    lhc, payload = wire.scapy_layers()
    header = wire.LhcHeader(job_id=7, slot=3, seq=99, worker_id=2)
    frame = wire.build_frame(
        wire.pack_packet(header, np.arange(c.LANES)),
        src_mac="02:00:00:00:00:01", dst_mac="02:00:00:00:00:fe",
        src_ip="10.0.0.1", dst_ip="10.0.0.254", src_port=40000, dst_port=c.UDP_PORT_BASE + 5,
    )
    packet = Ether(frame)
    assert packet[lhc].job_id == 7 and packet[lhc].seq == 99
    assert packet[payload].words == list(range(c.LANES))
    assert len(frame) == c.FRAME_BYTES
    # The IPv4 checksum we compute is the one scapy computes.
    ip = packet["IP"]
    stored = ip.chksum
    del ip.chksum
    assert ip.__class__(bytes(ip)).chksum == stored


@pytest.mark.parametrize("size", [0, c.HEADER_BYTES, c.HEADER_BYTES + c.PAYLOAD_BYTES - 4,
                                  c.HEADER_BYTES + c.PAYLOAD_BYTES + 4])
def test_wrong_sizes_are_named(size: int) -> None:
    with pytest.raises(wire.MalformedPacket, match="lhc packet must be"):
        wire.unpack_packet(bytes(size))


def test_out_of_range_field_is_refused() -> None:
    with pytest.raises(ValueError, match="worker_id=256 does not fit in 8 bits"):
        wire.LhcHeader(worker_id=256)


def test_frame_offsets_locate_every_field_build_frame_writes() -> None:
    header = wire.LhcHeader(msg_type=1, op=1, ver=1, flags=0, worker_id=7, job_id=300, slot=9, epoch=5,
                            seq=77, bitmap=3)
    lhc = wire.pack_packet(header, np.arange(c.LANES, dtype=np.uint32))
    frame = wire.build_frame(
        lhc, src_mac="02:00:00:00:00:01", dst_mac="02:00:00:00:00:02", src_ip="10.0.0.1",
        dst_ip="10.0.0.2", src_port=40001, dst_port=c.UDP_PORT_BASE + 3, ttl=17,
    )
    assert len(frame) == wire.FRAME_END == c.FRAME_BYTES
    assert frame[wire.ETH_DST] == wire.mac_bytes("02:00:00:00:00:02")
    assert frame[wire.ETH_SRC] == wire.mac_bytes("02:00:00:00:00:01")
    assert int.from_bytes(frame[wire.ETH_TYPE : wire.ETH_TYPE + 2], "big") == c.ETHERTYPE_IPV4
    assert int.from_bytes(frame[wire.IP_TOTAL_LEN : wire.IP_TOTAL_LEN + 2], "big") == c.IPV4_TOTAL_LENGTH
    assert frame[wire.IP_TTL] == 17 and frame[wire.IP_PROTO] == c.IP_PROTO_UDP
    ip = frame[wire.FRAME_IPV4 : wire.FRAME_UDP]
    checksum = int.from_bytes(frame[wire.IP_CHECKSUM : wire.IP_CHECKSUM + 2], "big")
    assert wire.ipv4_checksum(ip[:10] + b"\0\0" + ip[12:]) == checksum
    assert frame[wire.IP_SRC] == wire.ip_bytes("10.0.0.1") and frame[wire.IP_DST] == wire.ip_bytes("10.0.0.2")
    assert int.from_bytes(frame[wire.UDP_SPORT], "big") == 40001
    assert int.from_bytes(frame[wire.UDP_DPORT], "big") == c.UDP_PORT_BASE + 3
    assert int.from_bytes(frame[wire.UDP_LEN : wire.UDP_LEN + 2], "big") == c.UDP_LENGTH
    assert frame[wire.UDP_CHECKSUM : wire.UDP_CHECKSUM + 2] == b"\0\0"
    assert frame[wire.FRAME_LHC : wire.FRAME_END] == lhc


def test_stream_position_maps_packets_to_slot_copy_and_seq():
    stream_position = wire.stream_position
    assert [tuple(stream_position(p, 3).values()) for p in range(7)] == [
        (0, 0, 0), (1, 0, 1), (2, 0, 2), (0, 1, 3), (1, 1, 4), (2, 1, 5), (0, 0, 6)]
    assert stream_position((1 << 32) + 5, 4) == {"slot": 1, "ver": 1, "seq": 5}  # seq wraps, p does not
    with pytest.raises(ValueError, match="need p >= 0 and slot_count >= 1"):
        stream_position(1, 0)
