"""The user-facing training path run end to end: the torchrun example, with the hook and by its launch line
(a shortened `make demo` is tests/test_demo.py's)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lhc_launch.processes import ControllerProcess, SoftswitchProcess

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(args: tuple[str, ...], env: dict[str, str] | None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), str(REPO / "examples" / "train_ddp.py"), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def torchrun(*args: str, env: dict[str, str] | None = None) -> list[str]:
    """Run the example on 2 processes; rank 0's step lines."""
    steps, _, _ = torchrun_watched(*args, env=env)
    return steps


def torchrun_watched(*args: str, env: dict[str, str] | None = None,
                     on_step=lambda line: None) -> tuple[list[str], str, str]:
    """Run the example on 2 processes, ``on_step(line)`` as each of rank 0's step lines comes: its step
    lines, its parameters' digest line and the ranks' stderr."""
    proc = _launch(args, env)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("step "):
                on_step(line)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    digest = [line for line in lines if line.startswith("parameters sha256 ")]
    return [line for line in lines if line.startswith("step ")], digest[0] if digest else "", stderr


def losses(lines: list[str]) -> list[str]:
    return [line.split(" loss ")[1].split()[0] for line in lines]


@pytest.mark.slow
def test_the_example_trains_under_torchrun_with_the_hook() -> None:
    steps = torchrun("--hook", "--steps", "3")
    assert len(steps) == 3, steps
    assert all(float(line.split("compression ")[1].split("x")[0]) > 1 for line in steps), steps


@pytest.mark.slow
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



#: Short deadlines for the fallback trials (docs/pytorch.md, "When the switch cannot serve").
FAST_FALLBACK = {"LHC_SWITCH_TIMEOUT_S": "2", "LHC_MEET_TIMEOUT_S": "30", "LHC_JOIN_TIMEOUT_S": "20"}


def _host_buckets(line: str) -> int:
    return int(line.split(" host ")[1].split()[0])


@pytest.mark.slow
def test_the_unchanged_example_survives_the_switch_killed_for_good(tmp_path: Path) -> None:
    """The unchanged script under ``LHC_DISTRIBUTED=1``, the switch killed (-9) after step 3 and never
    restarted: the run finishes over the process group, its parameters equal an uninterrupted run's
    through the switch bit for bit, and each rank says once why it left the switch, naming it."""
    with SoftswitchProcess() as switch, ControllerProcess(switch, tmp_path) as stack:
        for job in ("whole", "killed"):
            stack.client.create_job(job, workers=2)

        def env(job: str) -> dict[str, str]:
            return {"LHC_DISTRIBUTED": "1", "LHC_CONTROLLER": stack.listen, "LHC_JOB": job, **FAST_FALLBACK}

        args = ("--steps", "10")
        whole, whole_digest, _ = torchrun_watched(*args, env=env("whole"))  # its bits need no step time
        def fault(line: str) -> None:
            if line.startswith("step 3 "):
                switch.kill()

        killed, killed_digest, stderr = torchrun_watched(*args, "--step-time", "0.2", env=env("killed"),
                                                         on_step=fault)
    assert not switch.running()
    assert killed_digest == whole_digest != "", (killed_digest, whole_digest)
    assert losses(killed) == losses(whole) and len(killed) == 10
    said = [line for line in stderr.splitlines() if "the switch path failed" in line]
    assert len(said) == 2 and all("the switch does not answer the controller" in line for line in said), said


@pytest.mark.slow
def test_the_hook_returns_to_a_switch_restarted_after_the_fallback(tmp_path: Path) -> None:
    """Under torchrun with the hook: the switch killed after step 2, restarted once the steps run over the
    hosts; within a few steps every bucket goes through the switch again (the step lines count them by
    path), and the parameters equal an uninterrupted run's bit for bit."""
    with SoftswitchProcess() as switch, ControllerProcess(switch, tmp_path) as stack:
        for job in ("whole", "restarted"):
            stack.client.create_job(job, workers=2)
        args = ("--hook", "--controller", stack.listen, "--steps", "30")
        # the uninterrupted run's bits do not depend on the step time: only the faulted run needs the time
        whole, whole_digest, _ = torchrun_watched(*args, "--job", "whole", env=FAST_FALLBACK)
        restarted_at: list[int] = []

        def fault(line: str) -> None:
            step = int(line.split()[1])
            if step == 2:
                switch.kill()
            elif _host_buckets(line) and not restarted_at:
                switch.restart(crash=True)
                restarted_at.append(step)

        steps, digest, _ = torchrun_watched(*args, "--job", "restarted", "--step-time", "0.3",
                                            env=FAST_FALLBACK, on_step=fault)
    assert digest == whole_digest != "" and losses(steps) == losses(whole)
    on_hosts = [int(line.split()[1]) for line in steps if _host_buckets(line)]
    assert on_hosts and on_hosts[0] <= 4, steps  # left the switch at its first stall
    # Back within a few steps: the controller's reconnect backoff (up to 5 s), a heartbeat, a step end.
    assert restarted_at and on_hosts[-1] <= restarted_at[0] + 20, steps
    assert all(not _host_buckets(line) for line in steps[on_hosts[-1] + 1:]), steps
