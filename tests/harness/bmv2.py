"""BMv2 ``simple_switch_grpc`` as a child process with the face of ``SoftswitchProcess``, for the tests
that run the controller and the agents against either switch."""

from __future__ import annotations

import subprocess
import threading

import grpc

from lhc_ina import constants as c
from lhc_launch.processes import ChildProcess, SoftswitchProcess, free_tcp_port
from ptf_tests.targets import ensure_bmv2_json


class Bmv2Process(ChildProcess):
    """``simple_switch_grpc --no-p4`` (no interfaces: the controller's tests need its tables, not its
    ports); the same face as ``SoftswitchProcess`` except that it moves no UDP packets."""

    target = "bmv2"
    moves_udp = False

    def __init__(self, grpc_port: int = 0) -> None:
        self.device_config = ensure_bmv2_json()
        self.host, self.udp_port, self.switch_port = "10.0.0.254", c.UDP_PORT_BASE, 1
        self._start(grpc_port or free_tcp_port())

    def _start(self, grpc_port: int) -> None:
        self.grpc_addr = f"127.0.0.1:{grpc_port}"
        self.proc = subprocess.Popen(
            ["simple_switch_grpc", "--device-id", "1", "--thrift-port", str(free_tcp_port()),
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


def start_switch(kind: str) -> SoftswitchProcess | Bmv2Process:
    """The switch of a parametrized test: ``softswitch`` or ``bmv2``."""
    return Bmv2Process() if kind == "bmv2" else SoftswitchProcess()
