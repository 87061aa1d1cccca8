"""Train a small recommender with DDP under torchrun: a plain DDP script, which lhc serves three ways.

    torchrun --nproc-per-node 2 examples/train_ddp.py                                   # plain Gloo
    LHC_DISTRIBUTED=1 torchrun --nproc-per-node 2 examples/train_ddp.py                 # lhc, no switch
    LHC_DISTRIBUTED=1 LHC_CONTROLLER=HOST:PORT LHC_JOB=NAME \\
        torchrun --nproc-per-node 2 examples/train_ddp.py                               # lhc, the switch
    torchrun --nproc-per-node 2 examples/train_ddp.py --hook [--controller HOST:PORT --job NAME]

The environment picks the ``lhc`` torch.distributed backend for the unchanged script (docs/pytorch.md);
``--hook`` instead registers lhc's DDP communication hook on this model, over the process group or, with
``--controller``, through the switch. With a controller, create the job first (``lhc-controller job
create NAME --workers 2``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from lhc_demo.recsys import DemoConfig, Recommender, SyntheticClicks, make_optimizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hook", action="store_true", help="register lhc's DDP communication hook")
    parser.add_argument("--controller", help="with --hook: the lhc controller (HOST:PORT)")
    parser.add_argument("--job", help="with --hook: the job created on the controller")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.0,
                        help="pad each step to this many seconds, as a bigger model's computation would")
    args = parser.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
    rank = dist.get_rank()
    config = DemoConfig(users=5000, items=5000)
    data = SyntheticClicks(config)
    model = DistributedDataParallel(Recommender(config))
    state = None
    if args.hook:
        from host_agent.torch_hook import LhcHookState, lhc_hook

        if args.controller:
            state = LhcHookState.join(args.controller, args.job)
        else:
            state = LhcHookState.from_process_group()
        model.register_comm_hook(state, lhc_hook)
    optimizer = make_optimizer(model.module, config)
    for step in range(args.steps):
        started = time.monotonic()
        users, items, clicked = data.batch(rank, step)
        loss = F.binary_cross_entropy_with_logits(model(users, items), clicked)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        wire = ""
        if state is not None:
            stats = state.pop_step_stats()
            wire = (f" wire {stats['bytes_sent'] / 1e3:.1f} kB compression {stats['compression_ratio']:.1f}x"
                    f" buckets via switch {stats['buckets_switch']:.0f} host {stats['buckets_host']:.0f}")
        if rank == 0:
            print(f"step {step} loss {loss.item():.9g} backend {dist.get_backend()}{wire}", flush=True)
        time.sleep(max(0.0, args.step_time - (time.monotonic() - started)))
    if state is not None:
        state.close()
    if rank == 0:  # what a bit-for-bit comparison of two runs reads
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
        print(f"parameters sha256 {digest.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
