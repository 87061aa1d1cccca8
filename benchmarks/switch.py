"""`lhc-bench switch`: packets and aggregated words per second through softswitch.

Cases (one JSON object each with ``--json``):

- ``udp``: softswitch started as its own process (``lhc-softswitch --udp``), configured over P4Runtime,
  and W simulated workers in this process (one UDP socket each) that keep ``--window`` aggregation rounds
  in flight over UDP on loopback. Every round is W DATA packets of ``LANES`` words; the switch
  multicasts each result to all W workers, and every copy is received and checked bit for bit against
  the expected sum. This is the number the project quotes: it includes the kernel's UDP path on both
  sides.
- ``pipeline``: the same DATA packets run through ``Pipeline.process`` in this process with no sockets,
  the ceiling the Python pipeline itself allows.

``packets_per_s`` counts DATA packets the switch consumed; ``words_per_s`` is that times ``LANES``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import time
from typing import Any

import grpc
import numpy as np
from p4.v1 import p4runtime_pb2 as p4v1
from p4.v1 import p4runtime_pb2_grpc

from lhc_ina import constants as c
from lhc_ina.jobs import JobLayout, WorkerEndpoint
from lhc_ina.p4info import P4InfoIndex
from lhc_ina.wire import FRAME_END, FRAME_LHC, FRAME_PAYLOAD, HEADER_OFFSETS, HEADER_SHIFTS
from softswitch.cli import READY
from softswitch.entities import Entities
from softswitch.pipeline import Pipeline
from softswitch.testing import data_frame, data_packet, job_updates, make_job

_SEQ = struct.Struct("!I")
_SLOT = struct.Struct("!H")
_BYTE0_AT, _SLOT_AT, _SEQ_AT = (HEADER_OFFSETS[name] for name in ("msg_type", "slot", "seq"))


def _byte0(ver: int) -> int:
    """lhc byte 0 of a DATA ADD packet of copy ``ver`` (flags 0)."""
    shift = HEADER_SHIFTS
    return c.MsgType.DATA << shift["msg_type"] | c.Op.ADD << shift["op"] | ver << shift["ver"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=8, help="simulated workers W (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="duration of each case (default %(default)s)")
    parser.add_argument("--window", type=int, default=128,
                        help="aggregation rounds in flight (default %(default)s); at most the slot count")
    parser.add_argument("--slots", type=int, default=256, help="the job's slot count (default %(default)s)")
    parser.add_argument("--case", choices=["udp", "pipeline", "all"], default="all")
    parser.add_argument("--json", action="store_true", help="print one JSON object per case")


def _job(slots: int, udp_ports: list[int]) -> JobLayout:
    """Rank r on 127.0.0.1:udp_ports[r], behind switch port 1."""
    members = [WorkerEndpoint(rank, "127.0.0.1", port, "02:00:7f:00:00:01", 1)
               for rank, port in enumerate(udp_ports)]
    return make_job(1, 1, members, slot_count=slots, epoch=7)


def _contributions(workers: int) -> tuple[list[np.ndarray], bytes]:
    rng = np.random.default_rng(1)
    values = [rng.integers(0, 1 << 32, c.LANES, dtype=np.uint64).astype(np.uint32) for _ in range(workers)]
    total = np.zeros(c.LANES, np.uint64)
    for value in values:
        total += value
    return values, (total % (1 << 32)).astype(">u4").tobytes()


class _Switch:
    """An ``lhc-softswitch`` process with one UDP port on loopback, configured for one job."""

    def __init__(self, slots: int, udp_ports: list[int]) -> None:
        line = self._start()
        fields = dict(part.split("=", 1) for part in line[len(READY):].split())
        self.grpc_addr = fields["grpc"]
        host_port = fields["ports"].split("@", 1)[1].removesuffix("/udp")
        self.udp_addr = (host_port.rsplit(":", 1)[0], int(host_port.rsplit(":", 1)[1]))
        self.job = _job(slots, udp_ports)
        self._configure()

    def _start(self) -> str:
        """Start the switch on the lhc UDP port of a random loopback address (so that concurrent runs
        do not collide); its ready line."""
        rng = np.random.default_rng()
        for _ in range(5):
            host = f"127.{rng.integers(1, 255)}.{rng.integers(0, 256)}.{rng.integers(1, 255)}"
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "softswitch.cli", "--grpc-addr", "127.0.0.1:0", "--udp",
                 f"1@{host}:{c.UDP_PORT_BASE}"], stdout=subprocess.PIPE, text=True,
            )
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline()
            if line.startswith(READY):
                return line
            self.proc.wait()
        raise RuntimeError("softswitch did not start (see its error above)")

    def _configure(self) -> None:
        index = P4InfoIndex.from_file()
        channel = grpc.insecure_channel(self.grpc_addr)
        stub = p4runtime_pb2_grpc.P4RuntimeStub(channel)
        request = p4v1.SetForwardingPipelineConfigRequest(
            device_id=1, action=p4v1.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT)
        request.config.p4info.CopyFrom(index.p4info)
        stub.SetForwardingPipelineConfig(request)  # no StreamChannel open: PI accepts it without election id
        stub.Write(p4v1.WriteRequest(device_id=1, updates=job_updates(index, self.job)))
        channel.close()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def _run_udp(workers: int, seconds: float, window: int, slots: int) -> dict[str, Any]:
    """W workers, one socket each, keep ``window`` rounds in flight; every result copy is checked."""
    socks = []
    for _ in range(workers):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(2.0)
        socks.append(sock)
    switch = _Switch(slots, [sock.getsockname()[1] for sock in socks])
    try:
        values, expected = _contributions(workers)
        packets = [bytearray(data_packet(switch.job, rank, values[rank])) for rank in range(workers)]
        window = min(window, slots)
        buffer = bytearray(2048)
        sent = completed = mismatched = 0
        deadline = time.perf_counter() + seconds
        start = time.perf_counter()
        senders = [sock.sendto for sock in socks]
        receivers = [sock.recv_into for sock in socks]
        target = switch.udp_addr
        while True:
            now_ok = time.perf_counter() < deadline
            while now_ok and sent - completed < window:
                slot, ver = sent % slots, (sent // slots) & 1  # packet p = sent: S = slot_count
                for packet, sendto in zip(packets, senders, strict=True):
                    packet[_BYTE0_AT] = _byte0(ver)
                    _SLOT.pack_into(packet, _SLOT_AT, slot)
                    _SEQ.pack_into(packet, _SEQ_AT, sent)
                    sendto(packet, target)
                sent += 1
            if completed == sent:
                break
            # The switch sends a result's copies one after another, so each rank's socket holds the
            # same sequence of results: one copy from each is one finished round.
            seqs = set()
            for recv_into in receivers:
                try:
                    size = recv_into(buffer)
                except TimeoutError:
                    raise RuntimeError(f"results stopped arriving: {sent - completed} rounds lost") from None
                if buffer[c.HEADER_BYTES:size] != expected:
                    mismatched += 1
                seqs.add(_SEQ.unpack_from(buffer, _SEQ_AT)[0])
            mismatched += len(seqs) - 1
            completed += 1
        elapsed = time.perf_counter() - start
    finally:
        switch.stop()
        for sock in socks:
            sock.close()
    data_packets = completed * workers
    return _result("udp", workers, data_packets, elapsed, rounds=completed, result_copies=completed * workers,
                   exact=mismatched == 0)


def _run_pipeline(workers: int, seconds: float, slots: int) -> dict[str, Any]:
    index = P4InfoIndex.from_file()
    pipeline = Pipeline(index)
    pipeline.configured = True
    job = _job(slots, [40000 + rank for rank in range(workers)])
    entities = Entities(pipeline, index.p4info)
    for up in job_updates(index, job):
        entities.write(up)
    values, expected = _contributions(workers)
    frames = [data_frame(job, rank, values[rank]) for rank in range(workers)]
    rx, process = pipeline.rx, pipeline.process
    emitted = [0]

    def emit(port: int, frame: memoryview) -> None:
        emitted[0] += 1

    rounds = 0
    deadline = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < deadline:
        for _ in range(100):
            slot, ver = rounds % slots, (rounds // slots) & 1  # packet p = rounds: S = slot_count
            for frame in frames:
                rx[: len(frame)] = frame
                rx[FRAME_LHC + _BYTE0_AT] = _byte0(ver)
                _SLOT.pack_into(rx, FRAME_LHC + _SLOT_AT, slot)
                _SEQ.pack_into(rx, FRAME_LHC + _SEQ_AT, rounds)
                process(len(frame), 1, emit)
            rounds += 1
    elapsed = time.perf_counter() - start
    exact = bytes(pipeline.rx[FRAME_PAYLOAD:FRAME_END]) == expected
    return _result("pipeline", workers, rounds * workers, elapsed, rounds=rounds, result_copies=emitted[0],
                   exact=exact)


def _result(case: str, workers: int, packets: int, elapsed: float, **extra: Any) -> dict[str, Any]:
    return {
        "suite": "switch", "case": case, "workers": workers, "lanes": c.LANES, "packets": packets,
        "seconds": round(elapsed, 3), "packets_per_s": round(packets / elapsed),
        "words_per_s": round(packets * c.LANES / elapsed), "cpus": os.cpu_count(), **extra,
    }


def run(args: argparse.Namespace) -> int:
    if args.workers < 1 or args.workers > c.MAX_WORKERS:
        print(f"lhc-bench switch: --workers must be 1..{c.MAX_WORKERS}", file=sys.stderr)
        return 2
    results = []
    if args.case in ("udp", "all"):
        results.append(_run_udp(args.workers, args.seconds, args.window, args.slots))
    if args.case in ("pipeline", "all"):
        results.append(_run_pipeline(args.workers, args.seconds, args.slots))
    for result in results:
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            print(f"{result['case']:>9}: W={result['workers']} {result['packets_per_s']:>9,} packets/s "
                  f"{result['words_per_s']:>12,} words/s  exact={result['exact']}")
    return 0 if all(r["exact"] for r in results) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
