"""``lhc-softswitch`` as a process in UDP mode: startup line, aggregation over loopback, clean shutdown,
and a bounded fuzz run (malformed and random datagrams while a job aggregates)."""

from __future__ import annotations

import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from p4.v1 import p4runtime_pb2 as p4v1
from p4.v1 import p4runtime_pb2_grpc

from lhc_ina import constants as c
from lhc_ina import wire
from lhc_ina.jobs import JobLayout, WorkerEndpoint
from lhc_ina.p4info import P4InfoIndex
from lhc_launch.switch_job import data_packet, job_updates, make_job
from softswitch.cli import READY
from softswitch.native import native_available
from softswitch.ports import PortSpec, UdpPort, parse_port_specs
from tests.harness.switch_jobs import position

INDEX = P4InfoIndex.from_file()
RNG = np.random.default_rng(11)


class Softswitch:
    """An lhc-softswitch process running ``pipeline`` on a random loopback address's lhc port, with a
    P4Runtime stub."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        for _ in range(5):
            self.host = f"127.{RNG.integers(1, 255)}.{RNG.integers(0, 256)}.{RNG.integers(1, 255)}"
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "softswitch.cli", "--grpc-addr", "127.0.0.1:0",
                 "--udp", f"1@{self.host}:{c.UDP_PORT_BASE}", "--log-level", "INFO", "--pipeline", pipeline],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            self.line = self.proc.stdout.readline()
            if self.line.startswith(READY):
                break
            self.proc.wait()
        else:
            raise RuntimeError(f"softswitch did not start: {self.proc.stderr.read()}")
        fields = dict(part.split("=", 1) for part in self.line[len(READY):].split())
        self.channel = grpc.insecure_channel(fields["grpc"])
        self.stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
        request = p4v1.SetForwardingPipelineConfigRequest(
            device_id=1, action=p4v1.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT)
        request.config.p4info.CopyFrom(INDEX.p4info)
        self.stub.SetForwardingPipelineConfig(request)
        self.address = (self.host, c.UDP_PORT_BASE)

    def read(self, entity: p4v1.Entity) -> list[p4v1.Entity]:
        responses = self.stub.Read(p4v1.ReadRequest(device_id=1, entities=[entity]))
        return [e for r in responses for e in r.entities]

    def counters(self) -> np.ndarray:
        everything = p4v1.Entity()
        everything.counter_entry.counter_id = INDEX.counter("LhcIngress.lhc_stats").id
        cells = np.zeros(c.MAX_JOBS * c.NUM_STATS, np.int64)
        for entry in self.read(everything):
            cells[entry.counter_entry.index.index] = entry.counter_entry.data.packet_count
        return cells.reshape(c.MAX_JOBS, c.NUM_STATS)

    def stop(self) -> tuple[int, str]:
        self.channel.close()
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=10)
        return self.proc.returncode, err


PIPELINES = [pytest.param("python"), pytest.param("native", marks=pytest.mark.skipif(
    not native_available(), reason="the native pipeline is not built"))]


@pytest.fixture(params=PIPELINES)
def switch(request: pytest.FixtureRequest) -> Iterator[Softswitch]:
    sw = Softswitch(request.param)
    yield sw
    if sw.proc.poll() is None:
        sw.stop()


def worker_sockets(n: int) -> tuple[list[socket.socket], list[WorkerEndpoint]]:
    """One socket per rank on loopback: a rank receives its results where it sends from."""
    socks, endpoints = [], []
    for rank in range(n):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(3)
        socks.append(sock)
        endpoints.append(WorkerEndpoint(rank, "127.0.0.1", sock.getsockname()[1], "02:00:00:00:00:01", 1))
    return socks, endpoints


def round_trip(sw: Softswitch, socks: list[socket.socket], job: JobLayout, p: int) -> np.ndarray:
    """Packet ``p`` of every rank (one aggregation round); checks every copy and returns the sum."""
    at = position(job, p)
    values = [RNG.integers(0, 1 << 32, c.LANES, dtype=np.uint64).astype(np.uint32) for _ in job.workers]
    for rank, value in enumerate(values):
        socks[rank].sendto(data_packet(job, rank, value, **at), sw.address)
    expected = (np.sum(values, axis=0, dtype=np.uint64) % (1 << 32)).astype(np.uint32)
    for sock in socks:
        data, source = sock.recvfrom(2048)
        header, words = wire.unpack_packet(data)
        assert source == sw.address and header.msg_type == c.MsgType.RESULT
        assert (header.slot, header.ver, header.seq, header.bitmap) == (
            at["slot"], at["ver"], at["seq"], (1 << len(job.workers)) - 1)
        np.testing.assert_array_equal(words, expected)
    return expected


def test_ready_line_aggregation_over_udp_and_clean_sigterm(switch):
    assert switch.line.startswith(f"{READY} grpc=127.0.0.1:")
    assert f"ports=1@{switch.host}:19520/udp pipeline={switch.pipeline}\n" in switch.line
    socks, workers = worker_sockets(4)
    job = make_job(3, 2, workers, slot_count=8, epoch=9)
    switch.stub.Write(p4v1.WriteRequest(device_id=1, updates=job_updates(INDEX, job)))
    for p in range(6):
        round_trip(switch, socks, job, p)
    # A retransmission after completion comes back unicast as RESULT_RETX.
    socks[1].sendto(data_packet(job, 1, np.zeros(c.LANES, np.uint32), slot=5, seq=5), switch.address)
    header, _ = wire.unpack_packet(socks[1].recvfrom(2048)[0])
    assert (header.msg_type, header.worker_id) == (c.MsgType.RESULT_RETX, 1)
    assert switch.counters()[2, : c.Stat.DROP_DUPLICATE].tolist() == [18, 6, 1]
    code, err = switch.stop()
    assert code == 0 and "frames received, 0 raised" in err
    for sock in socks:
        sock.close()


def _garbage(job: JobLayout, worker_ids: int) -> bytes:
    """One hostile datagram: random bytes, or a DATA packet of the job with one thing wrong."""
    kind = RNG.integers(0, 8)
    if kind == 0:
        return RNG.bytes(int(RNG.integers(0, 600)))
    valid = bytearray(data_packet(job, int(RNG.integers(0, worker_ids)), np.zeros(c.LANES, np.uint32),
                                  slot=int(RNG.integers(0, 4))))
    if kind == 1:
        return bytes(valid[: int(RNG.integers(0, len(valid)))])  # truncated
    if kind == 2:
        return bytes(valid) + RNG.bytes(int(RNG.integers(1, 64)))  # too long
    if kind == 3:
        valid[0] = (int(RNG.integers(2, 16)) << 4) | (valid[0] & 0x0F)  # not DATA
    elif kind == 4:
        valid[0] |= 0x08 if RNG.integers(0, 2) else 0x01  # bad op or reserved flag
    elif kind == 5:
        valid[2:4] = int(RNG.integers(100, 1 << 16)).to_bytes(2, "big")  # unknown job
    elif kind == 6:
        valid[6:8] = (job.epoch + 1).to_bytes(2, "big")  # stale epoch
    else:
        valid[1] = int(RNG.integers(job.world_size, 256))  # unknown worker
    return bytes(valid)


@pytest.mark.timeout(60)
def test_fuzz_leaves_the_job_exact_and_other_state_unchanged(switch):
    """Bounded: 3000 hostile datagrams interleaved with 40 rounds, a few seconds in all."""
    socks, workers = worker_sockets(3)
    job = make_job(5, 4, workers, slot_count=4, slot_base=8, epoch=2)
    bystander = make_job(6, 5, workers, slot_count=4, slot_base=100, epoch=1, mcast_grp=77)
    switch.stub.Write(p4v1.WriteRequest(device_id=1, updates=job_updates(INDEX, job) + job_updates(
        INDEX, bystander)))
    everything = p4v1.Entity()
    everything.table_entry.SetInParent()
    tables_before = switch.read(everything)
    attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    attacker.bind(("127.0.0.1", 0))
    deadline = time.monotonic() + 20
    for p in range(40):
        assert time.monotonic() < deadline
        for _ in range(75):
            attacker.sendto(_garbage(job, 8), switch.address)
        round_trip(switch, socks, job, p)
    assert switch.read(everything) == tables_before
    counters = switch.counters()
    assert counters[5].sum() == 0  # the bystander job saw nothing
    assert counters[4, c.Stat.RESULT] == 40 and counters[4, c.Stat.ABSORBED] == 80
    unexpected = set(np.flatnonzero(counters[4])) - {
        c.Stat.ABSORBED, c.Stat.RESULT, c.Stat.RETX, c.Stat.DROP_DUPLICATE, c.Stat.DROP_STALE_EPOCH,
        c.Stat.DROP_BAD_WORKER}
    assert not unexpected
    assert set(np.flatnonzero(counters[0])) <= {
        c.Stat.DROP_MALFORMED, c.Stat.DROP_BAD_TYPE, c.Stat.DROP_BAD_OP, c.Stat.DROP_UNKNOWN_JOB}
    # Still up and still exact for the bystander, whose slots nothing touched.
    round_trip(switch, socks, bystander, 0)
    code, err = switch.stop()
    assert code == 0 and "frames received, 0 raised" in err and "Traceback" not in err
    for sock in socks:
        sock.close()
    attacker.close()


def test_port_specs():
    specs = parse_port_specs(["3@veth1"], ["127.0.0.1:19520", "7@127.0.0.2:0"])
    assert [s.describe() for s in specs] == ["3@veth1", "1@127.0.0.1:19520/udp", "7@127.0.0.2:0/udp"]
    for bad in (["x@veth1"], ["512@veth1"], ["1"]):
        with pytest.raises(ValueError, match=r"port number|expected N@IFACE"):
            parse_port_specs(bad, [])
    with pytest.raises(ValueError, match="given twice"):
        parse_port_specs(["1@veth1"], ["1@127.0.0.1:19521"])
    with pytest.raises(ValueError, match="not an IPv4 address"):
        parse_port_specs([], ["1@localhost.x:5"])


@pytest.mark.parametrize("port", [1, c.UDP_PORT_BASE - 1, c.UDP_PORT_BASE + c.UDP_PORT_COUNT, 65535])
def test_a_udp_port_outside_the_lhc_range_is_refused(port):
    with pytest.raises(ValueError, match=rf"UDP port {port} is outside the lhc range 19520\.\.19535: every "
                                         "datagram to it would be plain UDP"):
        parse_port_specs([], [f"1@127.0.0.1:{port}"])


def test_udp_port_0_binds_a_free_port_of_the_lhc_range_and_says_which():
    host = f"127.{RNG.integers(1, 255)}.{RNG.integers(0, 256)}.{RNG.integers(1, 255)}"
    rx = bytearray(70000)
    first = UdpPort(PortSpec(1, host=host, udp_port=0), rx)
    second = UdpPort(PortSpec(2, host=host, udp_port=0), rx)
    try:
        assert first.address == (host, c.UDP_PORT_BASE) and second.address == (host, c.UDP_PORT_BASE + 1)
        assert second.spec.describe() == f"2@{host}:{c.UDP_PORT_BASE + 1}/udp"
    finally:
        first.close()
        second.close()


def test_udp_port_synthesizes_a_valid_frame_and_sends_the_udp_payload():
    rx = bytearray(70000)
    host = f"127.{RNG.integers(1, 255)}.{RNG.integers(0, 256)}.{RNG.integers(1, 255)}"
    port = UdpPort(PortSpec(4, host=host, udp_port=0), rx)
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    peer.settimeout(3)
    try:
        peer.sendto(b"lhc bytes", port.address)
        select.select([port], [], [], 3)
        length = port.receive()
        frame = bytes(rx[:length])
        assert length == 42 + 9 and frame[42:] == b"lhc bytes"
        mac = b"\x02\x00" + socket.inet_aton(host)  # the port's own address, as both MACs
        assert frame[0:6] == mac and frame[6:12] == b"\x02\x00\x7f\x00\x00\x01"
        ip = frame[14:34]
        assert wire.ipv4_checksum(ip[:10] + b"\0\0" + ip[12:]) == int.from_bytes(ip[10:12], "big")
        assert (ip[9], int.from_bytes(ip[2:4], "big"), ip[8]) == (c.IP_PROTO_UDP, 20 + 8 + 9, 64)
        udp = frame[34:42]
        assert int.from_bytes(udp[0:2], "big") == peer.getsockname()[1]
        assert int.from_bytes(udp[2:4], "big") == port.address[1] and udp[4:6] == (8 + 9).to_bytes(2, "big")
        assert port.receive() == -1
        # Out: the bytes after the UDP header go to (ipv4.dst, udp.dst); other frames cannot leave.
        reply = bytearray(frame)
        reply[30:34], reply[36:38] = ip[12:16], udp[0:2]
        port.send(memoryview(reply))
        port.flush()
        assert peer.recvfrom(100) == (b"lhc bytes", port.address)
        port.send(memoryview(bytes(60)))
        assert port.dropped_non_udp == 1
    finally:
        port.close()


def test_udp_port_queues_what_leaves_and_flushes_it_in_order_to_each_destination():
    """A result's copies (one per worker) leave together at the end of a burst, each to its own
    worker, in the order they were emitted."""
    port = UdpPort(PortSpec(4, host="127.0.0.1", udp_port=0), bytearray(70000))
    peers = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3)]
    try:
        for peer in peers:
            peer.bind(("127.0.0.1", 0))
        template = wire.build_frame(b"", src_mac="02:00:00:00:00:01", dst_mac="02:00:00:00:00:02",
                                    src_ip="127.0.0.1", dst_ip="127.0.0.1", src_port=1, dst_port=1)
        for copy in range(6):
            frame = bytearray(template) + bytes([copy])
            frame[36:38] = peers[copy % 3].getsockname()[1].to_bytes(2, "big")
            port.send(memoryview(frame))
        for peer in peers:
            peer.setblocking(False)
            with pytest.raises(BlockingIOError):  # queued, not sent yet
                peer.recv(10)
            peer.setblocking(True)
            peer.settimeout(3)
        port.flush()
        for index, peer in enumerate(peers):
            assert [peer.recv(10) for _ in range(2)] == [bytes([index]), bytes([index + 3])]
        assert port.send_errors == 0
    finally:
        port.close()
        for peer in peers:
            peer.close()
        peer.close()


def _colliding_sockets() -> tuple[list[socket.socket], list[WorkerEndpoint]]:
    """Two loopback worker sockets whose (address, port) start their probe at the same slot of the native
    data plane's destination table (lhc_ina/udp_batch.c, sized for one sendmmsg: MAX_BATCH datagrams)."""
    from lhc_ina import _udp
    from lhc_ina.udp import MAX_BATCH

    sender = _udp.Sender(c.UDP_GSO_SEGMENTS, c.UDP_GSO_REFUSALS, c.UDP_GSO_BYTES, capacity=MAX_BATCH)
    by_home: dict[int, socket.socket] = {}
    for port in RNG.permutation(np.arange(20000, 60000)).tolist():
        home = sender.home(socket.inet_aton("127.0.0.1") + port.to_bytes(2, "big"))
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            sock.close()
            continue
        if home not in by_home:
            by_home[home] = sock
            continue
        socks = [by_home.pop(home), sock]
        for other in by_home.values():
            other.close()
        endpoints = []
        for rank, s in enumerate(socks):
            s.settimeout(3)
            endpoints.append(WorkerEndpoint(rank, "127.0.0.1", s.getsockname()[1], "02:00:00:00:00:01", 1))
        return socks, endpoints
    raise AssertionError("no two free ports share a home slot")


