"""The ``lhc`` torch.distributed backend in real 2-process groups: FSDP2 (``fully_shard``) trains through
it within the quantization bound of plain FSDP, over the process-group codec and through softswitch."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lhc_launch.processes import ControllerProcess, SoftswitchProcess

FSDP_SCRIPT = Path(__file__).with_name("fsdp_rank.py")
REDUCE_SCATTER_SCRIPT = Path(__file__).with_name("reduce_scatter_rank.py")
WORLD = 2
LR = 2.0**-4
_JOBS = itertools.count()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(script: Path, tmp: Path, tag: str, *args: str, env: dict[str, str] | None = None,
              world: int = WORLD) -> list[dict]:
    """Run every rank of ``script`` to completion; what each saved, in rank order."""
    master = f"127.0.0.1:{_free_port()}"
    outs = [tmp / f"{tag}-{rank}.pt" for rank in range(world)]
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), str(world), master, str(outs[rank]),
                               *args], stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
             for rank in range(world)]
    errors = [proc.communicate(timeout=240)[1] for proc in procs]
    for proc, error in zip(procs, errors, strict=True):
        assert proc.returncode == 0, error[-3000:]
    return [torch.load(out) for out in outs]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    with SoftswitchProcess() as switch, ControllerProcess(switch, tmp_path_factory.mktemp("ctl")) as ctl:
        yield ctl


@pytest.fixture(scope="module")
def plain_fsdp(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Plain FSDP over Gloo for 5 steps, trained once for the tests that hold lhc to it."""
    return run_ranks(FSDP_SCRIPT, tmp_path_factory.mktemp("plain-fsdp"), "plain", "--backend", "plain",
                     "--steps", "5")


def assert_fsdp_within_the_bound(plain: list[dict], ours: list[dict], steps: int) -> None:
    """Per step, each averaged gradient element is off by at most 2^(3 + k - 31) * M + 2^-23 * |g|
    (quantize.py: W workers, a scale at most 3 binades coarser than the agreed one, divided by W), M the
    largest gradient of any rank; the parameters by lr times that, summed over the steps."""
    largest = max(run["largest_grad"] for run in plain + ours)
    per_step = 2.0 ** (3 + WORLD.bit_length() - 31) * largest + 2.0**-23 * largest
    bound = steps * LR * per_step
    for run_plain, run_ours in zip(plain, ours, strict=True):
        for name, param in run_plain["params"].items():
            error = float((param - run_ours["params"][name]).abs().max())
            assert error <= bound + 2.0**-24 * float(param.abs().max()), (name, error, bound)


def job_env(stack, prefix: str) -> dict[str, str]:
    """A fresh job of WORLD workers on the stack's controller, as the ranks' environment names it."""
    job = f"{prefix}-{next(_JOBS)}"
    stack.client.create_job(job, workers=WORLD)
    return {"LHC_CONTROLLER": stack.listen, "LHC_JOB": job}


@pytest.mark.slow
@pytest.mark.parametrize("through_switch", [False, True], ids=["process-group", "softswitch"])
def test_fsdp_trains_through_lhc_within_the_bound(tmp_path: Path, through_switch: bool, stack,
                                                  plain_fsdp: list[dict]) -> None:
    """fully_shard on CPU over Gloo: FSDP's reduce_scatter (AVG) goes through lhc, its all_gather to
    Gloo; every rank holds the same parameters, plain FSDP's within the bound."""
    steps = 5  # plain_fsdp's
    env = job_env(stack, "fsdp") if through_switch else {}
    ours = run_ranks(FSDP_SCRIPT, tmp_path, "lhc", "--backend", "lhc", "--steps", str(steps), env=env)
    # one reduce_scatter per step for each unit that holds parameters (the 2 Linears; the root holds none)
    assert all(run["lhc"] == {"reduce_scatter": 2 * steps} for run in ours), [run["lhc"] for run in ours]
    for name, param in ours[0]["params"].items():
        assert torch.equal(param, ours[1]["params"][name])
    assert_fsdp_within_the_bound(plain_fsdp, ours, steps)


@pytest.mark.slow
def assert_shards_decoded_alone(runs: list[dict], kernels: str | None = None) -> None:
    """Each rank's reduce_scatter output is its slice of the all_reduce, bit for bit, and the same bytes
    went on the wire; union and dense dequantized only the shard (where there are several), sketch peeled
    every candidate (auto: whichever it picked); ``kernels``: the codec path every call took."""
    world = len(runs)
    for rank, run in enumerate(runs):
        for mode, calls in run.items():
            for call in calls:
                stats, whole = call["stats"], call["whole_stats"]
                shard = call["shard"].numel()
                assert torch.equal(call["shard"], call["total"][rank * shard : (rank + 1) * shard]), mode
                assert stats["mode"] == whole["mode"] and stats["bytes_sent"] == whole["bytes_sent"]
                assert kernels is None or stats["codec"]["kernels"] == kernels, stats["codec"]
                if stats["codec"]["protocol"] == "dense":
                    assert stats["decoded_elements"] == shard and whole["decoded_elements"] == world * shard
                elif stats["mode"] == "union" and world > 1:
                    assert 0 < stats["decoded_elements"] < whole["decoded_elements"]
                elif stats["mode"] != "union":
                    assert stats["decoded_elements"] == whole["decoded_elements"]
    modes = {mode: {call["stats"]["mode"] for call in calls} for mode, calls in runs[0].items()}
    assert modes["union"] == {"union"} and modes["sketch"] == {"sketch"} and modes["dense"] == {"dense"}


