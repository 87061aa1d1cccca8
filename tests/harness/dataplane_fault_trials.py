"""Both data planes over real sockets under the socket-fault shim (run by tests/test_softswitch_native.py as
``python -m tests.harness.dataplane_fault_trials VARIANT [--raw SWITCH_END --sniff HOST_END]`` with the
shim preloaded, tests/harness/socket_faults.py). Prints, per pipeline, the port counters, the frames
that raised, the socket errors and what each receiver got, as JSON, for the test to compare.

Variants:

- ``destinations``: job A's results go to its rank 0 and to one replica per per-destination errno (EINVAL,
  EMSGSIZE, ENOBUFS, ECONNREFUSED, EAGAIN, EACCES, EPERM, EHOSTUNREACH), and with ``--raw`` to a rank
  behind a raw port and one there whose interface "went away" (ENXIO); job B shares UDP port 1. Both
  jobs' DATA waits in the port when the loop starts, so the native engine's bursts overflow its send
  queue and flush mid-burst (``emit_frame``).
- ``fatal``: a job of 20 ranks whose rank 0's address makes the port's socket fail for good (EBADF, as a
  closed socket does), in one burst of 64 frames: 1280 copies, so the native engine's mid-burst flush
  meets the error.

Pipelines: ``native`` (softswitch._dataplane), ``python`` (Pipeline.process and the ports, over
lhc_ina._udp) and ``python-io`` (the same with lhc_ina.udp.PythonIO, one sendto per datagram).
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import select
import socket
import threading
import time

import numpy as np

from lhc_ina import constants as c
from lhc_ina import wire
from lhc_ina.jobs import WorkerEndpoint
from lhc_ina.p4info import P4InfoIndex
from lhc_ina.udp import PythonIO
from lhc_launch.switch_job import data_packet, job_updates, make_job
from softswitch.entity_store import Entities
from softswitch.native import NativePipeline
from softswitch.pipeline import Pipeline
from softswitch.ports import PortSpec, RawPort, UdpPort
from softswitch.receive_loop import NATIVE_BURST, DataPlane
from tests.harness.socket_faults import fault_address
from tests.harness.switch_jobs import loopback_sockets, position

INDEX = P4InfoIndex.from_file()
UDP_ERRORS = (errno.EINVAL, errno.EMSGSIZE, errno.ENOBUFS, errno.ECONNREFUSED, errno.EAGAIN, errno.EACCES,
              errno.EPERM, errno.EHOSTUNREACH)
#: Where the raw port's reachable rank lives (the sniffer on the pair's other end reads its frames).
RAW_RANK = WorkerEndpoint(0, "10.77.0.1", 40000, "02:00:00:77:00:01", 2)
ROUNDS = {"destinations": 150, "fatal": 64}


def _member(rank: int, sock: socket.socket) -> WorkerEndpoint:
    return WorkerEndpoint(rank, "127.0.0.1", sock.getsockname()[1], "02:00:00:00:00:01", 1)


class Run:
    """One pipeline's run of a variant: its switch, ports, jobs and receivers."""

    def __init__(self, pipeline: str, variant: str, raw: str | None) -> None:
        self.pipeline = Pipeline(INDEX)
        self.pipeline.configured = True
        host = f"127.{np.random.default_rng().integers(1, 254)}.{np.random.default_rng().integers(1, 254)}.9"
        udp = UdpPort(PortSpec(1, host=host, udp_port=0), self.pipeline.rx)
        if pipeline == "python-io":
            udp._io = PythonIO()
        self.ports = [udp] + ([RawPort(PortSpec(2, iface=raw), self.pipeline.rx)] if raw else [])
        native = NativePipeline(self.pipeline, NATIVE_BURST) if pipeline == "native" else None
        self.dataplane = DataPlane(self.pipeline, self.ports, threading.Lock(), native=native,
                                   on_failure=lambda error: None)
        self.address = udp.address
        self.receivers: dict[str, socket.socket] = {}
        self.senders: list[tuple[object, socket.socket]] = []  # (job, its rank 0's socket)
        getattr(self, variant)(raw is not None)

    def _job(self, job_id: int, index: int, members: list[WorkerEndpoint], sender: socket.socket):
        """A job of ``members`` whose rank 0 alone completes a round (``sender`` sends its DATA)."""
        job = make_job(job_id, index, members, slot_base=16 * index, slot_count=16, epoch=3, fan_in=1)
        entities = Entities(self.pipeline, INDEX.p4info)
        for update in job_updates(INDEX, job):
            entities.write(update)
        self.senders.append((job, sender))

    def destinations(self, raw: bool) -> None:
        a0, *b = loopback_sockets(4)
        self.receivers = {"A0": a0, "B0": b[0], "B1": b[1], "B2": b[2]}
        a = [_member(0, a0)] + [WorkerEndpoint(1 + k, fault_address(e), 40000 + k, "02:00:00:00:00:02", 1)
                                for k, e in enumerate(UDP_ERRORS)]
        if raw:
            a.append(WorkerEndpoint(len(a), RAW_RANK.ip, RAW_RANK.udp_port, RAW_RANK.mac, 2))
            a.append(WorkerEndpoint(len(a), fault_address(errno.ENXIO), 40000, RAW_RANK.mac, 2))
        self._job(21, 1, a, a0)
        self._job(22, 2, [_member(r, sock) for r, sock in enumerate(b)], b[0])

    def fatal(self, raw: bool) -> None:
        doomed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        doomed.bind((fault_address(errno.EBADF, stays=True), 0))
        ranks = loopback_sockets(19)
        self.receivers = {f"R{r + 1}": sock for r, sock in enumerate(ranks)}
        members = [WorkerEndpoint(0, *doomed.getsockname(), "02:00:00:00:00:01", 1)]
        self._job(23, 1, members + [_member(r + 1, sock) for r, sock in enumerate(ranks)], doomed)

    def run(self, rounds: int, sniff: str | None) -> dict:
        sniffer = None
        if sniff is not None:
            sniffer = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
            sniffer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
            sniffer.bind((sniff, 0))
        words = np.arange(c.LANES, dtype=np.uint32)
        for p in range(rounds):
            for job, sender in self.senders:
                sender.sendto(data_packet(job, 0, words, **position(job, p)), self.address)
        self.dataplane.start()
        deadline = time.monotonic() + 30
        while self.dataplane.frames_in < rounds * len(self.senders) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.dataplane.stop()  # the burst under way ends, flush included, before it returns
        counters = self.dataplane.port_counters()
        # loopback delivers within the send call; a veth's frames cross in the kernel's own time
        got = {role: _drain(sock, lambda data: data, 0.0) for role, sock in self.receivers.items()}
        if sniffer is not None:
            got["raw"] = _drain(sniffer, _raw_result, 0.5)
        return {"counters": {str(port): value for port, value in counters.items()},
                "errors": self.dataplane.errors, "socket_errors": self.dataplane.socket_errors,
                "delivered": {role: _summary(frames) for role, frames in got.items()}}


