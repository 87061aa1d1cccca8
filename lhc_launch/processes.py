"""The project's processes as children: an ``lhc-softswitch`` (UDP), a leaf/spine fabric of them and an
``lhc-controller serve``, for the demo, the benchmarks and the tests (which add BMv2,
``tests/harness/bmv2.py``).

Both run as ``sys.executable -m ...`` so the checkout's code runs, wait for their ready line, and bind
free ports (gRPC port 0; softswitch's lhc port on a random 127.x.y.z, inside the lhc port range). They
get TLS and credentials from their arguments only: the ``LHC_TLS_*`` and ``LHC_TOKEN_FILE`` variables of
the caller's environment are not passed on, so a shell set up for a real network leaves them as asked.

    with SoftswitchProcess() as switch, ControllerProcess(switch, state_dir) as ctl:
        ctl.client.create_job("j", workers=2) ...

A leaf/spine fabric (``FabricProcesses``) is one softswitch process per switch, each with its gRPC port
and one UDP port on its own loopback address: a leaf's port 1 serves its workers and its link to the
spine alike (a leaf's uplink address must be the one its workers send to, and a UDP port's datagrams
leave from its own address), and the spine's port 1 serves every leaf, so each leaf-spine link is the
pair of UDP sockets (leaf, spine). The controller gets the fabric's topology file:

    with FabricProcesses(leaves=2, state_dir) as fabric, ControllerProcess(fabric, state_dir) as ctl:
        Agent.join(ctl.listen, "j", ip=fabric.host_ips[0]) ...   # a worker under leaf 0
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from controller.admission import default_mac
from controller.server import READY as CONTROLLER_READY
from lhc_ina import constants as c
from lhc_ina.jobservice.client import TOKEN_FILE_ENV, JobClient
from lhc_ina.tls import ENVIRONMENT as TLS_ENVIRONMENT
from lhc_ina.tls import TlsConfig
from softswitch.cli import READY as SWITCH_READY

_REPO = Path(__file__).resolve().parent.parent
_NOT_INHERITED = {*TLS_ENVIRONMENT.values(), TOKEN_FILE_ENV}


def _fields(line: str, ready: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line[len(ready) :].split())


class ChildProcess:
    """A child process whose ready line is awaited and whose stderr is collected in the background."""

    def _spawn(self, argv: list[str], ready: str, timeout: float = 60.0) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
        env["PYTHONPATH"] = str(_REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")
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


class SoftswitchProcess(ChildProcess):
    """``lhc-softswitch --udp 1@HOST:19520`` on a random loopback HOST; ``restart`` keeps its addresses.
    ``args``: more of its arguments (``--tls-cert`` ...)."""

    target = "softswitch"
    moves_udp = True

    def __init__(self, grpc_port: int = 0, host: str | None = None, pipeline: str | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.pipeline = pipeline  # softswitch's --pipeline (native or python); None: its default
        self.args = args
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
        argv = ["softswitch.cli", "--grpc-addr", f"127.0.0.1:{grpc_port}", "--udp", udp, "--log-level=INFO",
                *self.args]
        if self.pipeline:
            argv += ["--pipeline", self.pipeline]
        fields = self._spawn(argv, SWITCH_READY)
        self.grpc_addr, self.tls = fields["grpc"], fields["tls"]

    @property
    def dataplane(self) -> str:
        """The controller's --dataplane for this switch."""
        return f"{self.switch_port}@{self.host}:{self.udp_port}"

    def restart(self, *, crash: bool = False) -> None:
        """Stop (kill -9 with ``crash``) and start again on the same addresses: the switch comes back
        empty."""
        if crash:
            self.kill()
        else:
            self.terminate()
        self._start(int(self.grpc_addr.rsplit(":", 1)[1]))

    def __enter__(self) -> SoftswitchProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()


def free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class FabricProcesses:
    """A spine and ``leaves`` leaves, each an ``lhc-softswitch`` process on its own loopback address (each
    started on a fresh random address until its lhc port is free), and the topology that describes them,
    written to ``topology_path``: leaf ``i`` is ``leaf{i}``, its host ``h{i}`` at ``host_ips[i]`` (every
    worker under leaf ``i`` binds that address: the controller places a worker by its host's address)."""

    target = "softswitch"

    def __init__(self, leaves: int, state_dir: Path, pipeline: str | None = None) -> None:
        self.spine = SoftswitchProcess(pipeline=pipeline)
        self.leaves: list[SoftswitchProcess] = []
        try:
            for _ in range(leaves):
                self.leaves.append(SoftswitchProcess(pipeline=pipeline))
        except BaseException:
            self.terminate()
            raise
        used = {self.spine.host, *(leaf.host for leaf in self.leaves)}
        self.host_ips: list[str] = []
        while len(self.host_ips) < leaves:
            ip = _random_loopback()
            if ip not in used:
                used.add(ip)
                self.host_ips.append(ip)
        self.topology_path = Path(state_dir) / "fabric-topology.json"
        self.topology_path.parent.mkdir(parents=True, exist_ok=True)
        self.topology_path.write_text(json.dumps(self.topology(), indent=1))

    @property
    def switches(self) -> dict[str, SoftswitchProcess]:
        return {"spine": self.spine, **{f"leaf{i}": leaf for i, leaf in enumerate(self.leaves)}}

    def topology(self) -> dict:
        def switch(name: str, role: str, process: SoftswitchProcess) -> dict:
            return {"name": name, "role": role, "p4runtime": process.grpc_addr, "ip": process.host,
                    "mac": default_mac(process.host), "udp_port": process.udp_port}

        return {
            "switches": [switch(name, "spine" if name == "spine" else "leaf", process)
                         for name, process in self.switches.items()],
            "links": [{"leaf": f"leaf{i}", "leaf_port": leaf.switch_port,
                       "spine_port": self.spine.switch_port} for i, leaf in enumerate(self.leaves)],
            "hosts": [{"name": f"h{i}", "switch": f"leaf{i}", "ip": ip, "mac": default_mac(ip),
                       "port": self.leaves[i].switch_port} for i, ip in enumerate(self.host_ips)],
        }

    def terminate(self) -> None:
        for process in (self.spine, *self.leaves):
            if process.running():
                process.terminate()

    def __enter__(self) -> FabricProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()


class ControllerProcess(ChildProcess):
    """``lhc-controller serve`` against ``switch`` (or every switch of a fabric, from its topology) with
    its state in ``state_dir``; ``client`` talks to it with ``token`` and, given, ``tls`` (whose CA
    verifies the job service's certificate)."""

    def __init__(
        self,
        switch: SoftswitchProcess | FabricProcesses,
        state_dir: Path,
        *extra: str,
        election_id: int = 1,
        token: str | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        argv = ["controller.cli", "serve", "--target", switch.target, "--listen", "127.0.0.1:0",
                "--state-dir", str(state_dir), "--election-id", str(election_id), "--log-level", "INFO"]
        if isinstance(switch, FabricProcesses):
            argv += ["--topology", str(switch.topology_path)]
        else:
            argv += ["--switch", switch.grpc_addr, "--dataplane", switch.dataplane]
        if switch.target == "bmv2":
            argv += ["--device-config", str(switch.device_config)]
        fields = self._spawn([*argv, *extra], CONTROLLER_READY)
        self.listen = fields["listen"]
        self.metrics = fields.get("metrics")
        self.ready = fields
        self.client = JobClient(self.listen, token=token, tls=tls)

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
