"""Processes for tests and harnesses: an ``lhc-softswitch`` in UDP mode and an ``lhc-controller serve``.

Both run as ``sys.executable -m ...`` so the checkout's code runs, wait for their ready line, and bind
free ports (gRPC port 0; softswitch's lhc port on a random 127.x.y.z, inside the lhc port range).

    with SoftswitchProcess() as switch, ControllerProcess(switch, state_dir) as ctl:
        ctl.client.create_job("j", workers=2) ...
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np

from controller.client import JobClient, Joined
from controller.reconcile import SwitchState, desired_state, read_state
from controller.records import JobRecord, JobState, MemberRecord
from controller.server import READY as CONTROLLER_READY
from controller.store import DB_NAME, JobStore
from controller.targets import load_target
from controller.topology import load_topology
from lhc_ina import constants as c
from lhc_ina.p4rt import P4RuntimeClient
from lhc_ina.wire import LhcHeader, pack_packet, unpack_packet
from softswitch.cli import READY as SWITCH_READY

_REPO = Path(__file__).resolve().parent.parent


def _fields(line: str, ready: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line[len(ready) :].split())


class _Process:
    """A child process whose ready line is awaited and whose stderr is collected in the background."""

    def _spawn(self, argv: list[str], ready: str, timeout: float = 60.0) -> dict[str, str]:
        env = dict(os.environ, PYTHONPATH=str(_REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.stderr: list[str] = []
        self._drain = threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True)
        self._drain.start()
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not result or not result[0].startswith(ready):
            self.kill()
            raise RuntimeError(f"{argv[0]} did not start: {''.join(self.stderr)[-3000:]}")
        return _fields(result[0], ready)

    def running(self) -> bool:
        return self.proc.poll() is None

    def terminate(self, timeout: float = 20.0) -> int:
        if self.running():
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self._drain.join(5)
        return code

    def kill(self) -> None:
        """kill -9: no cleanup of any kind."""
        if self.running():
            self.proc.kill()
        self.proc.wait(20)

    def log(self) -> str:
        return "".join(self.stderr)


def _random_loopback() -> str:
    return f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"


class SoftswitchProcess(_Process):
    """``lhc-softswitch --udp 1@HOST:19520`` on a random loopback HOST; ``restart`` keeps its addresses."""

    target = "softswitch"
    moves_udp = True

    def __init__(self, grpc_port: int = 0, host: str | None = None) -> None:
        self.udp_port = c.UDP_PORT_BASE
        self.switch_port = 1
        for attempt in range(5):  # another run may hold the lhc port on the random address: pick again
            self.host = host or _random_loopback()
            try:
                self._start(grpc_port)
                return
            except RuntimeError:
                if host or attempt == 4:
                    raise

    def _start(self, grpc_port: int) -> None:
        udp = f"{self.switch_port}@{self.host}:{self.udp_port}"
        argv = ["softswitch.cli", "--grpc-addr", f"127.0.0.1:{grpc_port}", "--udp", udp, "--log-level=INFO"]
        self.grpc_addr = self._spawn(argv, SWITCH_READY)["grpc"]

    @property
    def dataplane(self) -> str:
        """The controller's --dataplane for this switch."""
        return f"{self.switch_port}@{self.host}:{self.udp_port}"

    def restart(self) -> None:
        """Stop and start again on the same addresses: the switch comes back empty."""
        self.terminate()
        self._start(int(self.grpc_addr.rsplit(":", 1)[1]))

    def __enter__(self) -> SoftswitchProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()


class Bmv2Process(_Process):
    """``simple_switch_grpc --no-p4`` (no interfaces: the controller's tests need its tables, not its
    ports); the same face as ``SoftswitchProcess`` except that it moves no UDP packets."""

    target = "bmv2"
    moves_udp = False

    def __init__(self, grpc_port: int = 0) -> None:
        from ptf_tests.targets import ensure_bmv2_json

        self.device_config = ensure_bmv2_json()
        self.host, self.udp_port, self.switch_port = "10.0.0.254", c.UDP_PORT_BASE, 1
        self._start(grpc_port or _free_tcp_port())

    def _start(self, grpc_port: int) -> None:
        self.grpc_addr = f"127.0.0.1:{grpc_port}"
        self.proc = subprocess.Popen(
            ["simple_switch_grpc", "--device-id", "1", "--thrift-port", str(_free_tcp_port()),
             "--no-p4", "--", "--grpc-server-addr", self.grpc_addr],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.stderr: list[str] = []
        self._drain = threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True)
        self._drain.start()
        channel = grpc.insecure_channel(self.grpc_addr)
        try:
            grpc.channel_ready_future(channel).result(timeout=60)
        finally:
            channel.close()

    dataplane = SoftswitchProcess.dataplane
    restart = SoftswitchProcess.restart
    __enter__ = SoftswitchProcess.__enter__
    __exit__ = SoftswitchProcess.__exit__