def _summary(frames: list[bytes]) -> dict:
    """What a receiver got: how many results, their seqs in arrival order, and a digest of their bytes."""
    return {"count": len(frames), "seqs": [wire.unpack_packet(f)[0].seq for f in frames],
            "digest": hashlib.sha256(b"".join(frames)).hexdigest()}


def _raw_result(frame: bytes) -> bytes | None:
    """A frame the switch sent to the raw port's reachable rank: its lhc bytes (None for any other)."""
    if len(frame) < wire.FRAME_LHC or frame[wire.IP_DST] != socket.inet_aton(RAW_RANK.ip):
        return None
    return frame[wire.FRAME_LHC:]


def _drain(sock: socket.socket, keep, quiet_s: float) -> list[bytes]:
    """What arrives in ``sock`` until it stays quiet for ``quiet_s``, as ``keep`` maps it (None: skipped)."""
    out = []
    while select.select([sock], [], [], quiet_s)[0]:
        kept = keep(sock.recv(4096))
        if kept is not None:
            out.append(kept)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("variant", choices=sorted(ROUNDS))
    parser.add_argument("--raw", help="the switch's end of a veth pair: port 2, a raw port")
    parser.add_argument("--sniff", help="the pair's other end, where the raw port's frames arrive")
    args = parser.parse_args()
    out = {pipeline: Run(pipeline, args.variant, args.raw).run(ROUNDS[args.variant], args.sniff)
           for pipeline in ("native", "python", "python-io")}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
