"""``lhc-softswitch --pcap``: a short job through softswitch (controller, agents, workers that ask twice,
and hostile datagrams), captured by each pipeline and read back by tshark with the generated dissector.

The capture must hold every datagram the switch received and sent, on its port and in its direction, and
tshark must show every field of every one as ``lhc_ina.wire`` parses it (tests/harness/tshark.py)."""

from __future__ import annotations

import re
import socket
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from lhc_ina import constants as c
from lhc_ina import wire
from lhc_ina.wire import LhcHeader, pack_packet
from lhc_launch.processes import ControllerProcess, SoftswitchProcess
from softswitch.capture import INBOUND, OUTBOUND
from softswitch.native import native_available
from tests.harness.agents import assert_exact, run_agents, sparse_inputs
from tests.harness.controller import Worker, aggregate_once
from tests.harness.pcapng import Frame, read_frames
from tests.harness.tshark import check_lhc, run_tshark

PIPELINES = [pytest.param("python"), pytest.param("native", marks=pytest.mark.skipif(
    not native_available(), reason="the native pipeline (softswitch/_dataplane.c) is not built"))]


def _hostile(job_id: int, epoch: int) -> list[bytes]:
    """Datagrams the switch must drop, one of each kind the dissector marks."""
    full = pack_packet(LhcHeader(job_id=job_id, epoch=epoch, worker_id=0), np.arange(c.LANES))
    unknown = bytearray(full)
    unknown[0] = 9 << 4
    return [
        full[:7],  # truncated header
        bytes(unknown),  # an unassigned message type
        full[: c.HEADER_BYTES + 10 * c.LANE_BYTES + 2],  # short payload
        pack_packet(LhcHeader(msg_type=c.MsgType.CONTROL, job_id=job_id, epoch=epoch), np.zeros(c.LANES)),
        pack_packet(LhcHeader(msg_type=c.MsgType.RESULT, op=c.Op.OR, job_id=job_id, bitmap=0b101),
                    np.full(c.LANES, 0xF0F0F0F0)),  # a result sent to the switch, rank 1 missing
        pack_packet(LhcHeader(flags=1, job_id=job_id, epoch=epoch), np.arange(c.LANES) - 32),
        b"",  # an empty datagram: plain UDP to Wireshark (it calls no dissector for no payload)
    ]


def _run_job(pipeline: str, capture: Path, state: Path) -> tuple[list[bytes], str]:
    """The job, captured; the hostile datagrams it sent and the switch's log."""
    with SoftswitchProcess(pipeline=pipeline, args=("--pcap", str(capture))) as switch, \
            ControllerProcess(switch, state) as controller:
        inputs = sparse_inputs(2, 3000, 0.01, torch.float32, seed=3)
        results = run_agents(controller, 2, lambda agent: agent.allreduce(inputs[agent.rank], mode="sketch"))
        assert_exact(results, inputs)
        controller.client.create_job("twice", workers=2)
        workers = [Worker() for _ in range(2)]
        for worker in workers:
            worker.joined = controller.client.join("twice", ip="127.0.0.1", udp_port=worker.port)
        rng = np.random.default_rng(5)
        aggregate_once(workers, slot=0, seq=0, rng=rng)
        workers[1].send(np.zeros(c.LANES, np.uint32), slot=0, seq=0)  # asks again: RESULT_RETX
        header, _ = workers[1].receive()
        assert header.msg_type == c.MsgType.RESULT_RETX
        hostile = _hostile(workers[0].joined.job_id, workers[0].joined.epoch)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as attacker:
            for datagram in hostile:
                attacker.sendto(datagram, (switch.host, switch.udp_port))
        aggregate_once(workers, slot=1, seq=1, rng=rng)  # after the hostile ones in the switch's queue
        for worker in workers:
            worker.close()
        interface = f"{switch.switch_port}@{switch.host}:{switch.udp_port}/udp"
    assert f"captured {len(read_frames(capture))} frames in {capture}" in switch.log()
    assert {frame.interface for frame in read_frames(capture)} == {interface}
    return hostile, switch.log()


def _udp(frame: Frame) -> tuple[int, int, bytes]:
    """Source port, destination port and payload of a capture's IPv4/UDP frame (headers valid)."""
    assert struct.unpack_from("!H", frame.data, wire.ETH_TYPE)[0] == c.ETHERTYPE_IPV4
    assert frame.data[wire.FRAME_IPV4] == wire.IPV4_VERSION_IHL
    assert frame.data[wire.IP_PROTO] == c.IP_PROTO_UDP
    ip = frame.data[wire.FRAME_IPV4 : wire.FRAME_UDP]
    assert wire.ipv4_checksum(ip[:10] + b"\0\0" + ip[12:]) == struct.unpack_from("!H", ip, 10)[0]
    sport, dport, length = struct.unpack_from("!HHH", frame.data, wire.FRAME_UDP)
    assert length == len(frame.data) - wire.FRAME_UDP
    return sport, dport, frame.data[wire.FRAME_LHC :]


