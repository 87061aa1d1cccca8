"""One rank of the reduce_scatter test (run as a script by tests/test_torch_backend.py): per mode, the same
sparse gradients, step after step, through ``reduce_scatter_tensor`` on one ``lhc`` group and through
``all_reduce`` on another (AVG; two groups, so that both keep the same codec state from step to step);
saves the shards, the totals and what each call decoded.

    python tests/reduce_scatter_rank.py RANK WORLD MASTER OUT [DEVICE]

DEVICE ``cuda``: the gradients on the GPU (the codec's GPU path; the group's CUDA collectives on NCCL, or
on Gloo with ``LHC_CUDA_COLLECTIVES=gloo`` where ranks share a GPU).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

import host_agent.torch_backend  # noqa: F401 - registers "lhc"

MODES = ("union", "dense", "sketch", "auto")
SHARD = 3000


def main() -> None:
    rank, world, master, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    device = torch.device(sys.argv[5] if len(sys.argv) > 5 else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("lhc", init_method=f"tcp://{master}", rank=rank, world_size=world)
    saved = {}
    for mode in MODES:
        os.environ["LHC_MODE"] = mode  # the group's mode, read when it is made
        sharded, whole = dist.new_group(backend="lhc"), dist.new_group(backend="lhc")
        calls = []
        for step in range(2):
            g = torch.Generator().manual_seed(100 * step + rank)
            n = world * SHARD
            grad = torch.where(torch.rand(n, generator=g) < 0.03, torch.randn(n, generator=g), 0.0).to(device)
            shard = torch.empty(SHARD, device=device)
            dist.reduce_scatter_tensor(shard, grad, op=dist.ReduceOp.AVG, group=sharded)
            dist.all_reduce(grad, op=dist.ReduceOp.AVG, group=whole)
            calls.append({"shard": shard.cpu(), "total": grad.cpu(), "stats": sharded.agent.last_stats,
                          "whole_stats": whole.agent.last_stats})
        saved[mode] = calls
    torch.save(saved, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