def _free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_switch(kind: str) -> SoftswitchProcess | Bmv2Process:
    """The switch of a parametrized test: ``softswitch`` or ``bmv2``."""
    return Bmv2Process() if kind == "bmv2" else SoftswitchProcess()


class ControllerProcess(_Process):
    """``lhc-controller serve`` against ``switch`` with its state in ``state_dir``; ``client`` talks to it."""

    def __init__(
        self,
        switch: SoftswitchProcess | Bmv2Process,
        state_dir: Path,
        *extra: str,
        election_id: int = 1,
        token: str | None = None,
    ) -> None:
        argv = ["controller.cli", "serve", "--switch", switch.grpc_addr, "--target", switch.target,
                "--listen", "127.0.0.1:0", "--state-dir", str(state_dir), "--dataplane", switch.dataplane,
                "--election-id", str(election_id), "--log-level", "INFO"]  # fmt: skip
        if switch.target == "bmv2":
            argv += ["--device-config", str(switch.device_config)]
        fields = self._spawn([*argv, *extra], CONTROLLER_READY)
        self.listen = fields["listen"]
        self.metrics = fields.get("metrics")
        self.client = JobClient(self.listen, token=token)

    def wait_for_switch(self, primary: bool = True, timeout: float = 60.0) -> None:
        """Until the controller has reconciled the switch as primary (or observed it as a backup)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.client.switch_status()
            if status.connected and status.primary == primary and status.reconciles > 0:
                return
            time.sleep(0.05)
        raise TimeoutError(f"controller not {'primary' if primary else 'backup'} after {timeout} s: {status}")

    def terminate(self, timeout: float = 20.0) -> int:
        self.client.close()
        return super().terminate(timeout)

    def kill(self) -> None:
        """kill -9; the client stays open (calls fail UNAVAILABLE) until ``client.close()``."""
        super().kill()

    def __enter__(self) -> ControllerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.running():
            self.terminate()
        else:
            self.client.close()


def switch_state(switch: SoftswitchProcess | Bmv2Process) -> SwitchState:
    """What the switch holds in the controller's tables and groups, read without taking part in the
    election (a read-only observer)."""
    target = load_target("softswitch")  # the v1model P4Info: the same for bmv2
    client = P4RuntimeClient(switch.grpc_addr, p4info=target.p4info)
    client.connect(arbitrate=False)
    try:
        return read_state(client, target)
    finally:
        client.close()


def store_state(state_dir: Path, topology: Path | None = None) -> SwitchState:
    """What the job store in ``state_dir`` (and the topology file) say the switch must hold."""
    store = JobStore(state_dir / DB_NAME)
    try:
        return desired_state(store.jobs(), load_topology(topology) if topology else None)
    finally:
        store.close()


class Worker:
    """One worker's UDP socket on loopback; sends DATA for its rank and reads RESULTs."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(10)
        self.port = self.sock.getsockname()[1]
        self.joined: Joined | None = None

    def send(self, words: np.ndarray, slot: int, seq: int, ver: int = 0, epoch: int | None = None) -> None:
        j = self.joined
        assert j is not None
        header = LhcHeader(
            msg_type=c.MsgType.DATA,
            op=c.Op.ADD,
            ver=ver,
            worker_id=j.rank,
            job_id=j.job_id,
            slot=slot,
            epoch=j.epoch if epoch is None else epoch,
            seq=seq,
        )
        self.sock.sendto(pack_packet(header, words), (j.switch_ip, j.switch_udp_port))

    def receive(self) -> tuple[LhcHeader, np.ndarray]:
        return unpack_packet(self.sock.recv(4096))

    def close(self) -> None:
        self.sock.close()


def aggregate_once(workers: list[Worker], slot: int, seq: int, rng: np.random.Generator) -> None:
    """One round through the switch; every worker must get the exact modular sum with a full bitmap."""
    values = [rng.integers(0, 1 << 32, c.LANES, dtype=np.uint64).astype(np.uint32) for _ in workers]
    for worker, value in zip(workers, values, strict=True):
        worker.send(value, slot, seq)
    expected = (np.sum(values, axis=0, dtype=np.uint64) % (1 << 32)).astype(np.uint32)
    for worker in workers:
        header, words = worker.receive()
        assert header.msg_type == c.MsgType.RESULT, header
        assert (header.slot, header.seq, header.bitmap) == (slot, seq, (1 << len(workers)) - 1), header
        np.testing.assert_array_equal(words, expected)


def two_worker_job(epoch: int = 3) -> JobRecord:
    """An ACTIVE job of two workers at 10.0.0.1-2 behind ports 1-2, as the store would hold it."""
    members = tuple(
        MemberRecord(r, f"w{r}", f"10.0.0.{r + 1}", 40000, f"02:00:00:00:00:0{r + 1}", r + 1)
        for r in range(2)
    )
    return JobRecord(7, "j", JobState.ACTIVE, 2, 64, 16, c.LANES, 2, epoch, 10, 10, 0, members=members)
