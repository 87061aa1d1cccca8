"""``lhc-controller serve``: the store, the switch session, liveness, the job service and metrics, wired.

Once the job service listens, one line goes to stdout (flushed), e.g.

    lhc-controller ready: listen=127.0.0.1:9560 switch=127.0.0.1:9559 target=softswitch election_id=1
    dataplane=127.0.0.1:19520 state=/home/u/.local/state/lhc-controller/controller.sqlite3
    tls=plaintext switch_tls=plaintext auth=open

with the bound addresses (port 0 picks a free one); harnesses wait for it. SIGINT/SIGTERM stop it cleanly.
``tls`` is how the job service is served, ``switch_tls`` how the switch is dialled (``plaintext``, ``tls``
or ``mutual``), ``auth`` ``open`` (no --token-file: every caller is the operator) or ``credentials``.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import re
import signal
import sys
import threading
from concurrent import futures
from pathlib import Path

import grpc

from controller.auth import Authority
from controller.integrity import store_problems
from controller.liveness import Liveness
from controller.metrics import serve_metrics
from controller.service import JobService
from controller.session import SessionContext
from controller.sessions import Sessions
from controller.store import DB_NAME, JobStore, default_state_dir
from controller.targets import TARGETS, load_target
from controller.topology import Topology, load_topology, parse_topology
from controller.watches import Changes, WatchLimits
from lhc_ina import constants as c
from lhc_ina import tls
from lhc_ina.jobservice import errors
from lhc_ina.jobservice import jobservice_pb2_grpc as pb_grpc
from lhc_ina.jobservice.errors import ControllerError

log = logging.getLogger("lhc-controller")
READY = "lhc-controller ready:"
DEFAULT_LISTEN = "127.0.0.1:9560"
#: Server threads: each open Watch stream holds one, so there is room for every worker of several jobs;
#: watches may hold all but ``_UNARY_THREADS`` of them.
_RPC_THREADS = 256
_UNARY_THREADS = 64
#: The server pings idle connections, so that a client that vanished (host down, no FIN) is noticed and
#: its Watch's thread released within about half a minute.
_KEEPALIVE = (("grpc.keepalive_time_ms", 20_000), ("grpc.keepalive_timeout_ms", 10_000))
_DATAPLANE = re.compile(r"^(?:(\d+)@)?([0-9.]+)(?::(\d+))?$")


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--switch", default="127.0.0.1:9559", help="P4Runtime address (default %(default)s)")
    parser.add_argument("--target", choices=TARGETS, default="softswitch")
    parser.add_argument("--listen", default=DEFAULT_LISTEN, help="job service address (default %(default)s)")
    parser.add_argument(
        "--state-dir", type=Path, default=None, help=f"where {DB_NAME} lives (default {default_state_dir()})"
    )
    parser.add_argument("--topology", type=Path,
                        help="topology JSON: one switch's address and its hosts, or a leaf/spine fabric "
                        "(switches, links, hosts); kept in the store, which a later start without it uses")
    parser.add_argument(
        "--dataplane",
        metavar="[N@]HOST[:UDPPORT]",
        help="the switch's lhc address workers send to, and its port N that reaches "
        "workers who give none (softswitch UDP mode: its --udp spec)",
    )
    parser.add_argument("--device-id", type=int, default=1)
    parser.add_argument("--election-id", type=int, default=1, help="higher wins primaryship")
    parser.add_argument("--p4info", type=Path, help="override the target's P4Info")
    parser.add_argument("--device-config", type=Path, help="override the target's device config")
    parser.add_argument(
        "--token-file", type=Path,
        help="the operator's token: every call must carry it or a job credential (without it: open, "
        "every caller is the operator; for loopback)",
    )
    tls.add_arguments(parser, role={
        "ca": "sign the switch's certificate: with it, P4Runtime goes over TLS",
        "cert": "the job service is served with (TLS), also shown to the switch (mutual TLS)",
        "server_name": "the name in the switch's certificate, when not the --switch host",
    })
    parser.add_argument("--watch-limit", type=float, default=300.0,
                        help="seconds a Watch stream lives before the client must open another (%(default)s)")
    parser.add_argument("--max-watches", type=int, default=64,
                        help="Watch streams open at once per credential and job (%(default)s)")
    parser.add_argument("--metrics-addr", help="serve Prometheus metrics on HOST:PORT")
    parser.add_argument("--join-timeout", type=float, default=120.0, help="default seconds to join")
    parser.add_argument("--heartbeat-timeout", type=float, default=15.0, help="default heartbeat timeout")
    parser.add_argument("--reconcile-interval", type=float, default=10.0, help="seconds between reconciles")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def parse_dataplane(text: str | None, topology: Topology | None) -> tuple[str, int, int | None]:
    """(switch IP, lhc UDP port, default switch port) from --dataplane, else from the topology."""
    if text:
        match = _DATAPLANE.match(text)
        if not match:
            raise errors.invalid(f"--dataplane {text!r}: expected [N@]HOST[:UDPPORT], e.g. 1@127.0.0.1:19520")
        port = int(match.group(3) or c.UDP_PORT_BASE)
        if port & c.UDP_PORT_MASK != c.UDP_PORT_BASE:
            raise errors.invalid(
                f"--dataplane {text!r}: UDP port {port} is not an lhc port "
                f"({c.UDP_PORT_BASE}..{c.UDP_PORT_BASE + c.UDP_PORT_COUNT - 1})"
            )
        try:
            host = str(ipaddress.IPv4Address(match.group(2)))
        except ValueError:
            raise errors.invalid(f"--dataplane {text!r}: {match.group(2)!r} is not an IPv4 address") from None
        return host, port, int(match.group(1)) if match.group(1) else None
    if topology is not None and topology.fabric:
        return "", 0, None  # each worker sends to its own leaf's address (the topology's)
    if topology is not None:
        return topology.switch_ip, topology.switch_udp_port, None
    raise errors.invalid("give --dataplane (the switch's lhc address) or a --topology with a switch")


def stored_topology(path: Path | None, store: JobStore) -> Topology | None:
    """``--topology`` (saved in the store), else the one the store kept from an earlier start, else None."""
    if path is None:
        document = store.topology_document()
        return None if document is None else parse_topology(json.loads(document))
    topology = load_topology(path)
    store.save_topology(json.dumps(json.loads(path.read_text()), sort_keys=True))
    return topology


class Controller:
    """Everything ``serve`` runs, startable and stoppable in-process (tests use it too)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.tls = tls.from_args(args)
        token = args.token_file.read_text().strip() if args.token_file else None
        if args.token_file and not token:
            raise errors.invalid(f"--token-file {args.token_file} is empty")
        if args.topology:
            load_topology(args.topology)  # a broken file is refused before the store is touched
        self.target = load_target(args.target, args.p4info, args.device_config)
        state_dir = args.state_dir or default_state_dir()
        self.store = JobStore(state_dir / DB_NAME)
        try:
            self.topology = stored_topology(args.topology, self.store)
            if self.topology is not None and self.topology.fabric and args.dataplane:
                raise errors.invalid("--dataplane: a fabric topology gives each switch's lhc address")
            dataplane = parse_dataplane(args.dataplane, self.topology)
        except ControllerError:
            self.store.close()
            raise
        problems = store_problems(self.store, self.topology)
        if problems:
            self.store.close()
            raise errors.precondition(f"{self.store.path} is inconsistent: " + "; ".join(problems))
        self.authority = Authority(self.store, token)
        self.changes = Changes()
        context = SessionContext(self.target, self.store, self.topology, election_id=args.election_id,
                                 reconcile_interval=args.reconcile_interval, tls=self.tls,
                                 on_change=self.changes.notify)
        self.sessions = Sessions(context, args.switch, device_id=args.device_id)
        self.liveness = Liveness(
            self.store, enabled=lambda: any(s.status.primary for s in self.sessions.all),
            on_failed=self._failed, topology=self.topology,
        )  # fmt: skip
        self.service = JobService(
            self.store,
            self.sessions,
            self.liveness,
            self.target,
            self.topology,
            dataplane,
            join_timeout_s=args.join_timeout,
            heartbeat_timeout_s=args.heartbeat_timeout,
            changes=self.changes,
            authority=self.authority,
            watch_limits=WatchLimits(args.max_watches, _RPC_THREADS - _UNARY_THREADS, args.watch_limit),
        )
        if self.authority.open and not tls.is_loopback(args.listen):
            log.warning("no --token-file and listening on %s, which is not loopback: anyone who reaches it "
                        "may create, join and delete any job", args.listen)
        pool = futures.ThreadPoolExecutor(max_workers=_RPC_THREADS)
        self.grpc = grpc.server(pool, options=_KEEPALIVE)
        pb_grpc.add_JobServiceServicer_to_server(self.service, self.grpc)
        try:
            self.port = tls.add_port(self.grpc, args.listen, self.tls)
        except RuntimeError:
            self.port = 0
        if not self.port:
            raise ControllerError(grpc.StatusCode.UNAVAILABLE, f"cannot listen on {args.listen}")
        self.listen = f"{args.listen.rpartition(':')[0]}:{self.port}"
        self.metrics_addr = args.metrics_addr
        self.metrics_port: int | None = None
        self._metrics_server = None
        self.args = args
        self.dataplane = dataplane

    def _failed(self, job_id: int, reason: str) -> None:
        log.warning("job %d failed: %s", job_id, reason)
        self.sessions.request_reconcile()
        self.changes.notify()

    def start(self) -> None:
        self.sessions.start()
        self.liveness.start()
        self.grpc.start()
        if self.metrics_addr:
            self._metrics_server, self.metrics_port = serve_metrics(
                self.metrics_addr, self.store, self.sessions, self.liveness.paths
            )

    def stop(self) -> None:
        self.grpc.stop(grace=1).wait()
        self.liveness.stop()
        self.sessions.stop()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        self.store.close()

    def ready_line(self) -> str:
        metrics = (
            f" metrics={self.metrics_addr.rpartition(':')[0]}:{self.metrics_port}"
            if self.metrics_port
            else ""
        )
        switches = ",".join(
            s.address if s.name == "switch" else f"{s.name}@{s.address}" for s in self.sessions.all
        )
        dataplane = "per-leaf" if self.topology is not None and self.topology.fabric else \
            f"{self.dataplane[0]}:{self.dataplane[1]}"
        return (
            f"{READY} listen={self.listen} switch={switches} target={self.target.name} "
            f"election_id={self.sessions.all[0].election_id} dataplane={dataplane} "
            f"state={self.store.path}{metrics} tls={tls.mode(self.tls, server=True)} "
            f"switch_tls={tls.mode(self.tls, server=False)} "
            f"auth={'open' if self.authority.open else 'credentials'}"
        )


def serve(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        controller = Controller(args)
    except ControllerError as exc:
        print(f"lhc-controller: {exc}", file=sys.stderr)
        return 2 if exc.code == grpc.StatusCode.INVALID_ARGUMENT else 1
    except (tls.TlsError, OSError) as exc:
        print(f"lhc-controller: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    controller.start()
    print(controller.ready_line(), flush=True)
    while not stop.wait(0.5):
        pass
    log.info("stopping")
    controller.stop()
    return 0
