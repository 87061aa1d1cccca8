"""``lhc-softswitch``: run softswitch with its P4Runtime server and ports until SIGINT or SIGTERM.

    lhc-softswitch [--grpc-addr HOST:PORT] [--device-id N] [--port N@IFACE ...] [--udp N@HOST:UDPPORT ...]
                   [--pipeline native|python] [--tls-cert PEM --tls-key PEM [--tls-ca PEM]]
                   [--pcap FILE] [--log-level LEVEL]

Once gRPC listens and every port is open, one line goes to stdout (flushed), e.g.

    lhc-softswitch ready: grpc=127.0.0.1:9559 device_id=1 tls=plaintext ports=1@veth1,2@127.0.0.1:19520/udp
    pipeline=native

with how P4Runtime is served (``plaintext``, ``tls`` with ``--tls-cert``/``--tls-key``, or ``mutual`` with
``--tls-ca`` too: only controllers whose certificate it signed get in), the ports actually bound
(``--grpc-addr 127.0.0.1:0`` picks a free port; a UDP port 0 the first free one of the lhc range, and a UDP
port outside that range is refused) and the pipeline that runs (native by default where
softswitch/_dataplane.c was built, python otherwise). Harnesses wait for it. Logs go to stderr; when it
stops, at INFO, the frames and errors in all and a line per port with its counters (``describe_counters``:
among them the datagrams its socket refused, per errno name). If the data plane's thread dies, the process
logs it and exits with status 1.

``--pcap FILE`` records every frame the data plane receives and sends, on every port, as pcapng
(``softswitch.capture``; read it with Wireshark and ``wireshark/lhc.lua``, docs/testing.md).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from lhc_ina import tls
from lhc_ina.p4info import P4InfoIndex
from softswitch.capture import PcapngWriter
from softswitch.native import PIPELINES, NativePipeline, choose_pipeline, native_available
from softswitch.pipeline import Pipeline
from softswitch.ports import Port, PortSpecError, open_port, parse_port_specs
from softswitch.program import PipelineMismatch
from softswitch.receive_loop import NATIVE_BURST, DataPlane
from softswitch.server import P4RuntimeService, start_server

log = logging.getLogger("softswitch")

READY = "lhc-softswitch ready:"


def describe_counters(counters: dict) -> str:
    """A port's counters as one log line's words: ``frames_in=12 dropped_non_udp=0 send_errors=3
    send_errors_by_errno=EINVAL:3`` (``-`` when none)."""
    by_errno = ",".join(f"{name}:{count}" for name, count in counters["send_errors_by_errno"].items()) or "-"
    return (f"frames_in={counters['frames_in']} dropped_non_udp={counters['dropped_non_udp']} "
            f"send_errors={counters['send_errors']} send_errors_by_errno={by_errno}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lhc-softswitch",
        description="softswitch: the lhc v1model pipeline (native C or the Python reference model) with a "
                    "P4Runtime server",
    )
    parser.add_argument("--grpc-addr", default="127.0.0.1:9559",
                        help="P4Runtime listen address HOST:PORT (default %(default)s; port 0 picks one)")
    parser.add_argument("--device-id", type=int, default=1, help="P4Runtime device id (default %(default)s)")
    parser.add_argument("--port", action="append", default=[], metavar="N@IFACE",
                        help="attach switch port N to interface IFACE with AF_PACKET (root); repeatable")
    parser.add_argument("--udp", action="append", default=[], metavar="N@HOST:UDPPORT",
                        help="run switch port N as UDP on HOST:UDPPORT (no root), UDPPORT in the lhc range "
                             "or 0 (a free one in it); N@ may be left out (next free number); repeatable")
    parser.add_argument("--pipeline", choices=PIPELINES, default=None,
                        help="the data plane: native (C, the default where it is built) or python (the "
                             "reference model)")
    tls.add_arguments(parser, role={
        "ca": "sign the controllers it admits: with it, mutual TLS (a client without such a certificate "
              "is refused)",
        "cert": "P4Runtime is served with (TLS)",
    })
    parser.add_argument("--pcap", metavar="FILE", default=None,
                        help="write every frame the data plane receives and sends to FILE (pcapng, one "
                             "interface per port; dissect with wireshark/lhc.lua)")
    parser.add_argument("--log-level", default="WARNING",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="stderr log level")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        specs = parse_port_specs(args.port, args.udp)
    except PortSpecError as exc:
        print(f"lhc-softswitch: {exc}", file=sys.stderr)
        return 2
    try:
        kind = choose_pipeline(args.pipeline)
    except RuntimeError as exc:
        print(f"lhc-softswitch: {exc}", file=sys.stderr)
        return 2
    try:
        config = tls.from_args(args)
    except tls.TlsError as exc:
        print(f"lhc-softswitch: {exc}", file=sys.stderr)
        return 2
    tls_mode = tls.mode(config, server=True, require_client_cert=config is not None and config.ca is not None)
    index = P4InfoIndex.from_file()
    try:
        pipeline = Pipeline(index)
    except PipelineMismatch as exc:
        print(f"lhc-softswitch: {exc}", file=sys.stderr)
        return 1
    ports: list[Port] = []
    try:
        for spec in specs:
            ports.append(open_port(spec, pipeline.rx))
    except PortSpecError as exc:
        for port in ports:
            port.close()
        print(f"lhc-softswitch: {exc}", file=sys.stderr)
        return 1

    capture = None
    if args.pcap is not None:
        try:
            capture = PcapngWriter(args.pcap, [(port.number, port.spec.describe()) for port in ports])
        except OSError as exc:
            for port in ports:
                port.close()
            print(f"lhc-softswitch: --pcap {args.pcap}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    lock = threading.Lock()
    service = P4RuntimeService(pipeline, lock, index.p4info, args.device_id)
    try:
        server, grpc_port = start_server(service, args.grpc_addr, tls=config)
    except (OSError, tls.TlsError) as exc:
        for port in ports:
            port.close()
        if capture is not None:
            capture.close()
        print(f"lhc-softswitch: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    native = NativePipeline(pipeline, NATIVE_BURST) if kind == "native" else None
    dataplane = DataPlane(pipeline, ports, lock, native=native, capture=capture,
                          on_failure=lambda _: stop.set())
    # One line on stderr whatever the log level: which pipeline forwards, and why when it is not the default.
    why = {"native": "C, softswitch/_dataplane.c", "python": "the reference model"}[kind]
    if args.pipeline is None and not native_available():
        why = "the native pipeline, softswitch/_dataplane.c, is not built"
    print(f"lhc-softswitch: data plane: the {kind} pipeline ({why})", file=sys.stderr, flush=True)
    dataplane.start()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    host = args.grpc_addr.rsplit(":", 1)[0]
    described = ",".join(port.spec.describe() for port in ports) or "none"
    print(f"{READY} grpc={host}:{grpc_port} device_id={args.device_id} tls={tls_mode} ports={described} "
          f"pipeline={kind}", flush=True)
    while not stop.wait(0.5):
        pass
    log.info("stopping: %d frames received, %d raised, %d socket errors", dataplane.frames_in,
             dataplane.errors, dataplane.socket_errors)
    for number, counters in sorted(dataplane.port_counters().items()):
        log.info("port %d counters: %s", number, describe_counters(counters))
    server.stop(grace=1).wait()
    dataplane.stop()
    if capture is not None:
        log.info("captured %d frames in %s", capture.frames, capture.path)
    if dataplane.failed is not None:
        log.critical("lhc-softswitch: exiting with status 1: the data plane died (%r)", dataplane.failed)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
