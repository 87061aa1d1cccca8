"""Start and stop the switch under test: softswitch (default) or BMv2 ``simple_switch_grpc``.

Both come up with no program and the same port numbering on the switch ends of the veth pairs; the suite
then pushes the pipeline over P4Runtime itself (P4Info, plus the BMv2 JSON as device config), so the two
targets are configured by exactly the same code path.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from ptf_tests.veth import VethPair

REPO_ROOT = Path(__file__).resolve().parent.parent
BMV2_JSON = REPO_ROOT / "build" / "p4" / "v1model" / "lhc.json"
STARTUP_TIMEOUT = 30.0


class TargetError(RuntimeError):
    """The target could not be started; the message says why and where its log is."""


@dataclass
class Target:
    """A running switch process: its P4Runtime address and the device config the suite must push."""

    name: str
    process: subprocess.Popen
    grpc_addr: str
    device_config: Path | None
    log_path: Path

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within 5 seconds."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _executable(name: str) -> str:
    """A tool from the running interpreter's venv first (where lhc-softswitch lives), then PATH."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        raise TargetError(f"{name} not found (neither next to {sys.executable} nor on PATH)")
    return found


def start_softswitch(pairs: list[VethPair], log_dir: Path, log_level: str = "INFO",
                     pipeline: str | None = None) -> Target:
    """``lhc-softswitch`` on the switch ends, running ``pipeline`` (its default when None); ready once it
    prints its one startup line on stdout."""
    grpc_addr = f"127.0.0.1:{free_tcp_port()}"
    command = [
        _executable("lhc-softswitch"),
        "--grpc-addr",
        grpc_addr,
        "--device-id",
        "1",
        "--log-level",
        log_level,
    ]
    for pair in pairs:
        command += ["--port", f"{pair.port}@{pair.switch_end}"]
    if pipeline:
        command += ["--pipeline", pipeline]
    log_path = log_dir / "softswitch.log"
    log = log_path.open("w")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO_ROOT)
    lines: list[str] = []
    reader = threading.Thread(target=_copy_stdout, args=(process, log, lines), daemon=True)
    reader.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while not lines:
        if process.poll() is not None:
            reader.join(timeout=1)
            raise TargetError(
                f"softswitch exited with {process.returncode} before it was ready; see {log_path}"
            )
        if time.monotonic() > deadline:
            process.kill()
            raise TargetError(
                f"softswitch printed no startup line within {STARTUP_TIMEOUT:.0f} s; see {log_path}"
            )
        time.sleep(0.05)
    print(f"softswitch: {lines[0].strip()}", flush=True)
    return Target("softswitch", process, grpc_addr, None, log_path)


def _copy_stdout(process: subprocess.Popen, log, lines: list[str]) -> None:
    """Record the startup line and keep draining stdout into the log so the switch never blocks on it."""
    for line in process.stdout:
        lines.append(line)
        log.write(line)
        log.flush()


def ensure_bmv2_json(json_path: Path = BMV2_JSON) -> Path:
    """The compiled v1model program, compiled with ``make p4-v1model`` first when it is missing and p4c
    exists."""
    if not json_path.exists():
        if not shutil.which("p4c"):
            raise TargetError(f"{json_path} is missing and p4c is not on PATH to compile it "
                              "(`make p4-v1model`)")
        subprocess.run(["make", "-C", str(REPO_ROOT), "p4-v1model", f"PYTHON={sys.executable}"], check=True)
        if not json_path.exists():
            raise TargetError(f"`make p4-v1model` did not produce {json_path}")
    return json_path


def start_bmv2(pairs: list[VethPair], log_dir: Path, json_path: Path = BMV2_JSON) -> Target:
    """``simple_switch_grpc --no-p4`` on the switch ends; ready once its gRPC server accepts connections."""
    device_config = ensure_bmv2_json(json_path)
    grpc_addr = f"127.0.0.1:{free_tcp_port()}"
    command = [_executable("simple_switch_grpc"), "--device-id", "1", "--thrift-port", str(free_tcp_port())]
    for pair in pairs:
        command += ["-i", f"{pair.port}@{pair.switch_end}"]
    command += ["--no-p4", "--", "--grpc-server-addr", grpc_addr]
    log_path = log_dir / "bmv2.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    channel = grpc.insecure_channel(grpc_addr)
    try:
        grpc.channel_ready_future(channel).result(timeout=STARTUP_TIMEOUT)
    except grpc.FutureTimeoutError:
        process.kill()
        raise TargetError(f"simple_switch_grpc did not open {grpc_addr}; see {log_path}") from None
    finally:
        channel.close()
    if process.poll() is not None:
        raise TargetError(f"simple_switch_grpc exited with {process.returncode}; see {log_path}")
    return Target("bmv2", process, grpc_addr, device_config, log_path)


def start(name: str, pairs: list[VethPair], log_dir: Path, *, log_level: str = "INFO",
          pipeline: str | None = None) -> Target:
    """Start ``name`` (softswitch, with ``pipeline``, or bmv2) on the switch ends of ``pairs``, logging
    into ``log_dir``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    if name == "softswitch":
        return start_softswitch(pairs, log_dir, log_level, pipeline)
    if name == "bmv2":
        return start_bmv2(pairs, log_dir)
    raise TargetError(f"unknown target {name!r} (softswitch or bmv2)")
