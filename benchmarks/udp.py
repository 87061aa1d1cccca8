"""`lhc-bench udp`: datagrams per second through the worker's Channel on loopback, batched or not.

Three ways to move the same datagrams, each through a ``Channel``:

- ``per-datagram``: one call and one system call per datagram (the stream before batching);
- ``python-batch``: a batch per call, one system call per datagram (the fallback without ``_udp.c``);
- ``native-batch``: a batch per call, one sendmmsg / recvmmsg per batch.

``send`` pushes datagrams at a socket that never reads (the sender's cost alone: the kernel drops what
the full receiver cannot hold). ``echo`` sends a batch to an echo process, which returns every datagram
with the native layer whatever is measured, and waits for the whole batch back before the next: one
round trip per batch, as the stream's window does. One JSON object per (test, way).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import select
import socket
import time
from typing import Any

from benchmarks.aggregate import _bounded
from benchmarks.cli import comma_choices
from host_agent.transport.channel import Channel
from host_agent.transport.packets import PACKET_BYTES
from lhc_ina.udp import MAX_BATCH, ReceiveBatch, native_udp_available

WAYS = ("per-datagram", "python-batch", "native-batch")
TESTS = ("send", "echo")
LOOPBACK = ("127.0.0.1", 0)
#: An echo round that has not come back whole after this long counts its missing datagrams as lost.
ROUND_TIMEOUT_S = 1.0


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= 60:
        raise argparse.ArgumentTypeError(f"must be in (0, 60], got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=_seconds, default=2.0, help="per (test, way) (default %(default)s)")
    parser.add_argument("--size", type=_bounded(1, 65507), default=PACKET_BYTES,
                        help="datagram bytes (default %(default)s, one lhc packet)")
    parser.add_argument("--batch", type=_bounded(1, MAX_BATCH), default=64,
                        help="datagrams per batch and per echo round (default %(default)s)")
    parser.add_argument("--ways", type=comma_choices(WAYS), default=list(WAYS),
                        help=f"comma-separated among {', '.join(WAYS)} (default all)")
    parser.add_argument("--tests", type=comma_choices(TESTS), default=list(TESTS),
                        help=f"comma-separated among {', '.join(TESTS)} (default all)")
    parser.add_argument("--json", action="store_true", help="JSON lines only (the default output too)")


def _channel(way: str) -> Channel:
    return Channel(LOOPBACK, native=way == "native-batch")


def _sends(way: str, args: argparse.Namespace) -> list[list[bytes]]:
    """One round's ``send_many`` calls: a datagram each for per-datagram, the whole batch otherwise."""
    batch = [bytes(args.size)] * args.batch
    return [[datagram] for datagram in batch] if way == "per-datagram" else [batch]


def _send(way: str, args: argparse.Namespace) -> dict[str, Any]:
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(LOOPBACK)
    channel = _channel(way)
    channel.switch = sink.getsockname()
    sends = _sends(way, args)
    calls, started = 0, time.perf_counter()
    try:
        while time.perf_counter() - started < args.seconds:
            for datagrams in sends:
                channel.send_many(datagrams)
            calls += 1
        elapsed = time.perf_counter() - started
    finally:
        channel.close()
        sink.close()
    attempted = calls * args.batch
    return {"datagrams": attempted, "seconds": elapsed, "datagrams_per_s": attempted / elapsed,
            "refused": channel.counters.dropped_out}


def _echo_server(ready: Any, stop: Any) -> None:
    """Return every datagram to its sender, a batch per system call (native where built)."""
    channel = Channel(LOOPBACK)
    batch = ReceiveBatch(MAX_BATCH)
    ready.put(channel.local)
    while not stop.is_set():
        if not select.select([channel], [], [], 0.1)[0]:
            continue
        channel.receive_many(batch)
        if len(batch):
            channel.switch = batch.source(0)
            channel.send_many([batch.datagram(i) for i in range(len(batch))])
    channel.close()


def _echo(way: str, args: argparse.Namespace, server: tuple[str, int]) -> dict[str, Any]:
    channel = _channel(way)
    channel.switch = server
    received = ReceiveBatch(1 if way == "per-datagram" else args.batch, args.size)
    sends = _sends(way, args)
    echoed = lost = 0
    started = time.perf_counter()
    try:
        while time.perf_counter() - started < args.seconds:
            for datagrams in sends:
                channel.send_many(datagrams)
            waiting, deadline = args.batch, time.perf_counter() + ROUND_TIMEOUT_S
            while waiting and select.select([channel], [], [], max(0.0, deadline - time.perf_counter()))[0]:
                while waiting and channel.receive_many(received):
                    waiting -= len(received)
            echoed += args.batch - waiting
            lost += waiting
        elapsed = time.perf_counter() - started
    finally:
        channel.close()
    return {"datagrams": echoed, "seconds": elapsed, "datagrams_per_s": echoed / elapsed, "lost": lost}


def run(args: argparse.Namespace) -> int:
    ways = [w for w in args.ways if w != "native-batch" or native_udp_available()]
    if len(ways) < len(args.ways):
        print(json.dumps({"skipped": "native-batch", "reason": "lhc_ina/_udp.c is not built"}))
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Queue(), context.Event()
    server = context.Process(target=_echo_server, args=(ready, stop), daemon=True)
    if "echo" in args.tests:
        server.start()
    try:
        address = ready.get(timeout=60) if "echo" in args.tests else None
        for test in args.tests:
            baseline = None
            for way in ways:
                row = _send(way, args) if test == "send" else _echo(way, args, address)
                baseline = baseline or (row["datagrams_per_s"] if way == "per-datagram" else None)
                row = {"test": test, "way": way, "batch": args.batch, "size": args.size, **row}
                if baseline:
                    row["speedup_vs_per_datagram"] = row["datagrams_per_s"] / baseline
                print(json.dumps(row), flush=True)
    finally:
        stop.set()
        if server.is_alive():
            server.join(timeout=10)
    return 0