@pytest.mark.tshark
@pytest.mark.timeout(240)
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_captured_job_reads_back_field_by_field(pipeline: str, tmp_path: Path) -> None:
    capture = tmp_path / f"{pipeline}.pcapng"
    hostile, log = _run_job(pipeline, capture, tmp_path / "state")
    frames = read_frames(capture)
    layers = run_tshark(capture)
    assert len(layers) == len(frames)
    seen: Counter[str] = Counter()
    inbound_datagrams = []
    copies: Counter[tuple[int, ...]] = Counter()  # RESULT copies per round, and their destinations
    destinations: dict[tuple[int, ...], set[int]] = {}
    for frame, layer in zip(frames, layers, strict=True):
        sport, dport, datagram = _udp(frame)
        assert frame.direction in (INBOUND, OUTBOUND)
        shown = layer["frame"][0]["frame.interface_id_tree"][0]
        assert shown["frame.interface_name"] == [frame.interface]
        assert int(layer["frame"][0]["frame.packet_flags"][0], 16) & 3 == frame.direction
        lhc_port = dport if frame.direction == INBOUND else sport
        assert lhc_port & c.UDP_PORT_MASK == c.UDP_PORT_BASE
        if frame.direction == INBOUND:
            inbound_datagrams.append(datagram)
        if not datagram:
            assert "lhc" not in layer and "udp" in layer
            seen["empty"] += 1
            continue
        kind = check_lhc(datagram, layer["lhc"][0])
        seen[f"{'in' if frame.direction == INBOUND else 'out'} {kind}"] += 1
        if frame.direction == OUTBOUND and kind.startswith("RESULT/"):
            header = wire.LhcHeader.unpack(datagram)
            round_ = (header.job_id, header.epoch, header.slot, header.ver, header.seq)
            copies[round_] += 1
            destinations.setdefault(round_, set()).add(dport)
    # Every frame the switch received is in the capture; every round's result left once per worker.
    assert f"stopping: {len(inbound_datagrams)} frames received, 0 raised" in log
    assert copies and set(copies.values()) == {2} and all(len(d) == 2 for d in destinations.values())
    # Every hostile datagram went in, in the order sent, and nothing of the switch's own output came in.
    positions = [inbound_datagrams.index(datagram) for datagram in hostile]
    assert positions == sorted(positions)
    assert not any(wire.LhcHeader.unpack(d).msg_type == c.MsgType.RESULT for d in inbound_datagrams
                   if len(d) >= c.HEADER_BYTES and d not in hostile)
    wanted = {"in DATA/ADD", "in DATA/OR", "out RESULT/ADD", "out RESULT/OR", "out RESULT_RETX/ADD",
              "in CONTROL/ADD", "in RESULT/OR", "in unknown type", "in truncated header", "in short payload",
              "in reserved flags", "empty"}
    assert wanted <= set(seen), seen
    # The one asked for by hand; the agents' own job may add more when a slow machine fires their timers.
    assert seen["out RESULT_RETX/ADD"] >= 1
    # The W preference: 2-worker results, read as W = 3, lack rank 2 (check_lhc knows the rule).
    for frame, layer in zip(frames, run_tshark(capture, "-o", "lhc.workers:3"), strict=True):
        datagram = _udp(frame)[2]
        if datagram:
            check_lhc(datagram, layer["lhc"][0], workers=3)


def test_the_mininet_capture_filter_is_the_lhc_port_range() -> None:
    """mininet/topo.py runs under the system Python without the project: its copy of the range is checked
    here."""
    text = (Path(__file__).resolve().parent.parent / "mininet" / "topo.py").read_text()
    base = int(re.search(r"^LHC_UDP_PORT = (\d+)", text, re.M).group(1))
    count = int(re.search(r"^LHC_UDP_PORT_COUNT = (\d+)", text, re.M).group(1))
    assert (base, count) == (c.UDP_PORT_BASE, c.UDP_PORT_COUNT)
    assert 'f"udp portrange {LHC_UDP_PORT}-{LHC_UDP_PORT + LHC_UDP_PORT_COUNT - 1}"' in text


def test_a_capture_file_that_cannot_be_written_is_refused_at_start(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder" / "x.pcapng"
    done = subprocess.run([sys.executable, "-m", "softswitch.cli", "--grpc-addr", "127.0.0.1:0", "--udp",
                           "127.0.0.1:0", "--pcap", str(missing)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert f"lhc-softswitch: --pcap {missing}: No such file or directory" in done.stderr
    assert done.stdout == ""  # never ready
