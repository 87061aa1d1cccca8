"""`lhc-bench switch`: packets and aggregated words per second through softswitch, for each pipeline.

Cases (one JSON object per case and pipeline with ``--json``; the python row first, then the native one,
which carries ``native_over_python``: its packets_per_s over the python row's of the same case):

- ``udp``: softswitch started as its own process (``lhc-softswitch --udp --pipeline P``), configured
  over P4Runtime, and W simulated workers in this process that keep ``--window`` aggregation rounds in
  flight over UDP on loopback. Every round is W DATA packets of ``LANES`` words; the switch multicasts
  each result to all W workers, and every copy is received and checked bit for bit against the expected
  sum. The workers' DATA packets are built vectorized and leave each rank's own socket by UDP GSO (the
  switch admits a rank only from its UDP port); its results arrive on that socket (with UDP_GRO: a run
  the switch sent as one GSO message arrives as one buffer) and are checked datagram by datagram with
  numpy, so that the generator is not what bounds the figure (``switch_workers.py``). This is the number
  the project quotes: it includes the kernel's UDP path on both sides.
- ``pipeline``: the same DATA packets through the pipeline in this process with no sockets:
  ``Pipeline.process`` (python) or ``NativePipeline.inject`` (native, one Python call per frame).

``packets_per_s`` counts DATA packets the switch consumed; ``words_per_s`` is that times ``LANES``.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from p4.v1 import p4runtime_pb2 as p4v1
from p4.v1 import p4runtime_pb2_grpc

from benchmarks.switch_workers import BYTE0_AT, SEQ_AT, Results, Sender, data_packets
from lhc_ina import constants as c
from lhc_ina.jobs import JobLayout, WorkerEndpoint
from lhc_ina.p4info import P4InfoIndex
from lhc_ina.udp import batch_io
from lhc_ina.wire import FRAME_END, FRAME_LHC, FRAME_PAYLOAD, HEADER_OFFSETS, HEADER_SHIFTS
from lhc_launch.switch_job import data_frame, job_updates, make_job
from softswitch.cli import READY
from softswitch.entity_store import Entities
from softswitch.native import NativePipeline, native_available
from softswitch.pipeline import Pipeline
from softswitch.receive_loop import NATIVE_BURST

_SEQ = struct.Struct("!I")
_SLOT = struct.Struct("!H")
_SLOT_AT = HEADER_OFFSETS["slot"]


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
    parser.add_argument("--pipeline", choices=["python", "native", "both"], default="both",
                        help="which pipelines to run (default %(default)s; native needs the extension built)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per case")


def _job(slots: int, udp_ports: list[int]) -> JobLayout:
    """Rank r on 127.0.0.1:udp_ports[r], behind switch port 1."""
    members = [WorkerEndpoint(rank, "127.0.0.1", port, "02:00:7f:00:00:01", 1)
               for rank, port in enumerate(udp_ports)]
    return make_job(1, 1, members, slot_count=slots, epoch=7)


def _contributions(workers: int) -> tuple[np.ndarray, bytes]:
    rng = np.random.default_rng(1)
    values = rng.integers(0, 1 << 32, (workers, c.LANES), dtype=np.uint64)
    return values.astype(np.uint32), (values.sum(axis=0) % (1 << 32)).astype(">u4").tobytes()


class _Switch:
    """An ``lhc-softswitch`` process with one UDP port on loopback, configured for one job."""

    def __init__(self, slots: int, udp_ports: list[int], pipeline: str) -> None:
        line = self._start(pipeline)
        fields = dict(part.split("=", 1) for part in line[len(READY):].split())
        self.grpc_addr = fields["grpc"]
        host_port = fields["ports"].split("@", 1)[1].removesuffix("/udp")
        self.udp_addr = (host_port.rsplit(":", 1)[0], int(host_port.rsplit(":", 1)[1]))
        self.job = _job(slots, udp_ports)
        self._configure()

    def _start(self, pipeline: str) -> str:
        """Start the switch on the lhc UDP port of a random loopback address (so that concurrent runs
        do not collide); its ready line."""
        rng = np.random.default_rng()
        for _ in range(5):
            host = f"127.{rng.integers(1, 255)}.{rng.integers(0, 256)}.{rng.integers(1, 255)}"
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "softswitch.cli", "--grpc-addr", "127.0.0.1:0", "--udp",
                 f"1@{host}:{c.UDP_PORT_BASE}", "--pipeline", pipeline], stdout=subprocess.PIPE, text=True,
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

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the switch process has used so far (Linux /proc)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def _run_udp(workers: int, seconds: float, window: int, slots: int, pipeline: str) -> dict[str, Any]:
    """W ranks keep ``window`` rounds in flight; every result copy is checked. Each rank's DATA packets
    leave its own socket (the workers table keys on the UDP source port too) and its results arrive there,
    drained with recvmmsg: the generator batches as the switch does, so that the switch is what is
    measured."""
    io = batch_io()
    sender = Sender(io)
    receivers = Results.open(workers)
    switch = _Switch(slots, [sock.getsockname()[1] for sock in receivers], pipeline)
    poller = select.poll()
    for sock in receivers:
        poller.register(sock, select.POLLIN)
    try:
        values, expected = _contributions(workers)
        results = Results(workers, expected)
        window = min(window, slots)
        refill = max(window // 4, 1)  # top the window up in batches, not round by round
        sent = completed = 0
        cpu_before = switch.cpu_seconds()
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            if time.perf_counter() < deadline and window - (sent - completed) >= refill:
                rounds = window - (sent - completed)
                runs = data_packets(switch.job, values, sent, rounds)
                for sock, run in zip(receivers, runs, strict=True):
                    sender.send(sock, run, switch.udp_addr)
                sent += rounds
            if completed == sent:
                break
            drained = sum(results.drain(rank, sock) for rank, sock in enumerate(receivers))
            if not drained and not poller.poll(2000):
                raise RuntimeError(f"results stopped arriving: {sent - completed} rounds lost")
            completed = min(results.counts)
        elapsed = time.perf_counter() - start
        switch_cpu = switch.cpu_seconds() - cpu_before
    finally:
        switch.stop()
        for sock in receivers:
            sock.close()
    exact = results.mismatched == 0 and results.every_round_once_to_every_rank(completed)
    # The switch's CPU time per packet says what the switch costs whatever else the machine runs.
    return _result("udp", pipeline, workers, completed * workers, elapsed, rounds=completed,
                   result_copies=sum(results.counts), exact=exact, switch_cpu_s=round(switch_cpu, 2),
                   switch_cpu_us_per_packet=round(switch_cpu / max(completed * workers, 1) * 1e6, 2))


def _run_pipeline(workers: int, seconds: float, slots: int, kind: str) -> dict[str, Any]:
    """The DATA packets of rounds 0, 1, 2, ... through the pipeline in this process, no sockets."""
    index = P4InfoIndex.from_file()
    pipeline = Pipeline(index)
    pipeline.configured = True
    job = _job(slots, [40000 + rank for rank in range(workers)])
    entities = Entities(pipeline, index.p4info)
    for up in job_updates(index, job):
        entities.write(up)
    values, expected = _contributions(workers)
    frames = [bytearray(data_frame(job, rank, values[rank])) for rank in range(workers)]
    emitted = [0]
    last = bytearray()

    def emit(port: int, frame: memoryview) -> None:
        emitted[0] += 1
        last[:] = frame

    if kind == "native":
        inject = NativePipeline(pipeline, NATIVE_BURST).inject

        def process(frame: bytearray) -> None:
            out = inject(frame, 1)
            for port, copy in out:
                emit(port, memoryview(copy))
    else:
        rx, process_python = pipeline.rx, pipeline.process

        def process(frame: bytearray) -> None:
            rx[: len(frame)] = frame
            process_python(len(frame), 1, emit)

    rounds = 0
    deadline = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < deadline:
        for _ in range(100):
            slot, ver = rounds % slots, (rounds // slots) & 1  # packet p = rounds: S = slot_count
            for frame in frames:
                frame[FRAME_LHC + BYTE0_AT] = _byte0(ver)
                _SLOT.pack_into(frame, FRAME_LHC + _SLOT_AT, slot)
                _SEQ.pack_into(frame, FRAME_LHC + SEQ_AT, rounds)
                process(frame)
            rounds += 1
    elapsed = time.perf_counter() - start
    exact = bytes(last[FRAME_PAYLOAD:FRAME_END]) == expected
    return _result("pipeline", kind, workers, rounds * workers, elapsed, rounds=rounds,
                   result_copies=emitted[0], exact=exact)


def _result(case: str, pipeline: str, workers: int, packets: int, elapsed: float,
            **extra: Any) -> dict[str, Any]:
    return {
        "suite": "switch", "case": case, "pipeline": pipeline, "workers": workers, "lanes": c.LANES,
        "packets": packets, "seconds": round(elapsed, 3), "packets_per_s": round(packets / elapsed),
        "words_per_s": round(packets * c.LANES / elapsed), "cpus": os.cpu_count(), **extra,
    }


def run(args: argparse.Namespace) -> int:
    if args.workers < 1 or args.workers > c.MAX_WORKERS:
        print(f"lhc-bench switch: --workers must be 1..{c.MAX_WORKERS}", file=sys.stderr)
        return 2
    pipelines = ["python", "native"] if args.pipeline == "both" else [args.pipeline]
    if "native" in pipelines and not native_available():
        if args.pipeline == "native":
            print("lhc-bench switch: the native pipeline (softswitch/_dataplane.c) is not built",
                  file=sys.stderr)
            return 2
        print("lhc-bench switch: the native pipeline is not built: python rows only", file=sys.stderr)
        pipelines.remove("native")
    cases = {
        "udp": lambda kind: _run_udp(args.workers, args.seconds, args.window, args.slots, kind),
        "pipeline": lambda kind: _run_pipeline(args.workers, args.seconds, args.slots, kind),
    }
    results = []
    for case, measure in cases.items():
        if args.case not in (case, "all"):
            continue
        rows = {kind: measure(kind) for kind in pipelines}
        if "python" in rows and "native" in rows:
            rows["native"]["native_over_python"] = round(
                rows["native"]["packets_per_s"] / rows["python"]["packets_per_s"], 2)
        results.extend(rows.values())
        for result in rows.values():
            if args.json:
                print(json.dumps(result), flush=True)
            else:
                ratio = result.get("native_over_python")
                print(f"{result['case']:>9} {result['pipeline']:>6}: W={result['workers']} "
                      f"{result['packets_per_s']:>9,} packets/s {result['words_per_s']:>12,} words/s  "
                      f"exact={result['exact']}" + (f"  {ratio}x python" if ratio else ""), flush=True)
    return 0 if all(r["exact"] for r in results) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
