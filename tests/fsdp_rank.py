"""One rank of the FSDP tests (run as a script by tests/test_torch_backend.py): train a small MLP sharded
with ``fully_shard`` (FSDP2) on plain Gloo/NCCL or on the ``lhc`` backend (its job, if any, from the
environment), and save the full parameters, the largest gradient seen and what lhc aggregated.

    python tests/fsdp_rank.py RANK WORLD MASTER OUT --backend plain|lhc [--steps N] [--device cpu|cuda]
        [--cuda-collectives nccl|gloo]

``--cuda-collectives gloo`` runs CUDA tensors' collectives on Gloo (plain FSDP's, and the lhc backend's
``LHC_CUDA_COLLECTIVES``), so that several ranks can share one GPU (NCCL refuses that).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

LR = 2.0**-4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rank", type=int)
    parser.add_argument("world", type=int)
    parser.add_argument("master")
    parser.add_argument("out")
    parser.add_argument("--backend", choices=["plain", "lhc"], required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="cuda runs on NCCL, cpu on Gloo")
    parser.add_argument("--cuda-collectives", choices=["nccl", "gloo"], default="nccl")
    args = parser.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ["LHC_CUDA_COLLECTIVES"] = args.cuda_collectives
    backend = args.cuda_collectives if args.device == "cuda" else "gloo"
    if args.backend == "lhc":
        import host_agent.torch_backend  # noqa: F401 - registers "lhc"

        backend = "lhc"
    if args.device == "cuda":
        torch.cuda.set_device(args.rank % torch.cuda.device_count())
    master = f"tcp://{args.master}"
    dist.init_process_group(backend, init_method=master, rank=args.rank, world_size=args.world)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4)).to(args.device)
    replica = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4)).to(args.device)  # unsharded
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    largest = 0.0
    for step in range(args.steps):
        generator = torch.Generator().manual_seed(100 * step + args.rank)
        inputs = torch.randn(6, 8, generator=generator).to(args.device)
        # the bound needs this rank's own gradient before the reduction: the unsharded replica's
        full = {name: p.full_tensor().detach().requires_grad_() for name, p in model.named_parameters()}
        own = torch.autograd.grad(torch.func.functional_call(replica, full, inputs).pow(2).mean(),
                                  list(full.values()))
        largest = max(largest, *(float(g.abs().max()) for g in own))
        loss = model(inputs).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    params = {name: p.full_tensor().detach().cpu() for name, p in model.named_parameters()}
    aggregated = dict(getattr(dist.group.WORLD, "aggregated", {}))
    agent = getattr(dist.group.WORLD, "agent", None)  # the lhc backend's: which codec kernels it ran
    kernels = agent.last_stats["codec_kernels"] if agent is not None and agent.last_stats else None
    torch.save({"params": params, "largest_grad": largest, "lhc": aggregated, "codec_kernels": kernels},
               args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
