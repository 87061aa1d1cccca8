"""The socket-error tests' fault injection: ``socket_faults.c`` built as a preloaded shim, and the addresses
whose datagrams it refuses (see the C file: ``127.254.0.E`` fails with errno E, ``127.254.1.E`` also makes
the socket fail every later send, as a fault of the socket's own does).

A shim only works in a process started with it, so the trials run as ``python -m <module>`` under
``LD_PRELOAD`` and print what they saw as JSON for the test to judge.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE = Path(__file__).with_name("socket_faults.c")
REPO = Path(__file__).resolve().parents[2]


def fault_address(error: int, stays: bool = False) -> str:
    """The IPv4 address whose datagrams the shim refuses with ``error`` (``stays``: and every later one on
    that socket)."""
    if not 0 < error < 256:
        raise ValueError(f"errno {error} does not fit the shim's last address byte")
    return f"127.254.{int(stays)}.{error}"


def build_shim(directory: Path) -> Path:
    """``socket_faults.c`` compiled into ``directory``; the test skips where no C compiler is present."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the socket-fault shim")
    shim = directory / "socket_faults.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(shim), str(SOURCE), "-ldl"],
                   check=True, capture_output=True, text=True)
    return shim


def run_with_faults(shim: Path, module: str, *args: str, timeout_s: float = 120.0) -> dict:
    """``python -m module args`` with the shim preloaded: the JSON it prints last. Fails the test with its
    output when it exits with an error."""
    env = {**os.environ, "LD_PRELOAD": str(shim), "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout_s)
    if done.returncode != 0:
        pytest.fail(f"{module} {' '.join(args)} exited with {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])