def test_workers_whose_addresses_collide_in_the_send_table_get_every_result(switch):
    """Issue 30's lost copies: two workers whose (address, port) share a home slot of the GSO destination
    table; the native data plane lost rank 1's RESULT from the second round on."""
    socks, workers = _colliding_sockets()
    job = make_job(4, 2, workers, slot_count=8, epoch=3)
    switch.stub.Write(p4v1.WriteRequest(device_id=1, updates=job_updates(INDEX, job)))
    for p in range(12):
        round_trip(switch, socks, job, p)
    for sock in socks:
        sock.close()


def test_a_rack_of_32_workers_aggregates_exactly(switch):
    """MAX_WORKERS ranks, one bit each: the full bitmap is all 32 bits (no 1 << 32 overflow anywhere)."""
    socks, workers = worker_sockets(c.MAX_WORKERS)
    job = make_job(5, 1, workers, slot_count=16, epoch=4)
    switch.stub.Write(p4v1.WriteRequest(device_id=1, updates=job_updates(INDEX, job)))
    for p in range(40):
        round_trip(switch, socks, job, p)
    assert switch.counters()[1, c.Stat.RESULT] == 40
    for sock in socks:
        sock.close()


def test_a_tenants_unroutable_replica_costs_none_of_another_tenants_results(switch):
    """Issue 39: job A has a result replica at 10.9.9.9, which the switch's port (bound to a loopback
    address) cannot send to: the kernel answers EINVAL. Job B shares the port. All of both jobs' DATA is
    in flight at once, so A's refused copies share flushes (and GSO runs) with B's results: B loses none,
    A's reachable rank gets every result, and the switch counts A's losses as EINVAL drops of port 1."""
    a_socks, a_workers = worker_sockets(1)
    unroutable = WorkerEndpoint(1, "10.9.9.9", 40000, "02:00:00:00:00:02", 1)
    job_a = make_job(7, 1, [*a_workers, unroutable], slot_count=16, epoch=2, fan_in=1)
    b_socks, b_workers = worker_sockets(2)
    job_b = make_job(8, 2, b_workers, slot_base=16, slot_count=16, epoch=5)
    for job in (job_a, job_b):
        switch.stub.Write(p4v1.WriteRequest(device_id=1, updates=job_updates(INDEX, job)))
    rounds = 80
    words = np.arange(c.LANES, dtype=np.uint32)
    for p in range(rounds):
        a_socks[0].sendto(data_packet(job_a, 0, words, **position(job_a, p)), switch.address)
        for rank, sock in enumerate(b_socks):
            sock.sendto(data_packet(job_b, rank, words, **position(job_b, p)), switch.address)
    for sock in (*a_socks, *b_socks):
        seqs = [wire.unpack_packet(sock.recvfrom(2048)[0])[0].seq for _ in range(rounds)]
        assert seqs == [position(job_b, p)["seq"] for p in range(rounds)]
    assert switch.counters()[1, c.Stat.RESULT] == rounds and switch.counters()[2, c.Stat.RESULT] == rounds
    code, err = switch.stop()
    assert code == 0, err
    assert f"port 1 counters: frames_in={3 * rounds} dropped_non_udp=0 send_errors={rounds} " \
           f"send_errors_by_errno=EINVAL:{rounds}" in err, err
    assert "raised, 0 socket errors" in err and "socket error (" not in err  # nothing raised: a drop alone
    for sock in (*a_socks, *b_socks):
        sock.close()
