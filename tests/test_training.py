"""The user-facing training paths run end to end: the torchrun example and a shortened `make demo`."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_example_trains_under_torchrun() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()),
         str(REPO / "examples" / "train_ddp.py"), "--steps", "3"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [line for line in done.stdout.splitlines() if line.startswith("step ")]
    assert len(steps) == 3, done.stdout
    assert all(float(line.split("compression ")[1].rstrip("x")) > 1 for line in steps), steps


def test_a_short_demo_trains_exactly_through_the_switch(tmp_path: Path) -> None:
    """lhc's losses equal dense-through-the-switch's bit for bit, with at least 5x fewer bytes."""
    done = subprocess.run(
        [sys.executable, "-m", "lhc_demo.train", "--workers", "2", "--steps", "3", "--json",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["losses_match"] is True
    assert summary["bytes_ratio"] >= 5, summary
    assert summary["steps"] == 3 and summary["workers"] == 2
    assert (tmp_path / "demo.png").stat().st_size > 0
