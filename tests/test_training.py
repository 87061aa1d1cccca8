"""The user-facing training path run end to end: the torchrun example, with the hook and by its launch line
(a shortened `make demo` is tests/test_demo.py's)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from lhc_launch.processes import ControllerProcess, SoftswitchProcess

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(*args: str, env: dict[str, str] | None = None) -> list[str]:
    """Run the example on 2 processes; rank 0's step lines."""
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), str(REPO / "examples" / "train_ddp.py"), *args],
        capture_output=True, text=True, timeout=300, cwd=REPO, env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [line for line in done.stdout.splitlines() if line.startswith("step ")]


def losses(lines: list[str]) -> list[str]:
    return [line.split(" loss ")[1].split()[0] for line in lines]


def test_the_example_trains_under_torchrun_with_the_hook() -> None:
    steps = torchrun("--hook", "--steps", "3")
    assert len(steps) == 3, steps
    assert all(float(line.split("compression ")[1].rstrip("x")) > 1 for line in steps), steps


def test_the_unchanged_example_picks_lhc_from_the_environment_through_softswitch(tmp_path: Path) -> None:
    """Launch lines only: LHC_DISTRIBUTED with the controller's address and a job makes the script's
    ``init_process_group("gloo")`` the lhc backend, through softswitch; its losses equal the hook's
    through softswitch bit for bit (W = 2: DDP's division by 2 before the backend's sum is exact, and the
    codec quantizes at a power-of-two scale), and differ from plain Gloo's only within the bound."""
    with SoftswitchProcess() as switch, ControllerProcess(switch, tmp_path) as stack:
        for job in ("hooked", "by-env"):
            stack.client.create_job(job, workers=2)
        hooked = torchrun("--hook", "--controller", stack.listen, "--job", "hooked", "--steps", "4")
        by_env = torchrun("--steps", "4", env={"LHC_DISTRIBUTED": "1", "LHC_CONTROLLER": stack.listen,
                                               "LHC_JOB": "by-env"})
    plain = torchrun("--steps", "4")
    assert all(" backend lhc" in line for line in by_env), by_env
    assert all(" backend gloo" in line for line in hooked + plain), hooked + plain
    assert len(by_env) == 4 and losses(by_env) == losses(hooked), (by_env, hooked)
    for ours, theirs in zip(losses(by_env), losses(plain), strict=True):
        assert abs(float(ours) - float(theirs)) <= 1e-5 * abs(float(theirs)), (by_env, plain)

