"""Train a small recommender with DDP under torchrun, its gradients aggregated by the lhc hook.

    torchrun --nproc-per-node 2 examples/train_ddp.py                       # over the process group
    torchrun --nproc-per-node 2 examples/train_ddp.py --controller HOST:PORT --job NAME   # the switch

With ``--controller``, create the job first (``lhc-controller job create NAME --workers 2``). The one
line that differs from a plain DDP script is ``model.register_comm_hook(state, lhc_hook)``.
"""

from __future__ import annotations

import argparse
import os

import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from host_agent.torch_hook import LhcHookState, lhc_hook
from lhc_demo.recsys import DemoConfig, Recommender, SyntheticClicks, make_optimizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--controller", help="the lhc controller (HOST:PORT); default: the process group")
    parser.add_argument("--job", help="the job created on the controller")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
    rank = dist.get_rank()
    config = DemoConfig(users=5000, items=5000)
    data = SyntheticClicks(config)
    model = DistributedDataParallel(Recommender(config))
    if args.controller:
        state = LhcHookState.join(args.controller, args.job)
    else:
        state = LhcHookState.from_process_group()
    model.register_comm_hook(state, lhc_hook)
    optimizer = make_optimizer(model.module, config)
    for step in range(args.steps):
        users, items, clicked = data.batch(rank, step)
        loss = F.binary_cross_entropy_with_logits(model(users, items), clicked)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        stats = state.pop_step_stats()
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f} wire {stats['bytes_sent'] / 1e3:.1f} kB "
                  f"compression {stats['compression_ratio']:.1f}x", flush=True)
    state.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
