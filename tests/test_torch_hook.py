"""The DDP hook in real 2-process DDP (Gloo, CPU): exact against plain allreduce, resumable, on a process
group and through the switch."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from host_agent.process_group import bit_lane_width, gather_bits, or_scheme, spread_bits
from lhc_launch.processes import ControllerProcess, SoftswitchProcess

RANK_SCRIPT = Path(__file__).with_name("ddp_rank.py")
WORLD = 2
_JOBS = itertools.count()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train(tmp: Path, hook: str, *extra: str, tag: str = "", stack=None, world: int = WORLD) -> list[dict]:
    """Run both ranks to completion; their saved parameters in rank order."""
    master = f"127.0.0.1:{_free_port()}"
    switch_args: list[str] = []
    env = dict(os.environ)
    if hook == "switch" or (hook == "backend" and stack is not None):
        job = f"hook-{next(_JOBS)}"
        stack.client.create_job(job, workers=world)
        switch_args = ["--controller", stack.listen, "--job", job]
        env.update(LHC_CONTROLLER=stack.listen, LHC_JOB=job)  # the backend's job, as a launch line gives it
    outs = [tmp / f"{hook}{tag}-{rank}.pt" for rank in range(world)]
    procs = [
        subprocess.Popen([sys.executable, str(RANK_SCRIPT), str(rank), str(world), master, str(outs[rank]),
                          "--hook", hook, *switch_args, *extra], stderr=subprocess.PIPE, text=True,
                         env=env)
        for rank in range(world)
    ]
    errors = [proc.communicate(timeout=240)[1] for proc in procs]
    for proc, error in zip(procs, errors, strict=True):
        assert proc.returncode == 0, error[-3000:]
    return [torch.load(out) for out in outs]


def assert_same_params(a: list[dict], b: list[dict]) -> None:
    for rank_a, rank_b in zip(a, b, strict=True):
        for pa, pb in zip(rank_a["params"], rank_b["params"], strict=True):
            assert torch.equal(pa, pb), (pa - pb).abs().max()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    with SoftswitchProcess() as switch, ControllerProcess(switch, tmp_path_factory.mktemp("ctl")) as ctl:
        yield ctl


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[dict]]:
    """``train(hook, *args)`` without the switch, each (hook, args) trained once per module: several tests
    hold the hook to the same plain run, or start from the same run on the process group."""
    folder, runs = tmp_path_factory.mktemp("trained"), {}

    def run(hook: str, *args: str) -> list[dict]:
        if (hook, args) not in runs:
            runs[hook, args] = train(folder, hook, *args, tag=f"-{len(runs)}")
        return runs[hook, args]

    return run


@pytest.fixture(scope="module")
def plain(trained: Callable[..., list[dict]]) -> Callable[..., list[dict]]:
    """Plain DDP (no hook) for the rank script's arguments, trained once per module."""
    return lambda *args: trained("none", *args)


@pytest.mark.slow
@pytest.mark.parametrize("hook", ["pg", "switch"])
def test_integer_gradients_give_plain_ddp_bit_for_bit(tmp_path: Path, hook: str, stack, plain) -> None:
    assert_same_params(train(tmp_path, hook, "--integer", stack=stack), plain("--integer"))


def assert_within_the_bound(plain: list[dict], hooked: list[dict], steps: int) -> None:
    """Per step, each averaged gradient element is off by at most 2^-(31-k) * max|g| + 2^-23 * |g|
    (quantize.py's bound over W workers, divided by W); the parameters by lr times that, summed."""
    largest = max(r["largest_grad"] for r in plain + hooked)
    bound = steps * 2.0**-4 * (2.0 ** -(31 - WORLD.bit_length()) * largest * 2 + 2.0**-23 * largest)
    for rank_a, rank_b in zip(plain, hooked, strict=True):
        for pa, pb in zip(rank_a["params"], rank_b["params"], strict=True):
            assert float((pa - pb).abs().max()) <= bound + 2.0**-24 * float(pa.abs().max())


