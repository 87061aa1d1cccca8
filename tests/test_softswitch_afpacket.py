"""softswitch on real interfaces (AF_PACKET on veth pairs, root): frames in and out, and the switch never
re-reads what it sent itself."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from p4.v1 import p4runtime_pb2 as p4v1
from p4.v1 import p4runtime_pb2_grpc

from lhc_ina import constants as c
from lhc_ina import wire
from lhc_ina.p4info import P4InfoIndex
from lhc_launch.switch_job import data_frame, job_updates, make_job
from ptf_tests import veth as veth_pairs
from softswitch.capture import INBOUND, OUTBOUND
from softswitch.cli import READY
from softswitch.native import native_available
from tests.harness.pcapng import read_frames

pytestmark = pytest.mark.root
INDEX = P4InfoIndex.from_file()


@pytest.fixture
def veths() -> Iterator[list[tuple[str, str]]]:
    """Two quiet veth pairs (host end, switch end), made by the PTF harness's pyroute2 helper."""
    pairs = veth_pairs.pair_names(range(2), prefix=f"ss{os.getpid() % 10000}")
    veth_pairs.create(pairs)
    try:
        yield [(pair.ptf_end, pair.switch_end) for pair in pairs]
    finally:
        veth_pairs.delete(pairs)


def _raw(iface: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    sock.bind((iface, 0))
    return sock


def _frames(sock: socket.socket, seconds: float) -> list[bytes]:
    """Frames that arrived on ``sock`` (not ones it sent) within ``seconds``."""
    out, deadline = [], time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([sock], [], [], left)[0]:
            break
        data, address = sock.recvfrom(65536)
        if address[2] != socket.PACKET_OUTGOING:
            out.append(data)
    return out


@pytest.mark.parametrize("pipeline", [pytest.param("python"), pytest.param("native", marks=pytest.mark.skipif(
    not native_available(), reason="the native pipeline is not built"))])
def test_lhc_over_veths_and_no_reread_of_own_output(veths, pipeline: str, tmp_path: Path):
    """Also --pcap on AF_PACKET ports: the frames as they were on the wire, each on its port and way."""
    (h1, s1), (h2, s2) = veths
    capture = tmp_path / "switch.pcapng"
    proc = subprocess.Popen(
        [sys.executable, "-m", "softswitch.cli", "--grpc-addr", "127.0.0.1:0", "--port", f"1@{s1}",
         "--port", f"2@{s2}", "--pipeline", pipeline, "--pcap", str(capture)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith(READY) and f"ports=1@{s1},2@{s2}" in line, proc.stderr.read()
        grpc_addr = dict(p.split("=", 1) for p in line[len(READY):].split())["grpc"]
        channel = grpc.insecure_channel(grpc_addr)
        stub = p4runtime_pb2_grpc.P4RuntimeStub(channel)
        request = p4v1.SetForwardingPipelineConfigRequest(
            device_id=1, action=p4v1.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT)
        request.config.p4info.CopyFrom(INDEX.p4info)
        stub.SetForwardingPipelineConfig(request)
        job = make_job(1, 1, 2)  # rank 0 behind port 1, rank 1 behind port 2
        stub.Write(p4v1.WriteRequest(device_id=1, updates=job_updates(INDEX, job)))
        in1, in2 = _raw(h1), _raw(h2)
        a, b = np.arange(c.LANES, dtype=np.uint32), np.full(c.LANES, 7, np.uint32)
        sent = [data_frame(job, 0, a), data_frame(job, 1, b)]
        in1.send(sent[0])
        in2.send(sent[1])
        got1, got2 = _frames(in1, 1.0), _frames(in2, 1.0)
        assert len(got1) == len(got2) == 1
        for frame, worker in ((got1[0], job.workers[0]), (got2[0], job.workers[1])):
            header, words = wire.unpack_packet(frame[42:42 + c.HEADER_BYTES + c.PAYLOAD_BYTES])
            assert header.msg_type == c.MsgType.RESULT and frame[30:34] == wire.ip_bytes(worker.ip)
            np.testing.assert_array_equal(words, a + b)
        counters = p4v1.Entity()
        counters.counter_entry.counter_id = INDEX.counter("LhcIngress.lhc_stats").id
        cells = [e.counter_entry.data.packet_count for r in stub.Read(p4v1.ReadRequest(
            device_id=1, entities=[counters])) for e in r.entities]
        # Row 0 stays empty: the switch never took its own RESULT copies for input (they would be BAD_TYPE).
        assert sum(cells[: c.NUM_STATS]) == 0 and cells[c.NUM_STATS:c.NUM_STATS + 2] == [1, 1]
        channel.close()
        in1.close()
        in2.close()
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    recorded = [(frame.interface, frame.direction, frame.data) for frame in read_frames(capture)]
    assert sorted(recorded[:2]) == [(f"1@{s1}", INBOUND, sent[0]), (f"2@{s2}", INBOUND, sent[1])]
    assert recorded[2:] == [(f"1@{s1}", OUTBOUND, got1[0]), (f"2@{s2}", OUTBOUND, got2[0])]
