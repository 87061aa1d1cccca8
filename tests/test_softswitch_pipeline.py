"""Every decision path of softswitch's pipeline, driven in-process (no sockets, no gRPC).

Each test configures tables through ``Entities`` (the P4Runtime write path) and runs frames through
``Pipeline.inject``; the expectations are docs/switch.md's, step by step.
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest

from lhc_ina import constants as c
from lhc_ina import wire
from lhc_ina.jobs import JobLayout
from lhc_ina.jobs import ip_to_int as ip_int
from lhc_ina.jobs import mac_to_int as mac_int
from lhc_ina.p4info import P4InfoIndex
from lhc_launch.switch_job import (
    SWITCH_IP,
    SWITCH_MAC,
    data_frame,
    job_updates,
    make_job,
    table_entry,
    update,
)
from softswitch.entity_store import Entities
from softswitch.pipeline import Pipeline
from softswitch.program import PipelineMismatch
from tests.harness.switch_jobs import broken_job_updates, position

INDEX = P4InfoIndex.from_file()
INSERT = 1
RNG = np.random.default_rng(5)


@pytest.fixture
def switch() -> tuple[Pipeline, Entities]:
    pipeline = Pipeline(INDEX)
    pipeline.configured = True
    return pipeline, Entities(pipeline, INDEX.p4info)


def install(switch: tuple[Pipeline, Entities], job: JobLayout) -> None:
    for up in job_updates(INDEX, job):
        switch[1].write(up)


def words(n: int = c.LANES) -> np.ndarray:
    return RNG.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)


def parse(frame: bytes) -> tuple[bytes, bytes, bytes, bytes, int, int, wire.LhcHeader, np.ndarray]:
    """(dst mac, src mac, src ip, dst ip, udp sport, udp dport, lhc header, payload) of a result frame,
    after checking the IPv4 checksum and the UDP checksum 0 that every result carries."""
    ip = frame[14:34]
    assert wire.ipv4_checksum(ip[:10] + b"\0\0" + ip[12:]) == struct.unpack("!H", ip[10:12])[0]
    sport, dport, length, checksum = struct.unpack("!HHHH", frame[34:42])
    assert (length, checksum) == (c.UDP_LENGTH, 0)
    header, payload = wire.unpack_packet(frame[42 : 42 + c.HEADER_BYTES + c.PAYLOAD_BYTES])
    return frame[0:6], frame[6:12], ip[12:16], ip[16:20], sport, dport, header, payload


def aggregate(pipeline: Pipeline, job: JobLayout, contributions: list[np.ndarray], **kwargs: int) -> list:
    """Every rank sends its words; the outputs of the last packet (earlier ones must be absorbed)."""
    for rank, value in enumerate(contributions):
        out = pipeline.inject(data_frame(job, rank, value, **kwargs), job.workers[rank].switch_port)
        if rank < len(contributions) - 1:
            assert out == []
    return out


# --- reduction -------------------------------------------------------------------------------------
@pytest.mark.parametrize("w", [1, 2, 3, 8, 32])
def test_reduction_multicasts_the_exact_sum_to_every_worker(switch, w):
    pipeline, _ = switch
    job = make_job(11, 2, w)
    install(switch, job)
    values = [words() for _ in range(w)]
    out = aggregate(pipeline, job, values, slot=3, ver=1, seq=77)
    expected = np.zeros(c.LANES, np.uint64)
    for v in values:
        expected += v
    expected = (expected % (1 << 32)).astype(np.uint32)
    assert [port for port, _ in out] == [wk.switch_port for wk in job.workers]
    for rank, (_, frame) in enumerate(out):
        dst_mac, src_mac, src_ip, dst_ip, sport, dport, header, payload = parse(frame)
        worker = job.workers[rank]
        assert dst_mac == wire.mac_bytes(worker.mac) and src_mac == wire.mac_bytes(SWITCH_MAC)
        assert dst_ip == wire.ip_bytes(worker.ip) and src_ip == wire.ip_bytes(SWITCH_IP)
        assert (sport, dport) == (c.UDP_PORT_BASE, worker.udp_port)
        assert header == wire.LhcHeader(c.MsgType.RESULT, c.Op.ADD, 1, 0, w - 1, 11, 3, job.epoch, 77,
                                        (1 << w) - 1 if w < 32 else 0xFFFFFFFF)
        np.testing.assert_array_equal(payload, expected)
    assert pipeline.stats(2) == ({"RESULT": 1, "ABSORBED": w - 1} if w > 1 else {"RESULT": 1})


def test_or_packets_or_their_lanes(switch):
    pipeline, _ = switch
    job = make_job(1, 1, 3)
    install(switch, job)
    values = [words() for _ in range(3)]
    out = aggregate(pipeline, job, values, op=c.Op.OR)
    header, payload = parse(out[0][1])[6:]
    assert header.op == c.Op.OR
    np.testing.assert_array_equal(payload, values[0] | values[1] | values[2])


def test_add_wraps_modulo_2_32(switch):
    pipeline, _ = switch
    job = make_job(1, 1, 2)
    install(switch, job)
    a = np.full(c.LANES, 0xFFFFFFFF, np.uint32)
    b = np.arange(c.LANES, dtype=np.uint32) + 1
    payload = parse(aggregate(pipeline, job, [a, b])[0][1])[7]
    np.testing.assert_array_equal(payload, np.arange(c.LANES, dtype=np.uint32))
    # int32 view: -5 + 3 = -2 stays exact through the wrap.
    job2 = make_job(2, 2, 2, slot_base=16)
    install(switch, job2)
    payload = parse(aggregate(pipeline, job2, [np.full(c.LANES, -5), np.full(c.LANES, 3)])[0][1])[7]
    assert (payload.view(np.int32) == -2).all()


def test_fan_in_one_returns_the_packet_as_result(switch):
    pipeline, _ = switch
    job = make_job(1, 1, 1)
    install(switch, job)
    value = words()
    header, payload = parse(aggregate(pipeline, job, [value])[0][1])[6:]
    assert (header.msg_type, header.bitmap) == (c.MsgType.RESULT, 1)
    np.testing.assert_array_equal(payload, value)


# --- duplicates, retransmissions, copies, epochs ---------------------------------------------------
def test_duplicate_while_aggregating_is_dropped_and_does_not_count_twice(switch):
    pipeline, _ = switch
    job = make_job(1, 1, 3)
    install(switch, job)
    a, b, d = words(), words(), words()
    assert pipeline.inject(data_frame(job, 0, a), 1) == []
    assert pipeline.inject(data_frame(job, 0, words()), 1) == []  # different words, still a duplicate
    assert pipeline.inject(data_frame(job, 1, b), 2) == []
    out = pipeline.inject(data_frame(job, 2, d), 3)
    np.testing.assert_array_equal(parse(out[0][1])[7], a + b + d)
    assert pipeline.stats(1) == {"ABSORBED": 2, "RESULT": 1, "DROP_DUPLICATE": 1}


def test_duplicate_of_a_finished_copy_is_answered_by_unicast_result_retx(switch):
    pipeline, _ = switch
    job = make_job(1, 1, 2)
    install(switch, job)
    a, b = words(), words()
    aggregate(pipeline, job, [a, b], slot=5, seq=9)
    port = job.workers[0].switch_port
    out = pipeline.inject(data_frame(job, 0, words(), slot=5, seq=9), port)  # back out of its ingress port
    assert [p for p, _ in out] == [port]
    dst_mac, src_mac, src_ip, dst_ip, sport, dport, header, payload = parse(out[0][1])
    worker = job.workers[0]
    assert (dst_mac, src_mac) == (wire.mac_bytes(worker.mac), wire.mac_bytes(SWITCH_MAC))
    assert (dst_ip, src_ip) == (wire.ip_bytes(worker.ip), wire.ip_bytes(SWITCH_IP))
    assert (sport, dport) == (c.UDP_PORT_BASE, worker.udp_port)
    assert (header.msg_type, header.bitmap, header.worker_id, header.seq) == (c.MsgType.RESULT_RETX, 3, 0, 9)
    np.testing.assert_array_equal(payload, a + b)
    assert pipeline.stats(1) == {"ABSORBED": 1, "RESULT": 1, "RETX": 1}


def test_both_copies_and_slot_reuse(switch):
    pipeline, _ = switch
    job = make_job(1, 1, 2)
    install(switch, job)
    r0 = [words(), words()]
    r1 = [words(), words()]
    r2 = [words(), words()]
    s = job.slot_count  # packets 0, S and 2S: slot 0 on copy 0, copy 1, then copy 0 again
    for p, values in ((0, r0), (s, r1), (2 * s, r2)):
        # Copy 0's second round overwrites its old value; it does not add to it.
        out = aggregate(pipeline, job, values, **position(job, p))
        np.testing.assert_array_equal(parse(out[0][1])[7], values[0] + values[1])
    cell = 0 * c.SLOT_COPIES
    assert pipeline.slot_bitmap[cell] == 3 and pipeline.slot_remaining[cell] == 0
    assert pipeline.slot_round[cell] == 2 * s
    assert pipeline.slot_bitmap[cell + 1] == 3  # copy 1 keeps its finished round's contributors


def test_a_finished_copy_still_answers_after_the_others_moved_on(switch):
    pipeline, _ = switch
    job = make_job(1, 1, 2)
    install(switch, job)
    a, b = words(), words()
    aggregate(pipeline, job, [a, b], ver=0)
    pipeline.inject(data_frame(job, 0, words(), **position(job, job.slot_count)), 1)
    assert pipeline.slot_bitmap[0] == 0b11 and pipeline.slot_bitmap[1] == 0b01
    # Worker 1 lost result 0 and asks copy 0 again: served with the round's contributors.
    out = pipeline.inject(data_frame(job, 1, words(), ver=0), 2)
    header, payload = parse(out[0][1])[6:]
    assert (header.msg_type, header.bitmap) == (c.MsgType.RESULT_RETX, 0b11)
    np.testing.assert_array_equal(payload, a + b)


def test_new_epoch_resets_lazily_and_stale_epoch_is_dropped(switch):
    pipeline, entities = switch
    job = make_job(1, 1, 2, epoch=5)
    install(switch, job)
    pipeline.inject(data_frame(job, 0, words()), 1)  # half a round at epoch 5
    job = dataclasses.replace(job, epoch=6)
    entities.write(job_updates(INDEX, job, kind=2)[0])  # MODIFY the jobs entry: new epoch
    a, b = words(), words()
    out = aggregate(pipeline, job, [a, b])
    header, payload = parse(out[0][1])[6:]
    assert (header.epoch, header.bitmap) == (6, 3)
    np.testing.assert_array_equal(payload, a + b)  # the epoch-5 contribution is gone
    stale = data_frame(job, 0, words(), epoch=5)
    assert pipeline.inject(stale, 1) == []
    assert pipeline.stats(1)["DROP_STALE_EPOCH"] == 1


def test_two_jobs_in_disjoint_slot_ranges_never_interfere(switch):
    pipeline, _ = switch
    one = make_job(1, 1, 2, slot_base=0, slot_count=4)
    two = make_job(2, 2, 2, slot_base=4, slot_count=4, first_port=3)
    install(switch, one)
    install(switch, two)
    a = [words(), words()]
    b = [words(), words()]
    pipeline.inject(data_frame(one, 0, a[0], slot=1), 1)
    pipeline.inject(data_frame(two, 0, b[0], slot=1), 3)
    out_two = pipeline.inject(data_frame(two, 1, b[1], slot=1), 4)
    out_one = pipeline.inject(data_frame(one, 1, a[1], slot=1), 2)
    np.testing.assert_array_equal(parse(out_one[0][1])[7], a[0] + a[1])
    np.testing.assert_array_equal(parse(out_two[0][1])[7], b[0] + b[1])
    assert [p for p, _ in out_one] == [1, 2] and [p for p, _ in out_two] == [3, 4]
    assert pipeline.stats(1) == pipeline.stats(2) == {"ABSORBED": 1, "RESULT": 1}


# --- drops, each counted by reason -----------------------------------------------------------------
def _lhc(job: JobLayout, **header: int) -> bytes:
    return data_frame(job, 0, words(), **header)


@pytest.mark.parametrize("mutate, stat, row", [
    (lambda f: f[:-1], "DROP_MALFORMED", 0),                          # payload cut short
    (lambda f: f[: 42 + 10], "DROP_MALFORMED", 0),                    # lhc header cut short
    (lambda f: f[:38] + struct.pack("!H", 284) + f[40:], "DROP_MALFORMED", 0),  # udp.length
    (lambda f: f[:16] + struct.pack("!H", 304) + f[18:], "DROP_MALFORMED", 0),  # ipv4.total_len
    (lambda f: f[:42] + bytes([f[42] | 1]) + f[43:], "DROP_MALFORMED", 0),      # flags
])
def test_malformed_packets_are_dropped_and_counted_in_row_0(switch, mutate, stat, row):
    pipeline, _ = switch
    job = make_job(1, 1, 2)
    install(switch, job)
    frame = mutate(_lhc(job))
    out = pipeline.inject(frame, 1)
    assert out == [] and pipeline.stats(row) == {stat: 1} and pipeline.stats(1) == {}
    assert pipeline.stats_bytes[row * c.NUM_STATS + c.Stat[stat]] == len(frame)


def test_trailing_bytes_after_correct_lengths_are_not_malformed_and_travel_along(switch):
    pipeline, _ = switch
    job = make_job(1, 1, 2)
    install(switch, job)
    pipeline.inject(data_frame(job, 0, words()), 1)
    out = pipeline.inject(data_frame(job, 1, words()) + b"pad!", 2)  # e.g. Ethernet padding
    assert len(out) == 2 and all(frame.endswith(b"pad!") for _, frame in out)


def test_a_longer_frame_with_more_lanes_fails_the_length_checks(switch):
    pipeline, _ = switch
    job = make_job(1, 1, 2)
    install(switch, job)
    lhc = wire.LhcHeader(c.MsgType.DATA, worker_id=0, job_id=1, epoch=1).pack() + bytes(4 * (c.LANES + 1))
    frame = wire.build_frame(lhc, src_mac=job.workers[0].mac, dst_mac=SWITCH_MAC, src_ip=job.workers[0].ip,
                             dst_ip=SWITCH_IP, src_port=1)
    assert pipeline.inject(frame, 1) == [] and pipeline.stats(0) == {"DROP_MALFORMED": 1}


@pytest.mark.parametrize("msg_type", [0, c.MsgType.RESULT, c.MsgType.RESULT_RETX, c.MsgType.CONTROL, 15])
def test_non_data_types_are_dropped_as_bad_type(switch, msg_type):
    pipeline, _ = switch
    job = make_job(1, 1, 2)
    install(switch, job)
    assert pipeline.inject(_lhc(job, msg_type=msg_type), 1) == []
    assert pipeline.stats(0) == {"DROP_BAD_TYPE": 1}


@pytest.mark.parametrize("op", [2, 3])
def test_unknown_ops_are_dropped_as_bad_op(switch, op):
    pipeline, _ = switch
    job = make_job(1, 1, 2)
    install(switch, job)
    assert pipeline.inject(_lhc(job, op=op), 1) == []
    assert pipeline.stats(0) == {"DROP_BAD_OP": 1}


def test_unknown_job_counts_in_row_0(switch):
    pipeline, _ = switch
    job = make_job(1, 1, 2)
    install(switch, job)
    assert pipeline.inject(_lhc(job, job_id=99), 1) == []
    assert pipeline.stats(0) == {"DROP_UNKNOWN_JOB": 1} and pipeline.stats(1) == {}


def test_slot_out_of_range_is_dropped_in_the_jobs_row(switch):
    pipeline, _ = switch
    job = make_job(1, 1, 2, slot_count=4)
    install(switch, job)
    assert pipeline.inject(_lhc(job, slot=4), 1) == []
    # A broken entry on purpose: base + slot runs past the registers, which the data plane guards too.
    edge = make_job(2, 2, 2, slot_base=c.MAX_SLOTS - 2, slot_count=2)
    for up in broken_job_updates(INDEX, edge, {"slot_count": 8}):
        switch[1].write(up)
    assert pipeline.inject(_lhc(edge, slot=1), 1) == []
    assert pipeline.inject(_lhc(edge, slot=2), 1) == []
    assert pipeline.stats(1) == {"DROP_SLOT_RANGE": 1}
    assert pipeline.stats(2) == {"ABSORBED": 1, "DROP_SLOT_RANGE": 1}


def test_unknown_worker_and_spoofed_source_are_dropped_as_bad_worker(switch):
    pipeline, _ = switch
    job = make_job(1, 1, 2)
    install(switch, job)
    assert pipeline.inject(_lhc(job, worker_id=5), 1) == []
    assert pipeline.inject(data_frame(job, 0, words(), src_ip="10.9.9.9"), 1) == []
    assert pipeline.inject(data_frame(job, 0, words(), src_ip=job.workers[1].ip), 1) == []
    assert pipeline.stats(1) == {"DROP_BAD_WORKER": 3}
    assert pipeline.slot_bitmap.sum() == 0


def test_missing_replica_drops_only_that_copy_and_missing_group_drops_all(switch):
    pipeline, entities = switch
    job = make_job(1, 1, 3)
    updates = job_updates(INDEX, job)
    for up in updates:
        if not (up.entity.table_entry.table_id == INDEX.table("LhcEgress.replicas").id
                and up.entity.table_entry.match[1].exact.value == b"\x01"):
            entities.write(up)
    out = aggregate(pipeline, job, [words(), words(), words()])
    assert [port for port, _ in out] == [1, 3]
    entities.write(update(3, updates[-1].entity.packet_replication_engine_entry.multicast_group_entry))
    assert aggregate(pipeline, job, [words(), words(), words()], slot=1) == []
    assert pipeline.stats(1)["RESULT"] == 2


def test_multicast_group_0_sends_one_copy_to_port_0_as_bmv2(switch):
    pipeline, _ = switch
    job = make_job(1, 1, 2)
    for up in broken_job_updates(INDEX, job, {"mcast_grp": 0}):  # a broken entry on purpose
        switch[1].write(up)
    out = aggregate(pipeline, job, [words(), words()])
    assert [port for port, _ in out] == [0]
    assert parse(out[0][1])[3] == wire.ip_bytes(job.workers[0].ip)  # egress_rid 0's replica rewrite


def test_job_index_past_the_counter_counts_nothing_but_aggregates(switch):
    pipeline, _ = switch
    job = make_job(1, 1, 2)
    for up in broken_job_updates(INDEX, job, {"job_index": c.MAX_JOBS}):  # a broken entry on purpose
        switch[1].write(up)
    assert len(aggregate(pipeline, job, [words(), words()])) == 2
    assert pipeline.stats_packets.sum() == 0


def test_unconfigured_pipeline_forwards_nothing():
    pipeline = Pipeline(INDEX)
    entities = Entities(pipeline, INDEX.p4info)
    job = make_job(1, 1, 1)
    for up in job_updates(INDEX, job):
        entities.write(up)
    assert pipeline.inject(data_frame(job, 0, words()), 1) == []
    assert pipeline.stats_packets.sum() == 0


def test_reset_clears_tables_groups_registers_and_counters(switch):
    pipeline, _ = switch
    job = make_job(1, 1, 2)
    install(switch, job)
    aggregate(pipeline, job, [words(), words()])
    pipeline.reset()
    assert not pipeline.jobs.entries and not pipeline.pre.groups
    assert pipeline.slot_values.sum() == 0 and pipeline.stats_packets.sum() == 0


def test_pipeline_refuses_a_p4info_without_its_entities():
    p4info = INDEX.p4info.__class__()
    p4info.CopyFrom(INDEX.p4info)
    del p4info.tables[0]
    with pytest.raises(PipelineMismatch, match="no table LhcIngress"):
        Pipeline(P4InfoIndex(p4info))


# --- plain forwarding ------------------------------------------------------------------------------
def _udp_frame(dst_ip: str, *, ttl: int = 64, dst_port: int = 53, dst_mac: str = SWITCH_MAC) -> bytes:
    return wire.build_frame(b"hello", src_mac="02:00:00:00:00:01", dst_mac=dst_mac, src_ip="10.0.0.1",
                            dst_ip=dst_ip, src_port=1234, dst_port=dst_port, ttl=ttl)


def _route(switch, prefix: str, plen: int, port: int, dst_mac: str) -> None:
    switch[1].write(update(INSERT, table_entry(
        INDEX, "LhcIngress.ipv4_routes", {"hdr.ipv4.dst_addr": (ip_int(prefix), plen)}, "LhcIngress.route",
        port=port, src_mac=mac_int(SWITCH_MAC), dst_mac=mac_int(dst_mac),
    )))


def test_ipv4_routes_longest_prefix_rewrites_macs_and_decrements_ttl(switch):
    pipeline, _ = switch
    _route(switch, "10.1.0.0", 16, 2, "02:00:00:00:00:02")
    _route(switch, "10.1.2.0", 24, 3, "02:00:00:00:00:03")
    frame = _udp_frame("10.1.2.3")
    [(port, out)] = pipeline.inject(frame, 1)
    assert port == 3 and out[0:6] == wire.mac_bytes("02:00:00:00:00:03")
    assert out[6:12] == wire.mac_bytes(SWITCH_MAC) and out[22] == 63
    ip = out[14:34]
    assert wire.ipv4_checksum(ip[:10] + b"\0\0" + ip[12:]) == struct.unpack("!H", ip[10:12])[0]
    assert out[34:] == frame[34:]
    assert pipeline.inject(_udp_frame("10.1.9.9"), 1)[0][0] == 2
    assert pipeline.inject(_udp_frame("10.2.0.1"), 1) == []  # miss: default drop
    assert pipeline.inject(_udp_frame("10.1.2.3", ttl=1), 1) == []
    assert pipeline.inject(_udp_frame("10.1.2.3", ttl=0), 1) == []
    assert pipeline.stats_packets.sum() == 0  # no counters for non-lhc traffic


def test_lhc_port_to_any_address_is_lhc_and_fragments_are_not(switch):
    pipeline, _ = switch
    _route(switch, "10.1.0.0", 16, 2, "02:00:00:00:00:02")
    assert pipeline.inject(_udp_frame("10.1.0.5", dst_port=c.UDP_PORT_BASE + 3), 1) == []
    assert pipeline.stats(0) == {"DROP_MALFORMED": 1}
    fragment = bytearray(_udp_frame("10.1.0.5", dst_port=c.UDP_PORT_BASE))
    fragment[20:22] = struct.pack("!H", 0x0001)  # frag_offset 1: no UDP header parsed, so routed
    assert pipeline.inject(bytes(fragment), 1)[0][0] == 2


def test_l2_forward_for_non_ipv4_and_ipv4_with_options(switch):
    pipeline, entities = switch
    entities.write(update(INSERT, table_entry(
        INDEX, "LhcIngress.l2_forward", {"hdr.ethernet.dst_addr": mac_int("02:00:00:00:00:09")},
        "LhcIngress.set_port", port=9,
    )))
    arp = wire.mac_bytes("02:00:00:00:00:09") + wire.mac_bytes("02:00:00:00:00:01") + b"\x08\x06" + bytes(28)
    assert pipeline.inject(arp, 1) == [(9, arp)]
    options = bytearray(_udp_frame("10.0.0.9", dst_mac="02:00:00:00:00:09"))
    options[14] = 0x46  # ihl 6: not parsed as IPv4, so bridged unchanged
    assert pipeline.inject(bytes(options), 1) == [(9, bytes(options))]
    assert pipeline.inject(arp[:6] + b"\x02" + arp[7:], 1)[0][0] == 9
    assert pipeline.inject(b"\x04" + arp[1:], 1) == []  # miss: default drop


@pytest.mark.parametrize("length", [0, 5, 13, 14, 20, 33, 41])
def test_truncated_non_lhc_frames_are_dropped(switch, length):
    pipeline, entities = switch
    entities.write(update(INSERT, table_entry(
        INDEX, "LhcIngress.l2_forward", {"hdr.ethernet.dst_addr": mac_int(SWITCH_MAC)},
        "LhcIngress.set_port", port=9,
    )))
    _route(switch, "0.0.0.0", 1, 2, "02:00:00:00:00:02")
    _route(switch, "128.0.0.0", 1, 2, "02:00:00:00:00:02")
    assert pipeline.inject(_udp_frame("10.0.0.9")[:length], 1) == []
    assert pipeline.stats_packets.sum() == 0
