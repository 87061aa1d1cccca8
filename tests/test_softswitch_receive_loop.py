"""The data plane's loop under faults: a port whose socket fails is counted and logged while the other
ports keep forwarding (on both pipelines), and a loop that dies takes lhc-softswitch down with status 1
and a critical log line, instead of leaving a P4Runtime server that answers for a switch that no longer
forwards."""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from lhc_ina import constants as c
from lhc_ina import wire
from lhc_ina.p4info import P4InfoIndex
from lhc_launch.switch_job import data_packet
from softswitch import cli
from softswitch.native import NativePipeline, choose_pipeline, native_available
from softswitch.pipeline import Pipeline
from softswitch.ports import PortSpec, UdpPort
from softswitch.receive_loop import NATIVE_BURST, DataPlane
from tests.harness.switch_jobs import loopback_job, loopback_sockets

INDEX = P4InfoIndex.from_file()
PIPELINES = [pytest.param("python"), pytest.param("native", marks=pytest.mark.skipif(
    not native_available(), reason="the native pipeline is not built"))]


class FailingPort(UdpPort):
    """A UDP port whose socket always fails: poll finds it readable (a pipe with a byte in it), and both
    the Python receive and the native recvmmsg (on the pipe: ENOTSOCK) raise OSError."""

    def __init__(self, spec: PortSpec, rx: bytearray) -> None:
        super().__init__(spec, rx)
        self.pipe_r, self.pipe_w = os.pipe()
        os.write(self.pipe_w, b"x")

    def fileno(self) -> int:
        return self.pipe_r

    def receive(self) -> int:
        raise OSError(errno.EIO, "injected receive failure")

    def close(self) -> None:
        super().close()
        os.close(self.pipe_r)
        os.close(self.pipe_w)


@pytest.mark.parametrize("kind", PIPELINES)
def test_a_failing_port_is_counted_and_logged_and_the_others_keep_forwarding(kind, caplog):
    pipeline = Pipeline(INDEX)
    pipeline.configured = True
    ranks = loopback_sockets(2)
    job = loopback_job(INDEX, pipeline, ranks, 8, 2, slot_count=2, epoch=4)
    good = UdpPort(PortSpec(1, host="127.0.0.1", udp_port=0), pipeline.rx)
    bad = FailingPort(PortSpec(2, host="127.0.0.1", udp_port=0), pipeline.rx)
    native = NativePipeline(pipeline, NATIVE_BURST) if kind == "native" else None
    failures: list[BaseException] = []
    dataplane = DataPlane(pipeline, [good, bad], threading.Lock(), native=native, on_failure=failures.append)
    caplog.set_level(logging.WARNING, logger="softswitch.receive_loop")
    dataplane.start()
    try:
        words = [np.full(c.LANES, 3 + r, np.uint32) for r in range(2)]
        for rank, sock in enumerate(ranks):
            sock.sendto(data_packet(job, rank, words[rank]), good.address)
        for sock in ranks:
            header, payload = wire.unpack_packet(sock.recv(2048))
            assert header.msg_type == c.MsgType.RESULT and (payload == 7).all()
    finally:
        dataplane.stop()
        for sock in ranks:
            sock.close()
    assert failures == [] and dataplane.failed is None
    assert dataplane.socket_errors > 0 and dataplane.frames_in == 2
    assert any("port 2: socket error" in record.getMessage() for record in caplog.records)


def test_a_dying_loop_calls_on_failure_with_a_critical_log_line(caplog):
    pipeline = Pipeline(INDEX)
    port = UdpPort(PortSpec(1, host="127.0.0.1", udp_port=0), pipeline.rx)
    died = threading.Event()
    failures: list[BaseException] = []

    def on_failure(error: BaseException) -> None:
        failures.append(error)
        died.set()

    def broken_burst(_port: UdpPort) -> None:
        raise RuntimeError("a bug in the loop")

    dataplane = DataPlane(pipeline, [port], threading.Lock(), on_failure=on_failure)
    dataplane._burst_python = broken_burst
    dataplane.start()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            peer.sendto(b"wake the loop", port.address)
        assert died.wait(5), "the loop did not die"
    finally:
        dataplane.stop()
    assert [str(error) for error in failures] == ["a bug in the loop"]
    critical = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert critical and "the data plane thread died" in critical[0].getMessage() and critical[0].exc_info


def test_lhc_softswitch_exits_1_when_its_data_plane_dies(monkeypatch, caplog):
    """In process, so the loop can be broken: main() returns 1 with a critical line, not a half-alive
    switch whose gRPC keeps answering."""

    def broken_run(self: DataPlane) -> None:
        raise RuntimeError("injected: the loop broke")

    monkeypatch.setattr(DataPlane, "run", broken_run)
    monkeypatch.setattr(cli.signal, "signal", lambda *_: None)  # pytest keeps its own handlers
    code = cli.main(["--grpc-addr", "127.0.0.1:0", "--udp", "1@127.0.0.1:0", "--pipeline", "python"])
    assert code == 1
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL]
    assert any("the data plane thread died" in m for m in messages)
    assert any("exiting with status 1" in m and "injected: the loop broke" in m for m in messages)


def test_the_start_says_which_pipeline_forwards(monkeypatch, capsys):
    """One line on stderr at start, whatever the log level; here the default falls back to python."""
    monkeypatch.setattr("softswitch.native._native", None)
    monkeypatch.setattr(cli.signal, "signal", lambda *_: None)

    class StopAtOnce(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            return True

    monkeypatch.setattr(cli, "threading", SimpleNamespace(Event=StopAtOnce, Lock=threading.Lock))
    assert cli.main(["--grpc-addr", "127.0.0.1:0", "--udp", "1@127.0.0.1:0"]) == 0
    out, err = capsys.readouterr()
    assert out.split()[-1] == "pipeline=python"
    assert "lhc-softswitch: data plane: the python pipeline (the native pipeline, softswitch/_dataplane.c, " \
           "is not built)" in err


def test_native_requested_where_it_is_not_built_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setattr("softswitch.native._native", None)
    assert cli.main(["--grpc-addr", "127.0.0.1:0", "--pipeline", "native"]) == 2
    assert "the native pipeline (softswitch/_dataplane.c) is not built" in capsys.readouterr().err


def test_the_default_pipeline_is_native_where_built_and_python_otherwise(monkeypatch):
    assert choose_pipeline(None) == ("native" if native_available() else "python")
    assert choose_pipeline("python") == "python"
    monkeypatch.setattr("softswitch.native._native", None)
    assert choose_pipeline(None) == "python"