@pytest.fixture(scope="module")
def straight(trained: Callable[..., list[dict]], tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[str, list[dict]]:
    """The hook's 6-step run on the process group, uninterrupted, saving a checkpoint at step 3 on its way
    (saving reads the model and the hook's state, and changes neither): its checkpoint's prefix and its
    parameters. The bound test holds it to plain DDP; a run resumed from its checkpoint must equal it."""
    prefix = str(tmp_path_factory.mktemp("checkpoint") / "ckpt")
    return prefix, trained("pg", "--steps", "6", "--save-at", "3", prefix)


@pytest.mark.slow
def test_float_gradients_stay_within_the_quantization_bound(plain, straight) -> None:
    assert_within_the_bound(plain("--steps", "6"), straight[1], 6)


@pytest.mark.slow
@pytest.mark.parametrize(("hook", "through_switch"),
                         [("pg", False), ("switch", True), ("backend", False), ("backend", True)])
def test_an_amp_overflow_on_one_rank_skips_the_step_on_every_rank(tmp_path: Path, hook: str,
                                                                  through_switch: bool, stack, plain) -> None:
    """autocast + GradScaler, rank 1's loss infinite at step 2: as with plain DDP, every rank's scaler sees
    the overflow (the bucket comes back non-finite, no error), skips that step and halves the scale; the
    other steps train, to plain DDP's parameters within the quantization bound. With the hook, and with
    the lhc backend (no hook: DDP's own allreduce), over the process group and through softswitch."""
    steps, overflow = 6, 2
    args = ("--amp", "--steps", str(steps), "--overflow-at", str(overflow))
    plain_runs = plain(*args)
    hooked = train(tmp_path, hook, *args, stack=stack if through_switch else None)
    scales = plain_runs[0]["scales"]
    assert scales[overflow] == scales[overflow - 1] / 2 and len(set(scales)) == 2, scales
    assert all(run["scales"] == scales for run in plain_runs + hooked), [run["scales"] for run in hooked]
    assert all(bool(param.isfinite().all()) for run in hooked for param in run["params"])
    if hook == "backend":  # every step's buckets went through lhc
        assert all(run["lhc"].get("all_reduce", 0) >= steps for run in hooked), hooked[0]["lhc"]
    assert_within_the_bound(plain_runs, hooked, steps)


@pytest.mark.slow
def test_a_checkpoint_resumes_to_the_same_parameters(tmp_path: Path, straight) -> None:
    """Checkpoint at step 3 of 6, resume in new processes: the parameters of the uninterrupted run."""
    prefix, uninterrupted = straight
    resumed = train(tmp_path, "pg", "--steps", "6", "--resume", prefix, tag="-resumed")
    assert_same_params(resumed, uninterrupted)


@pytest.mark.parametrize("world", [2, 3, 4, 8, 32])
def test_bit_lanes_or_exactly(world: int) -> None:
    generator = torch.Generator().manual_seed(world)
    inputs = [torch.randint(-(2**31), 2**31, (37,), generator=generator, dtype=torch.int64).to(torch.int32)
              for _ in range(world)]
    lane = bit_lane_width(world)
    summed = sum(spread_bits(x, lane).to(torch.int64) for x in inputs).to(torch.int32)
    expected = inputs[0].clone()
    for x in inputs[1:]:
        expected |= x
    assert torch.equal(gather_bits(summed, lane, 37), expected)


def test_or_scheme_picks_fewer_bytes() -> None:
    assert or_scheme(4, has_bor=True) == "bor"
    assert or_scheme(2, has_bor=False) == "all_gather"  # 2x either way
    assert or_scheme(8, has_bor=False) == "bit_lanes"  # 4x against 8x


@pytest.mark.gpu
def test_the_hook_runs_with_nccl(tmp_path: Path) -> None:
    """One rank on NCCL (no bitwise OR there: the OR words take the all_gather path) gives plain DDP's
    parameters for integer gradients."""
    plain = train(tmp_path, "none", "--integer", "--device", "cuda", world=1)
    hooked = train(tmp_path, "pg", "--integer", "--device", "cuda", world=1)
    assert_same_params(hooked, plain)


@pytest.mark.gpu
def test_cuda_buckets_through_softswitch_give_the_cpu_run(tmp_path: Path, stack) -> None:
    """Two ranks on the one GPU (DDP's own collectives on Gloo), every bucket on the GPU: the codec's GPU
    path encodes and decodes it there, only the packets' words cross to the host, and softswitch adds
    them. Integer gradients: the parameters of the CPU run, bit for bit."""
    cpu = train(tmp_path, "none", "--integer", tag="-cpu")
    cuda = train(tmp_path, "switch", "--integer", "--device", "cuda", "--backend", "gloo", stack=stack,
                 tag="-cuda")
    assert all(run["codec_kernels"] == "triton" for run in cuda), [run["codec_kernels"] for run in cuda]
    assert_same_params(cuda, cpu)


def test_the_hook_sums_each_steps_long_sums_packed_and_plain() -> None:
    """The per-step stats add the transport's long-sum counters of every bucket (what ``lhc-bench train``
    reports as ``long_sum_words``), and a new step starts from zero."""
    from host_agent.agent import Agent
    from host_agent.torch_hook import LhcHookState
    from tests.harness.local_backend import LocalGroup

    (backend,) = LocalGroup(1).members()
    state = LhcHookState(Agent(backend, mode="dense"))
    bucket = {"nonfinite_ranks": [], "path": "host", "redone": 0, "mode": "dense"}
    state.record(0, {**bucket, "transport": {"packed_words": 7, "packed_bytes_sent": 20, "plain_words": 0}})
    state.record(1, {**bucket, "transport": {"packed_words": 0, "packed_bytes_sent": 0, "plain_words": 5}})
    state.record(2, {**bucket, "transport": {}})  # a backend without long sums
    stats = state.pop_step_stats()
    assert (stats["packed_words"], stats["packed_bytes_sent"], stats["plain_words"]) == (7, 20, 5)
    assert stats["buckets_host"] == 3
    assert state.pop_step_stats()["packed_words"] == 0
    state.close()