def test_reduce_scatter_decodes_only_the_shard(tmp_path: Path) -> None:
    """2 processes, every mode, on the CPU: see :func:`assert_shards_decoded_alone`."""
    assert_shards_decoded_alone(run_ranks(REDUCE_SCATTER_SCRIPT, tmp_path, "rs"))


@pytest.mark.gpu
def test_reduce_scatter_on_cuda_decodes_only_the_shard(tmp_path: Path) -> None:
    """The same on CUDA gradients, two ranks sharing the GPU (their CUDA collectives on Gloo): the codec's
    GPU path dequantizes only the shard in union and dense, as the CPU does."""
    runs = run_ranks(REDUCE_SCATTER_SCRIPT, tmp_path, "rs-cuda", "cuda", env={"LHC_CUDA_COLLECTIVES": "gloo"})
    assert_shards_decoded_alone(runs, kernels="triton")


@pytest.mark.gpu
def test_the_lhc_backend_on_nccl_with_cuda_tensors(tmp_path: Path) -> None:
    """One rank, the lhc group's CUDA collectives on NCCL (NCCL refuses two ranks on one GPU): reduce_scatter
    and all_reduce of CUDA tensors go through lhc's codec on the GPU path and its process-group transport
    over NCCL, every mode, and agree bit for bit."""
    runs = run_ranks(REDUCE_SCATTER_SCRIPT, tmp_path, "rs-nccl", "cuda", env={"LHC_CUDA_COLLECTIVES": "nccl"},
                     world=1)
    assert_shards_decoded_alone(runs, kernels="triton")


#: Two ranks on the one GPU: their CUDA collectives on Gloo, since NCCL refuses two ranks on one device (and
#: FSDP on one rank never reduce-scatters: it keeps its whole gradient).
ON_ONE_GPU = ("--device", "cuda", "--cuda-collectives", "gloo")


@pytest.fixture(scope="module")
def plain_fsdp_cuda(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Plain FSDP, two ranks on the GPU (Gloo), 3 steps, trained once for the CUDA tests."""
    return run_ranks(FSDP_SCRIPT, tmp_path_factory.mktemp("plain-fsdp-cuda"), "plain", "--backend", "plain",
                     "--steps", "3", *ON_ONE_GPU)


@pytest.mark.gpu
@pytest.mark.parametrize("through_switch", [False, True], ids=["process-group", "softswitch"])
def test_fsdp_trains_through_lhc_on_cuda(tmp_path: Path, through_switch: bool, stack,
                                         plain_fsdp_cuda: list[dict]) -> None:
    """fully_shard on CUDA, two ranks sharing the GPU: every reduce_scatter of FSDP's CUDA gradients goes
    through lhc, whose codec runs the GPU path (Triton) on them; both ranks hold the same parameters, plain
    FSDP's on the same GPU within the bound."""
    steps = 3  # plain_fsdp_cuda's
    env = job_env(stack, "fsdp-cuda") if through_switch else {}
    ours = run_ranks(FSDP_SCRIPT, tmp_path, "lhc", "--backend", "lhc", "--steps", str(steps), *ON_ONE_GPU,
                     env=env)
    assert all(run["lhc"] == {"reduce_scatter": 2 * steps} for run in ours), [run["lhc"] for run in ours]
    assert all(run["codec_kernels"] == "triton" for run in ours), [run["codec_kernels"] for run in ours]
    for name, param in ours[0]["params"].items():
        assert torch.equal(param, ours[1]["params"][name])
    assert_fsdp_within_the_bound(plain_fsdp_cuda, ours, steps)


def test_cuda_collectives_on_gloo_hand_cuda_tensors_to_the_gloo_backend() -> None:
    """``LHC_CUDA_COLLECTIVES=gloo`` (ranks sharing a GPU): the inner group's CUDA backend is its Gloo one,
    as ``init_process_group("gloo")`` would make it; by default a CPU machine has no CUDA backend at all."""
    from datetime import timedelta

    import torch.distributed as dist

    from host_agent.torch_backend import _gloo_and_nccl

    store = dist.HashStore()
    shared = _gloo_and_nccl(store, 0, 1, timedelta(seconds=5), "shared", "gloo")
    assert shared._get_backend(torch.device("cuda")) is shared._get_backend(torch.device("cpu"))
    if not torch.cuda.is_available():
        default = _gloo_and_nccl(store, 0, 1, timedelta(seconds=5), "default", "nccl")
        with pytest.raises(RuntimeError, match="No backend type associated with device type cuda"):
            default._get_backend(torch.device("cuda"))


def test_the_job_comes_from_the_environment() -> None:
    from host_agent.torch_backend import LhcConfig

    config = LhcConfig.from_env({"LHC_CONTROLLER": "10.0.0.1:9560", "LHC_JOB": "train", "LHC_TOKEN": "t",
                                 "LHC_MODE": "union", "LHC_IP": "10.0.1.2"})
    assert config == LhcConfig("10.0.0.1:9560", "train", "t", "union", "10.0.1.2", "")
    assert LhcConfig.from_env({}) == LhcConfig()  # no controller: the process-group codec
    with pytest.raises(ValueError, match="LHC_JOB"):
        LhcConfig.from_env({"LHC_CONTROLLER": "10.0.0.1:9560"})
    assert LhcConfig.from_env({"LHC_CUDA_COLLECTIVES": "gloo"}).cuda_collectives == "gloo"
    with pytest.raises(ValueError, match="LHC_CUDA_COLLECTIVES must be one of"):
        LhcConfig.from_env({"LHC_CUDA_COLLECTIVES": "mpi"})
